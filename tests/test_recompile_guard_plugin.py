"""--recompile-guard in the pytest plugin: one warmup for the collected cases, then any case item that needs a
specialization the warmup did not produce fails (CPU: by specialization key; GPU: by the compile hook)."""

from __future__ import annotations


import pytest

from harness.backend import current_device

from tests import broken_providers as bp

pytest_plugins = ["pytester"]
# The session's device: inner runs use it too (the interpreter cannot run where numpy >= 2.4, as on the GPU runner).
DEVICE = current_device()


@pytest.fixture(scope="module", autouse=True)
def _kernels_imported_outside():
    """Keep Triton's native modules in pytester's sys.modules snapshot (they cannot be loaded twice)."""
    from harness.checks import load_provider

    load_provider("kernels:provider")


def run_guarded(pytester, *args):
    tiny = pytester.makefile(".yaml", tiny=bp.TINY_CASES)
    return pytester.runpytest_inprocess("-p", "harness.pytest_plugin", "--device", DEVICE, "-p", "no:cacheprovider",
                                        "-s", "--recompile-guard", str(tiny), "-k", "tiny-direct", *args)


def test_warmed_suite_passes_under_the_guard(pytester):
    result = run_guarded(pytester, "--provider", "kernels:provider")
    result.stdout.fnmatch_lines(["*warmup: * specializations*"])
    outcomes = result.parseoutcomes()
    assert result.ret == 0 and outcomes.get("passed", 0) >= 5, result.stdout.str()[-3000:]


@pytest.mark.skipif(DEVICE != "cpu", reason="on the GPU the guard's witness is a compile, and kernels this worker "
                    "already compiled for earlier tests do not compile again; the GPU negative control is the cold-cache "
                    "probe in tests/test_recompile_guard.py")
def test_narrower_warmup_makes_the_guard_fire(pytester, monkeypatch):
    """Negative control: a warmup without the case's per-head D leaves chunk scan's D class unwarmed."""
    from kernels import warmup

    real = warmup.requests_from_cases

    def without_d(cases):
        return [(shape, io, state, {**opts, "d_kinds": ("none",)}) for shape, io, state, opts in real(cases)]

    monkeypatch.setattr(warmup, "requests_from_cases", without_d)
    result = run_guarded(pytester, "--provider", "kernels:provider", "-k", "determinism")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*recompile guard (after warmup:*", "*_chunk_scan_kernel*"])
