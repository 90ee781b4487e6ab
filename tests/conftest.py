"""What every test module shares: the device the kernels run on, and the markers that skip by device.

The device is decided once per process, before any test module is imported: the ssd_pytest plugin's
``pytest_configure`` (``--device``, default auto) calls ``harness.backend.configure``, which sets ``TRITON_INTERPRET``
before anything imports triton (Triton reads it when ``@triton.jit`` decorates a kernel). Test modules therefore import
kernels at their top and never configure the backend; they take the decision from the ``device`` fixture.

This file must import neither triton nor the kernels package: pytest loads it before ``pytest_configure`` when a path
under tests/ is named on the command line, and importing ``kernels`` then settles the interpreter choice by asking
torch for a GPU, which starts the CUDA driver before an xdist worker forks its child (``harness.isolation.spare``).
Helpers that test modules share live in ``tests/support.py``.

Markers (``interpreter`` declared in pyproject.toml, ``gpu`` by the plugin), each with the reason a reader sees in
the skip line:
``@pytest.mark.gpu(reason=...)``: needs real compiles on a CUDA device; skipped under the interpreter.
``@pytest.mark.interpreter(reason=...)``: needs Triton's interpreter; skipped on the GPU.
Case items (``ssd_case``) outside the CPU tier carry ``gpu`` too; the plugin skips those itself, with the tier's
reason, so this file leaves them alone.
"""

from __future__ import annotations

import os
import sys

import pytest

from harness import backend
from harness.isolation import settings

_NEEDS = {"gpu": "cuda", "interpreter": "cpu"}
# Not a test's doing: pytest's own (set at each phase of each test), and what a library sets for its whole process the
# first time one of its modules loads, whichever test that happens in.
_NOT_THE_TESTS = frozenset({"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"})


@pytest.fixture(scope="session")
def device() -> str:
    """Where this process's kernels run: "cuda", or "cpu" (Triton's interpreter), as ``--device`` resolved it."""
    return backend.current_device()


@pytest.fixture(autouse=True)
def _gives_back_the_environment():
    """A test that leaves this process's environment variables, working directory, ``sys.path``, torch's default
    dtype or thread count, or Triton's knobs (a hook, a listener, a switch) changed changes what every later test on
    its worker runs under, depending on where xdist placed them: such a test errors at its teardown, naming what it
    left changed. ``monkeypatch`` gives its changes
    back before this check (autouse fixtures are set up first, so torn down last)."""
    env, cwd, knobs = dict(os.environ), os.getcwd(), _triton_knob_overrides()
    path, torch_state = list(sys.path), _torch_state()
    yield
    changed = {k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k)} - _NOT_THE_TESTS
    left = sorted(f"{k}: {env.get(k)!r} -> {os.environ.get(k)!r}" for k in changed)
    backend.restore_environment(env, changed)
    left += _knobs_given_back(knobs)
    if os.getcwd() != cwd:
        left.append(f"working directory: {cwd} -> {os.getcwd()}")
        os.chdir(cwd)
    if sys.path != path:
        left.append(f"sys.path: {sorted(set(path) ^ set(sys.path)) or 'reordered'}")
        sys.path[:] = path
    if _torch_state() != torch_state:
        left.append(f"torch: {torch_state} -> {_torch_state()}")
        import torch
        torch.set_default_dtype(torch_state[0])
        torch.set_num_threads(torch_state[1])
    if left:
        pytest.fail("the test left the process changed (given back now): " + "; ".join(left), pytrace=False)


@pytest.fixture(autouse=True)
def _without_the_callers_harness_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test runs the harness under the settings it chooses, not the caller's: ``SSD_HARNESS_ISOLATION=none`` in
    the caller's environment would run a test's crashing provider in the test's own process (and end it), and
    ``SSD_HARNESS_ITEM_TIMEOUT`` would change the limits the fault tests wait out. Case items keep the caller's
    settings: this file's fixtures reach only the tests under tests/."""
    for name in (settings.ISOLATION_ENV, settings.TIMEOUT_ENV):
        monkeypatch.delenv(name, raising=False)


def _torch_state() -> tuple:
    import torch

    return torch.get_default_dtype(), torch.get_num_threads()


def _triton_knob_overrides() -> dict[str, dict]:
    """What is set on each of Triton's knob groups (a hook, a listener, a switch: ``triton.knobs.<group>.<name> =``),
    once Triton is loaded (this file must not load it)."""
    knobs = sys.modules.get("triton.knobs")
    if knobs is None:
        return {}
    return {name: dict(group.__dict__) for name, group in vars(knobs).items() if isinstance(group, knobs.base_knobs)}


def _knobs_given_back(before: dict[str, dict]) -> list[str]:
    """The knobs changed since ``before`` (a group's overrides), each set back."""
    knobs = sys.modules.get("triton.knobs")
    changes = []
    for group, now in _triton_knob_overrides().items():
        target, was = vars(knobs)[group], before.get(group, {})
        changed = []
        for name in sorted(set(was) | set(now)):
            old, new = _knob(target, was, name), _knob(target, now, name)
            if old is not new and old != new:
                changed.append(f"triton.knobs.{group}.{name}: {old!r} -> {new!r}")
        if changed:
            target.__dict__.clear()
            target.__dict__.update(was)
        changes += changed
    return changes


def _knob(group, overrides: dict, name: str):
    """A knob's value with these overrides: the override, else its default (from the environment where it has one)."""
    if name in overrides:
        return overrides[name]
    default = type(group).__dict__.get(name)
    return default.get() if isinstance(default, sys.modules["triton.knobs"].env_base) else default


# The driver makes one CUDA context at a time, host-wide, and most of a context's cost is its hardware work queues
# (eight by default). A process test's children check the process machinery (supervision, faults, reports), which
# does not depend on how many queues their context has; with one, each context costs about a third as much while the
# suite's other processes make theirs. The case items and the kernel tests keep the default.
@pytest.fixture
def children_with_one_hardware_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process the test starts (and every isolation child, which takes this process's environment) makes its
    CUDA context with one hardware work queue; a module of process tests uses it for all its tests (``pytestmark``)."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")


@pytest.fixture(scope="session")
def profile(device: str) -> str:
    """The arithmetic profile (``reference.arith``'s names) the kernels follow on ``device``."""
    from kernels.environment import arithmetic_profile

    return arithmetic_profile(device)


@pytest.fixture(scope="session")
def tiny_cases(tmp_path_factory) -> dict:
    """``tests.broken_providers.TINY_CASES`` loaded: case id -> Case (three small cases every provider can run)."""
    from harness.cases.loader import load_case_file
    from tests.broken_providers import TINY_CASES

    path = tmp_path_factory.mktemp("cases") / "tiny.yaml"
    path.write_text(TINY_CASES)
    return {c.id: c for c in load_case_file(path)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the items whose marker names another device: as a skip marker, so that the skip line names the test."""
    here = backend.current_device()
    for item in items:
        if item.get_closest_marker("ssd_case"):
            continue
        for name, needed in _NEEDS.items():
            marker = item.get_closest_marker(name)
            if marker is None:
                continue
            reason = marker.kwargs.get("reason")
            if not reason:
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} needs reason=... (the skip line shows it)")
            if here != needed:
                item.add_marker(pytest.mark.skip(reason=f"runs on {needed} only, this process runs on {here}: "
                                                        f"{reason}"))
