# Two commands matter: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.installed-stamp
DEV_STAMP := $(VENV)/.dev-installed-stamp
BENCH_STAMP := $(VENV)/.bench-installed-stamp

# compiled / interpreted: tools/build_compiled.py (mypyc; see bench/results/mypyc.md).
.PHONY: compiled interpreted
.PHONY: install install-dev install-bench test lint typecheck unit sim cluster run bench bench-partitions bench-scale bench-wal bench-startup bench-membership bench-api bench-tracing bench-gateway zipapp soak chaos clean api-docs

# What running dlm needs (`make run`): the package and its runtime dependencies. The
# bytecode of dlm itself is compiled here, so a `dlm` run starts warm even where
# PYTHONDONTWRITEBYTECODE keeps Python from caching it (pip compiles the dependencies).
install: $(STAMP)
	@$(PY) -m compileall -q dlm

# What the checks need besides (`make test` and friends): pytest, pytest-xdist, hypothesis,
# mypy, ruff.
install-dev: $(DEV_STAMP)

# Re-installs only when pyproject.toml changes, so repeated `make test` is quick.
# Editable, so `dlm` runs the sources of this tree. pyproject.toml maps the
# packages to "." (package-dir), so setuptools writes a plain path entry (.pth)
# rather than an import hook, which would cost every `dlm` start-up about 10 ms.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PIP) -e '.[dev,metrics]'
	touch $(DEV_STAMP)

# What the benchmarks add (matplotlib for the charts, py-spy for profiles); only they need it.
install-bench: $(BENCH_STAMP)

$(BENCH_STAMP): $(STAMP)
	$(PIP) -e '.[bench]'
	touch $(BENCH_STAMP)

lint: install-dev
	$(VENV)/bin/ruff check dlm tests bench tools
	$(VENV)/bin/ruff format --check dlm tests bench tools

typecheck: install-dev
	$(VENV)/bin/mypy dlm tests tools

# make test runs two pytest-xdist workers: every test that starts processes (tests/cluster,
# tests/chaos) runs on one of them, one after another as in a single process, while the
# simulator and the unit tests, which compute, run on the other (tests/conftest.py). That
# keeps the suite within CI's 20 minutes. PYTEST_WORKERS=0 runs everything in one process.
# PYTEST_WORKERS=4 PYTEST_SPLIT= spreads the cluster modules over four workers as well:
# about 7 min instead of about 15, but 4 of 5 such runs met a race between a module's
# cluster and its first test (a port, a member not yet at the leader's term).
PYTEST_WORKERS ?= 2
PYTEST_SPLIT ?= --processes-on-one-worker
test: lint typecheck
	$(PY) -m pytest tests -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_SPLIT) --durations=25

unit: install-dev
	$(PY) -m pytest tests/unit

sim: install-dev
	$(PY) -m pytest tests/sim

# The hot pure rooms (wire codec, peer codec, Raft core, node machine) compiled by mypyc
# to C extensions beside their sources (git ignores the .so files); `make interpreted`
# removes them. Not part of `make install`: A/B-measured, it does not pay the issue's bar
# (bench/results/mypyc.md). Needs mypy (install-dev) and a C compiler; a few minutes.
compiled: install-dev
	$(PY) tools/build_compiled.py

interpreted:
	$(PY) tools/build_compiled.py --clean

# The Raft and node machine scenarios (testdata/*.txt); `make traces REWRITE=1` writes
# the actual outputs back into the files (read the git diff before committing it).
.PHONY: traces
traces: install-dev
	DLM_TRACES_REWRITE=$(REWRITE) $(PY) -m pytest -q tests/unit/node/raft/test_traces.py tests/unit/node/test_machine_traces.py

cluster: install-dev
	$(PY) -m pytest tests/cluster

# A local 3-node cluster in the foreground on 127.0.0.1:7701-7703; Ctrl-C stops it.
run: install
	$(PY) -m dlm.devcluster $(if $(PARTITIONS),--partitions $(PARTITIONS))

BENCH_ARGS ?=

# The lock-service benchmark: machine floor, a dlm 3-node cluster, etcd 3.4 if installed,
# the second load generator (bench/loadgen.py) on item 4's dlm cells, then clusters of
# 1, 2 and 4 partitions side by side (bench/partitions.py).
# Writes bench/results/locks.md, .png and .json.
bench: install install-bench
	$(PY) -m bench.locks $(BENCH_ARGS)

# The partitioned cells alone (P = 1, 2, 4 side by side; make bench runs them too).
# Writes bench/results/partitions.md and .json.
bench-partitions: install install-bench
	$(PY) -m bench.partitions $(BENCH_ARGS)

# What a gateway hop costs (pair latency, members' and gateway's CPU per pair, with and
# without it, same run) and what one gateway's idle clients cost (bench/gateway.py).
# Writes bench/results/gateway.md and .json.
bench-gateway: install
	$(PY) -m bench.gateway $(BENCH_ARGS)

# Fleet scale: 10,000 leases kept alive, 100,000 held locks (bench/results/scale.md, .png).
bench-scale: install install-bench
	$(PY) -m bench.scale $(BENCH_ARGS)

# Lock pairs per second from Python (the client API, sync and async, c=1 and c=64) beside
# the `dlm` command and redis-py's lock on a local redis-server (if installed).
# Writes bench/results/api.md and .json.
bench-api: install install-bench
	$(PY) -m bench.api $(BENCH_ARGS)

# What tracing costs (issue 30): `dlm exec` start-up and a lock pair from Python with the
# tracing extra absent, installed but off, and on (exporting to a local OTLP receiver).
# Writes bench/results/tracing.md and .json.
bench-tracing: install
	$(PY) -m bench.tracing $(BENCH_ARGS)

bench-wal: install
	$(PY) -m bench.wal

bench-startup: install zipapp
	$(PY) -m bench.startup

# A member joining a loaded cluster (50,000 locks in a snapshot, 10,000 entries after it),
# and the pause a client sees when the leader is removed; a few minutes on 2 cores.
bench-membership: install
	$(PY) -m bench.membership $(BENCH_ARGS)

# The public Python API's reference (`import dlm`), from its docstrings, with the standard
# library's pydoc: build/api/index.html, a page per public name, and build/api/dlm.txt.
api-docs: install
	$(PY) tools/api_docs.py --output build/api

# The whole of dlm and its runtime dependencies in one file: dist/dlm.pyz.
zipapp: install
	$(PY) tools/build_zipapp.py

# Longer simulation than CI runs: SOAK_SEEDS=START:COUNT seeds of both simulators (the Raft
# core alone, and whole members with clients), split over one process per core.
SOAK_SEEDS ?= 1000:10000
soak: install-dev
	$(PY) tools/soak.py $(SOAK_SEEDS)

# Fault schedules against real clusters on 127.0.0.1 (tests/chaos): CHAOS_SEEDS=START:COUNT
# schedules (mixing 3- and 5-member clusters), a report and an availability plot per run under
# chaos-results/. `make test` runs three short ones; this runs the long ones (about a minute each),
# then the network-namespace cases of tests/chaos/test_netns.py (root, Linux; a few minutes),
# then elections on disks 500 ms and 2 s slow (tests/chaos/test_slow_elections.py, about a minute).
CHAOS_SEEDS ?= 100:30
CHAOS_PROFILE ?= long
# The plots need matplotlib, which `make test` does without (its short runs skip the plot).
chaos: install-dev
	$(PIP) 'matplotlib>=3.8'
	$(PY) -m tests.chaos.run --seeds $(CHAOS_SEEDS) --profile $(CHAOS_PROFILE) --results chaos-results
	DLM_CHAOS_NETNS=1 $(PY) -m pytest tests/chaos/test_netns.py -q -s
	DLM_CHAOS_FULL=1 $(PY) -m pytest tests/chaos/test_slow_elections.py -s

clean:
	rm -rf $(VENV) dist build *.egg-info .pytest_cache .mypy_cache .ruff_cache
