"""The CPU tier's interpreter does not re-patch ``triton.language`` at each helper call inside a kernel
(``harness.triton_interpreter``): installed by ``backend.configure``, one patching per grid where the grid's covers
the helper, a helper naming a language module the grid did not patch still patched at each call, the modules restored
after the grid, and the bits those of Triton's own interpreter."""

from __future__ import annotations

import importlib
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from harness import triton_interpreter

pytestmark = pytest.mark.interpreter(reason="about Triton's interpreter, which the GPU does not run")

CALLS = 4  # helper calls per program
PROGRAMS = 3


@triton.jit
def _scale(x, k):
    return x * k + 1.0


CORE_HELPER = """
import triton
from triton.language import core


@triton.jit
def _core_scale(x, k):  # names only triton.language.core, which a kernel naming tl alone does not patch
    return core.where(x > 1.0, x * k, x) + 1.0
"""


def _kernel_source(helper: str) -> str:
    return textwrap.dedent(f"""
        import triton
        import triton.language as tl
        from tests.test_triton_interpreter import _scale
        from _interp_core_helper import _core_scale


        @triton.jit
        def kernel(x_ptr, y_ptr):
            offs = tl.program_id(0) * 8 + tl.arange(0, 8)
            x = tl.load(x_ptr + offs)
            for i in tl.static_range({CALLS}):
                x = {helper}(x, 0.5)
            tl.store(y_ptr + offs, x)
    """)


def _launch(tmp_path, monkeypatch, helper: str) -> tuple[torch.Tensor, int]:
    """Launch a kernel whose programs call ``helper`` CALLS times; returns its output and the ``_patch_lang`` calls."""
    from triton.runtime import interpreter

    name = f"_interp_{helper.strip('_')}"
    (tmp_path / "_interp_core_helper.py").write_text(CORE_HELPER)
    (tmp_path / f"{name}.py").write_text(_kernel_source(helper))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    patched = []
    real = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patched.append(fn.__name__) or real(fn))
    x = torch.arange(8.0 * PROGRAMS)
    y = torch.empty_like(x)
    module.kernel[(PROGRAMS,)](x, y)
    return y, len(patched)


def test_the_cpu_tier_installs_it():
    assert triton_interpreter.install_problem() is None and triton_interpreter._installed


def test_a_grid_patches_once_for_helpers_it_covers_and_restores_after(tmp_path, monkeypatch):
    load = tl.load
    y, patched = _launch(tmp_path, monkeypatch, "_scale")
    assert patched == 1, patched  # the grid's: none for the PROGRAMS x CALLS helper calls
    assert tl.load is load and not triton_interpreter._grids.langs  # restored; no grid running
    expected = torch.arange(8.0 * PROGRAMS)
    for _ in range(CALLS):
        expected = expected * 0.5 + 1.0
    assert torch.equal(y, expected)


def test_a_helper_naming_a_module_the_grid_did_not_patch_is_patched_at_each_call(tmp_path, monkeypatch):
    y, patched = _launch(tmp_path, monkeypatch, "_core_scale")
    assert patched == 1 + PROGRAMS * CALLS, patched
    expected = torch.arange(8.0 * PROGRAMS)
    for _ in range(CALLS):
        expected = torch.where(expected > 1.0, expected * 0.5, expected) + 1.0
    assert torch.equal(y, expected)


def test_the_bits_are_those_of_tritons_own_interpreter(tmp_path, monkeypatch):
    from triton.runtime import interpreter

    ours, _ = _launch(tmp_path, monkeypatch, "_scale")
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", triton_interpreter.upstream["GridExecutor"])
    monkeypatch.setattr(interpreter.InterpretedFunction, "__call__", triton_interpreter.upstream["InterpretedFunction"])
    theirs, patched = _launch(tmp_path, monkeypatch, "_scale")
    assert patched == 1 + PROGRAMS * CALLS  # Triton's own: every helper call patches again
    assert torch.equal(ours, theirs)
