# Two commands matter: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install test lint typecheck unit sim cluster run bench zipapp soak clean

install: $(STAMP)

# Re-installs only when pyproject.toml changes, so repeated `make test` is quick.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,metrics]'
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

clean:
	rm -rf $(VENV) dist build *.egg-info .pytest_cache .mypy_cache .ruff_cache
