"""Specialization keys: what Triton would compile for a launch, computed without compiling.

Triton keys its per-device kernel cache on the *specialization* of every argument: a pointer's dtype and whether
its address is 16-byte aligned, an int's width and whether it equals 1 or is a multiple of 16, every constexpr's
value, and the launch options (num_warps, ...). A launch whose key was not compiled at startup compiles in the
middle of serving. This module computes the key a launch *would* have on the GPU, on either backend, with Triton's
own binder (``create_function_from_signature`` over the kernel's ``KernelParam``s and ``native_specialize_impl``):
the warmup registry (``kernels.warmup``) enumerates keys with it, and a recompile guard compares real launches'
keys against them (under the interpreter, where nothing compiles, that comparison is the whole guard).

Version notes (Triton 3.4 .. 3.9, ``kernels.triton_version.VERIFIED``; the internals come through
``kernels.triton_internals``, which refuses others): the binder ``create_function_from_signature(sig, params,
backend)`` and ``JITFunction.params`` exist throughout; ``JITFunction.run`` adds ``debug`` and (3.5+)
``instrumentation_mode`` to the options before keying, which ``options_as_run_sees_them`` mirrors
(feature-detected). The NVIDIA backend uses ``BaseBackend``'s int/tensor specialization, so ``BaseBackend`` stands
in for it on the CPU; AMD's extra ``S`` (buffer-ops pointer range) attribute is not modelled.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from triton import knobs

from kernels.triton_internals import (
    BaseBackend,
    InterpretedFunction,
    JITFunction,
    MockTensor,
    create_function_from_signature,
    require_specialization,
)


@dataclass(frozen=True)
class SpecKey:
    """One kernel specialization: ``key`` is Triton's kernel-cache key string for it (``compute_cache_key``)."""

    kernel: str  # module.qualname of the @triton.jit function
    key: str
    params: tuple[tuple[str, str], ...] = field(compare=False, default=())  # (name, readable class) per argument

    def describe(self) -> str:
        return f"{self.kernel}(" + ", ".join(f"{n}: {c}" for n, c in self.params) + ")"


def base_jit_function(kernel: Any) -> Any:
    """The ``@triton.jit`` object under ``Autotuner``/``Heuristics`` wrappers (a JITFunction or, under the
    interpreter, an InterpretedFunction). Refuses a Triton whose binder and jit classes are not the verified ones
    (``kernels.triton_internals``)."""
    require_specialization()
    while not isinstance(kernel, (JITFunction, InterpretedFunction)):
        if not hasattr(kernel, "fn"):
            raise TypeError(f"not a Triton kernel: {kernel!r}")
        kernel = kernel.fn
    return kernel


def kernel_name(kernel: Any) -> str:
    fn = base_jit_function(kernel).fn
    return f"{fn.__module__}.{fn.__qualname__}"


_binders: dict[int, tuple[Any, JITFunction, Any]] = {}
_binders_lock = threading.Lock()


def gpu_view(kernel: Any) -> JITFunction:
    """A JITFunction with the kernel's parameters and specialization flags (built from an InterpretedFunction's
    Python function under the interpreter; constructing one needs no driver)."""
    jit = base_jit_function(kernel)
    if isinstance(jit, JITFunction):
        return jit
    return JITFunction(jit.fn, **jit.kwargs)


def _binder(kernel: Any):
    jit = base_jit_function(kernel)
    with _binders_lock:
        hit = _binders.get(id(jit))
        if hit is None or hit[0] is not jit:
            view = gpu_view(jit)
            hit = (jit, view, create_function_from_signature(view.signature, view.params, BaseBackend))
            _binders[id(jit)] = hit
    return hit[1], hit[2]


def options_as_run_sees_them(view: JITFunction, kwargs: dict) -> dict:
    """``JITFunction.run`` writes these two entries before keying; the key string depends on dict order, so mirror
    it exactly (assignment appends a missing key at the end)."""
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", view.debug) or knobs.runtime.debug
    if hasattr(knobs, "compilation") and hasattr(knobs.compilation, "instrumentation_mode"):  # 3.5+
        kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    return kwargs


def readable_class(spec: tuple, alignment_specialized: bool = True) -> str:
    """('*i32', 'D') -> '*i32 aligned16'; ('i64', '') -> 'i64 other'; ('constexpr', 1) -> '=1'. With
    ``alignment_specialized=False`` (the parameter is in ``do_not_specialize_on_alignment``) an empty attribute
    means "not looked at", not "unaligned"/"other"."""
    ty, attr = spec[0], spec[1] if len(spec) > 1 else None
    if ty == "constexpr":
        return f"={attr!r}"
    if attr is None:
        return f"{ty} (not specialized)"
    if not alignment_specialized:
        return f"{ty} (alignment not specialized)"
    if isinstance(ty, str) and ty.startswith("*"):
        return f"{ty} {'aligned16' if 'D' in attr else 'unaligned'}"
    return f"{ty} {'multiple of 16' if 'D' in attr else 'other'}"


def specialization_key(kernel: Any, args: tuple = (), kwargs: dict | None = None) -> SpecKey:
    """The key a GPU launch (or ``warmup``) of ``kernel`` with these arguments would look up.

    ``args``/``kwargs`` are what ``JITFunction.run`` receives: tensors, ints, constexprs by name, launch options
    (``num_warps`` ...). ``torch.dtype`` arguments stand for aligned tensors (``MockTensor``), as in ``warmup``.
    """
    view, binder = _binder(kernel)
    args = tuple(MockTensor.wrap_dtype(a) for a in args)
    kwargs = {k: MockTensor.wrap_dtype(v) for k, v in (kwargs or {}).items()}
    _, specialization, options = binder(*args, **options_as_run_sees_them(view, kwargs))
    key = str(specialization) + str(options)
    params = tuple((p.name, readable_class(s, not p.do_not_specialize_on_alignment))
                   for p, s in zip(view.params, specialization, strict=True))
    opts = tuple((k, repr(v)) for k, v in options.items())
    return SpecKey(kernel_name(kernel), key, params + opts)
