# Two entry points (README): `make run` (the case corpus on the default device) and `make test` (the linter, then the
# test suite). Both create .venv on first use and install what they need from the package registries.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# The CPU install (dev machines, CI): the CPU torch wheel and a numpy the Triton 3.6 interpreter accepts (< 2.4,
# docs/exactness.md). A GPU runner keeps its own torch/numpy: `make test TORCH_SPEC= NUMPY_SPEC= VENV_FLAGS=--system-site-packages`.
TORCH_SPEC ?= torch==2.13.0
NUMPY_SPEC ?= numpy<2.4
VENV_FLAGS ?=

.PHONY: run test lint bench generate validate bytecode clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(strip $(TORCH_SPEC) $(NUMPY_SPEC)),$(PY) -m pip install -q $(foreach s,$(TORCH_SPEC) $(NUMPY_SPEC),"$(s)"))
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

run: $(STAMP)
	$(PY) -m harness run

# Lint first: ruff takes about a second, so a lint error fails before the suite spends minutes.
test: $(STAMP) lint
	$(PY) -m pytest -n auto $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

bench: $(STAMP)
	$(PY) -m harness bench

generate: $(STAMP)
	$(PY) -m harness generate --out cases/corpus

validate: $(STAMP)
	$(PY) -m harness validate cases

# Byte-code for the interpreter's libraries, where the machine's Python was installed without it (GPU runner images):
# see scripts/compile_bytecode.sh. The nightly workflow runs it after set-up.
bytecode: $(STAMP)
	scripts/compile_bytecode.sh $(PY)

clean-venv:
	rm -rf $(VENV)
