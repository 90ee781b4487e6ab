# Two entry points (README): `make run` (the case corpus on the default device) and `make test` (the linter, then the
# test suite). Both create .venv on first use and install what they need from the package registries.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# The CPU install (dev machines, CI): the CPU torch wheel from PyTorch's CPU index (PyPI's Linux wheel is the CUDA
# build, which pins a Triton of its own), then the package with the `cpu` extra (triton 3.6.0 and a numpy its
# interpreter accepts, < 2.4: docs/exactness.md) and the `dev` extra (ruff, jsonschema). A GPU runner keeps its
# preinstalled CUDA torch, Triton and numpy: `make test TORCH_SPEC= EXTRAS=dev VENV_FLAGS=--system-site-packages`.
# A host that cannot resolve PyTorch's index (an offline mirror that carries the CPU wheel) installs from its
# configured index instead: pip would otherwise retry the unreachable host for torch and each of its dependencies.
TORCH_SPEC ?= torch==2.13.0
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
RESOLVES := import socket; socket.getaddrinfo('download.pytorch.org', 443)
TORCH_INDEX ?= $(shell $(PYTHON) -c "$(RESOLVES)" >/dev/null 2>&1 && echo $(TORCH_CPU_INDEX))
EXTRAS ?= cpu,dev
VENV_FLAGS ?=

.PHONY: run test lint bench generate validate bytecode clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(strip $(TORCH_SPEC)),$(PY) -m pip install -q "$(TORCH_SPEC)" $(if $(strip $(TORCH_INDEX)),--index-url $(TORCH_INDEX)))
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

run: $(STAMP)
	$(PY) -m harness run

# Lint first: ruff takes about a second, so a lint error fails before the suite spends minutes. Then the tree's
# byte-code, once: where the machine sets PYTHONDONTWRITEBYTECODE=1 (CI does) no process writes it, and every process
# the suite starts (workers, case children, test subprocesses) would compile the tree's modules from source again.
# pytest does not load that byte-code: it rewrites the asserts of every module of a pytest plugin's distribution
# (this project's, Hypothesis's) and of the tests, and keeps the result only where it may write byte-code. The suite
# runs with writing allowed, so the pytest processes its tests start read what the workers rewrote.
test: $(STAMP) lint
	$(PY) -m compileall -q -j 0 harness kernels reference ssd_pytest peers tests conftest.py > /dev/null
	PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n auto $(PYTEST_ARGS)

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
