"""Triton's interpreter without its repeated re-patching of ``triton.language`` inside a kernel.

Under ``TRITON_INTERPRET=1`` a launch runs ``GridExecutor.__call__``, which patches the ``triton.language`` modules
the kernel's globals name (``tl``, ``tl.core``: every builtin of the module, of ``tl.tensor`` and ``tl.math``,
found with ``inspect.getmembers``, rebound to interpreter semantics) for the whole grid and restores them when the
grid ends. Every call of a ``@triton.jit`` helper from inside the kernel then goes through
``InterpretedFunction.__call__``, which runs ``_patch_lang`` again on each call and drops the scope it returns:
the same modules get the same rebinding (over the one ``interpreter_builder``) once per helper call per program,
and the outer grid's ``restore`` undoes it all at the end. The kernels call their helpers in every program, so
that repeated patching is a large share of an interpreted launch.

``skip_nested_repatching`` replaces ``InterpretedFunction.__call__`` with the same body that skips ``_patch_lang``
where a running grid already patched every ``triton.language`` module the helper's globals name; a helper that
names one the grid did not patch, or a jit function called outside any grid, is patched exactly as before. What
each operation computes is unchanged: the patched attributes are the same functions over the same builder.

It is installed only where the running Triton's two methods are the bodies this was written against (the source
text compared, ``KNOWN_CALL``); any other Triton keeps its own interpreter untouched."""

from __future__ import annotations

import inspect
import textwrap
import threading

KNOWN_CALL = '''
def __call__(self, *args, **kwargs):
    # This is a device function call
    _patch_lang(self.fn)
    fn = self.rewrite()
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        raise InterpreterError(repr(e)) from e
'''
# What GridExecutor.__call__ must do for the grid's patching to cover the helpers: patch the kernel's languages
# before running its programs, and restore them only after the last one.
GRID_PATCHES = ("patch_scope = _patch_lang(self.fn)", "self.fn(**args)", "patch_scope.restore()")

_grids = threading.local()  # .langs: a stack of the module sets patched by the grids running in this thread
_installed = False
upstream: dict[str, object] = {}  # the methods replaced, by name ("GridExecutor", "InterpretedFunction")


def _source(fn) -> str:
    return textwrap.dedent(inspect.getsource(fn)).strip()


def _langs(fn, interpreter) -> frozenset[int]:
    """The ``triton.language`` modules ``_patch_lang`` would patch for ``fn`` (by id)."""
    tl = interpreter.tl
    return frozenset(id(value) for value in fn.__globals__.values()
                     if inspect.ismodule(value) and value in (tl, tl.core))


def install_problem() -> str | None:
    """Why ``skip_nested_repatching`` would leave this Triton's interpreter alone; None when it applies."""
    from triton.runtime import interpreter

    call = vars(interpreter.InterpretedFunction).get("__call__")
    grid = vars(getattr(interpreter, "GridExecutor", object)).get("__call__")
    if call is None or grid is None or not hasattr(interpreter, "_patch_lang"):
        return "triton.runtime.interpreter lacks InterpretedFunction.__call__, GridExecutor.__call__ or _patch_lang"
    if _installed:
        return None
    if _source(call) != KNOWN_CALL.strip():
        return "InterpretedFunction.__call__ is not the body this was written against"
    grid_source = _source(grid)
    positions = [grid_source.find(part) for part in GRID_PATCHES]
    if -1 in positions or positions != sorted(positions):
        return "GridExecutor.__call__ does not patch for the whole grid as expected"
    return None


def skip_nested_repatching() -> bool:
    """Install the interpreter's helper call without repeated patching (module docstring); idempotent. Returns
    whether it is installed."""
    global _installed
    if _installed:
        return True
    if install_problem() is not None:
        return False
    from triton.runtime import interpreter

    grid_call = interpreter.GridExecutor.__call__

    def run_grid(self, *args, **kwargs):
        stack = _grids.__dict__.setdefault("langs", [])
        stack.append(_langs(self.fn, interpreter))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            stack.pop()

    def call_helper(self, *args, **kwargs):
        # This is a device function call: patched already where the running grid patched its languages.
        stack = getattr(_grids, "langs", None)
        if not stack or not _langs(self.fn, interpreter) <= stack[-1]:
            interpreter._patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    upstream.update(GridExecutor=grid_call, InterpretedFunction=interpreter.InterpretedFunction.__call__)
    interpreter.GridExecutor.__call__ = run_grid
    interpreter.InterpretedFunction.__call__ = call_helper
    _installed = True
    return True
