# Two commands matter: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install test lint typecheck unit sim cluster run bench bench-wal bench-startup zipapp soak clean

install: $(STAMP)

# Re-installs only when pyproject.toml changes, so repeated `make test` is quick.
# editable_mode=compat: a plain path entry instead of an import hook, which would
# cost every `dlm` start-up about 10 ms.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,metrics]' \
		--config-settings editable_mode=compat
	touch $(STAMP)

lint: install
	$(VENV)/bin/ruff check dlm tests bench

typecheck: install
	$(VENV)/bin/mypy dlm

test: lint typecheck
	$(PY) -m pytest tests

unit: install
	$(PY) -m pytest tests/unit

sim: install
	$(PY) -m pytest tests/sim

cluster: install
	$(PY) -m pytest tests/cluster

# A local 3-node cluster in the foreground on 127.0.0.1:7701-7703; Ctrl-C stops it.
run: install
	$(PY) -m dlm.node.devcluster

BENCH_ARGS ?=

# The lock-service benchmark: machine floor, a dlm 3-node cluster, etcd 3.4 if installed.
bench: install
	$(PY) -m bench.locks $(BENCH_ARGS)

bench-wal: install
	$(PY) -m bench.wal

bench-startup: install zipapp
	$(PY) -m bench.startup

# The whole of dlm and its runtime dependencies in one file: dist/dlm.pyz.
zipapp: install
	$(PY) tools/build_zipapp.py

# Longer simulation than CI runs: SOAK_SEEDS=START:COUNT.
SOAK_SEEDS ?= 1000:3000
soak: install
	$(PY) -m pytest tests/sim --sim-seeds=$(SOAK_SEEDS)

clean:
	rm -rf $(VENV) dist build *.egg-info .pytest_cache .mypy_cache .ruff_cache
