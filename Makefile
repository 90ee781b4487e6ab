# Two entry points (README): `make run` (the case corpus on the default device) and `make test` (the test suite).
# Both create .venv on first use and install what they need from the package registries.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: run test bench generate validate clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU wheel on the CI/dev machines; the GPU runner has its own torch preinstalled.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

run: $(STAMP)
	$(PY) -m harness run

test: $(STAMP)
	$(PY) -m pytest -n auto $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -m harness bench

generate: $(STAMP)
	$(PY) -m harness generate --out cases/corpus

validate: $(STAMP)
	$(PY) -m harness validate cases

clean-venv:
	rm -rf $(VENV)
