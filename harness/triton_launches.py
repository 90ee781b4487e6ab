"""Every launch and every warmup of any ``@triton.jit`` function, seen at one place, checked against the running Triton.

The recompile guard must judge whatever kernels a provider launches, ours or anyone's, without a list of them, and
under the interpreter (where nothing compiles) it must know the specialization of every launch and of every warmup
entry. Both go through one method per backend, which is not a public API. What is relied on, for Triton 3.4 .. 3.9
(``kernels.triton_version.VERIFIED``, the one range for every gate; ``require_supported`` refuses other versions
and classes that lack it):

- ``JITFunction.run(self, *args, grid, warmup, **kwargs)`` (compiled backend) and
  ``InterpretedFunction.run(self, *args, grid, warmup, **kwargs)`` (``TRITON_INTERPRET=1``): ``kernel[grid](...)``
  (``KernelInterface.__getitem__``), ``kernel.warmup(...)`` (``KernelInterface.warmup``, with ``warmup=True`` and
  tensors wrapped as ``MockTensor``), ``Autotuner`` trials and launches and ``Heuristics`` all end in it, with the
  arguments Triton keys its binaries on. Wrapping it on the class sees every jit function; a subclass that
  overrides ``run`` without calling it would go unseen.
- Under the interpreter ``run(warmup=True)`` returns at once: a warmup entry compiles nothing there, but it is
  still seen here, which is what lets an interpreter run know what a warmup would have compiled.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Iterator

import triton
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from kernels.triton_version import UnsupportedTriton, version_problem

JIT_CLASSES = (JITFunction, InterpretedFunction)

# fn(jit function, positional args, keyword args, warmup) for every run of any jit function, while registered.
Listener = Callable[[Any, tuple, dict, bool], None]

_lock = threading.Lock()
_listeners: list[Listener] = []
_originals: dict[type, Any] = {}


def require_supported() -> None:
    """Raise ``UnsupportedTriton`` naming what differs, unless this Triton's jit classes are as described above."""
    where = "harness/triton_launches.py relies on JITFunction.run/InterpretedFunction.run"
    problem = version_problem(where)
    if problem is not None:
        raise UnsupportedTriton(problem)
    for cls in JIT_CLASSES:
        run = _originals.get(cls, cls.__dict__.get("run"))
        params = inspect.signature(run).parameters if callable(run) else {}
        if not all(p in params and params[p].kind is inspect.Parameter.KEYWORD_ONLY for p in ("grid", "warmup")):
            raise UnsupportedTriton(f"Triton {triton.__version__}: {cls.__name__}.run is not "
                                    f"run(self, *args, grid, warmup, **kwargs): {where}")


def _wrap(cls: type) -> None:
    original = cls.__dict__["run"]

    @functools.wraps(original)
    def run(self, *args, grid, warmup, **kwargs):
        for listener in tuple(_listeners):
            listener(self, args, kwargs, warmup)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    _originals[cls] = original
    cls.run = run


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Call ``listener(fn, args, kwargs, warmup)`` before every run of any jit function inside the block: launches
    (``warmup=False``) and warmup entries (``warmup=True``). Nested and concurrent blocks each get every run; the
    classes get their own ``run`` back when the last block ends."""
    require_supported()
    with _lock:
        if not _listeners:
            for cls in JIT_CLASSES:
                _wrap(cls)
        _listeners.append(listener)
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)
            if not _listeners:
                for cls, original in _originals.items():
                    cls.run = original
                _originals.clear()


__all__ = ["JIT_CLASSES", "Listener", "listening", "require_supported", "UnsupportedTriton"]
