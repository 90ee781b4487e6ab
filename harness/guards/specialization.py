"""Specialization keys: what Triton would compile for a call, computed without compiling (docs/checks.md).

Triton keys its per-device kernel cache on the *specialization* of every argument: a pointer's dtype and whether
its address is 16-byte aligned, an int's width and whether it equals 1 or is a multiple of 16, every constexpr's
value, and the launch options (num_warps, ...). A call whose key was not compiled at startup compiles in the middle
of serving. On the GPU the recompile guard (``recompile.py``) sees those compiles; under the interpreter nothing
compiles, so this module computes the key each call *would* have on the GPU, with Triton's own binder
(``create_function_from_signature`` over the kernel's ``KernelParam``s and ``native_specialize_impl``), and compares
it against the warmed set. CPU CI therefore catches the same stride/alignment regressions as the GPU tier.

Version notes (Triton 3.4 .. 3.9): the binder ``create_function_from_signature(sig, params, backend)`` and
``JITFunction.params`` exist throughout; ``JITFunction.run`` adds ``debug`` and (3.5+) ``instrumentation_mode`` to the
options before keying, which ``_options_as_run_sees_them`` mirrors (feature-detected). The NVIDIA backend uses
``BaseBackend``'s int/tensor specialization, so ``BaseBackend`` stands in for it on the CPU; AMD's extra ``S``
(buffer-ops pointer range) attribute is not modelled.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from triton import knobs
from triton.backends.compiler import BaseBackend
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction, MockTensor, create_function_from_signature


class MissingSpecialization(AssertionError):
    """A real call needs a specialization the startup warmup did not produce."""


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
    interpreter, an InterpretedFunction)."""
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


def _gpu_view(kernel: Any) -> JITFunction:
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
            view = _gpu_view(jit)
            hit = (jit, view, create_function_from_signature(view.signature, view.params, BaseBackend))
            _binders[id(jit)] = hit
    return hit[1], hit[2]


def _options_as_run_sees_them(view: JITFunction, kwargs: dict) -> dict:
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
    _, specialization, options = binder(*args, **_options_as_run_sees_them(view, kwargs))
    key = str(specialization) + str(options)
    params = tuple((p.name, readable_class(s, not p.do_not_specialize_on_alignment))
                   for p, s in zip(view.params, specialization))
    opts = tuple((k, repr(v)) for k, v in options.items())
    return SpecKey(kernel_name(kernel), key, params + opts)


def explain_missing(missing: SpecKey, warmed: Iterable[SpecKey]) -> str:
    """Name the missing key and, against the closest warmed key of the same kernel, the arguments that differ."""
    same = [w for w in warmed if w.kernel == missing.kernel]
    lines = [f"kernel {missing.kernel}: specialization not warmed up", f"  needed: {missing.describe()}"]
    if not same:
        lines.append("  no specialization of this kernel was warmed up at all")
        return "\n".join(lines)

    def differing(w: SpecKey) -> list[str]:
        theirs = dict(w.params)
        return [f"{n}: needed {c}, closest warmed {theirs.get(n, '<absent>')}" for n, c in missing.params
                if theirs.get(n) != c]

    closest = min(same, key=lambda w: len(differing(w)))
    lines.append(f"  {len(same)} specialization(s) of this kernel were warmed; closest differs in:")
    lines += [f"    {d}" for d in differing(closest)]
    return "\n".join(lines)


def assert_keys_warmed(needed: Iterable[SpecKey], warmed: Iterable[SpecKey]) -> None:
    """Raise ``MissingSpecialization`` listing every needed key not in ``warmed``."""
    warmed = list(warmed)
    have = {(w.kernel, w.key) for w in warmed}
    missing, seen = [], set()
    for k in needed:
        if (k.kernel, k.key) not in have and (k.kernel, k.key) not in seen:
            seen.add((k.kernel, k.key))
            missing.append(k)
    if missing:
        raise MissingSpecialization(
            f"{len(missing)} specialization(s) would compile during the call:\n"
            + "\n".join(explain_missing(m, warmed) for m in missing)
        )


@dataclass(frozen=True)
class Launch:
    """One real launch as ``JITFunction.run`` received it (autotuned kernels: with the config's kwargs)."""

    kernel: Any
    args: tuple
    kwargs: dict = field(hash=False)


@contextlib.contextmanager
def _wrapped_runs(kernels: Iterable[Any], on_launch) -> Iterator[None]:
    """Call ``on_launch(base_kernel, args, kwargs)`` for every real launch (not warmups) of ``kernels`` inside the
    block. Wraps each base jit object's ``run`` for the duration (an instance attribute; ``Autotuner`` and
    ``kernel[grid]`` both go through it), so the arguments are exactly what Triton would key on, on either backend."""
    patched = []
    for k in {id(base_jit_function(k)): base_jit_function(k) for k in kernels}.values():
        original = k.run

        def run(*args, _kernel=k, _original=original, grid, warmup, **kwargs):
            if not warmup:
                on_launch(_kernel, args, kwargs)
            return _original(*args, grid=grid, warmup=warmup, **kwargs)

        k.run = run
        patched.append(k)
    try:
        yield
    finally:
        for k in patched:
            del k.run  # back to the class's method


@contextlib.contextmanager
def recording_launches(kernels: Iterable[Any]) -> Iterator[list[SpecKey]]:
    """Record the ``SpecKey`` of every real launch (not warmups) of ``kernels`` inside the block."""
    seen: list[SpecKey] = []
    with _wrapped_runs(kernels, lambda k, args, kwargs: seen.append(specialization_key(k, args, kwargs))):
        yield seen


@contextlib.contextmanager
def capturing_launches(kernels: Iterable[Any]) -> Iterator[list[Launch]]:
    """Keep every real launch's kernel and arguments (to compile them for a GPU target later: ``gpu_compile``)."""
    seen: list[Launch] = []
    with _wrapped_runs(kernels, lambda k, args, kwargs: seen.append(Launch(k, tuple(args), dict(kwargs)))):
        yield seen


@contextlib.contextmanager
def expect_warmed(kernels: Iterable[Any], warmed: Iterable[SpecKey]) -> Iterator[list[SpecKey]]:
    """Fail on exit when a launch of ``kernels`` inside the block used a key outside ``warmed``."""
    warmed = list(warmed)
    with recording_launches(kernels) as seen:
        yield seen
    if not seen:
        raise MissingSpecialization(
            "no launch of the watched kernels happened inside the block: the guard checked nothing "
            f"(watched: {sorted({kernel_name(k) for k in kernels})})"
        )
    assert_keys_warmed(seen, warmed)
