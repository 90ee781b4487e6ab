"""Specialization keys: what Triton would compile for a call, computed without compiling (docs/checks.md).

The keys themselves are the kernels' (``kernels.specialization``: the warmup registry enumerates them); here they
guard real calls. On the GPU the recompile guard (``recompile.py``) sees compiles; under the interpreter nothing
compiles, so the key each launch *would* have on the GPU is recorded and compared against the warmed set. CPU CI
therefore catches the same stride/alignment regressions as the GPU tier.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from harness.triton_launches import listening
from kernels.specialization import (  # noqa: F401  (re-exported: the guards' callers name keys from here)
    SpecKey,
    base_jit_function,
    kernel_name,
    specialization_key,
)


class MissingSpecialization(AssertionError):
    """A real call needs a specialization the startup warmup did not produce."""


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
    block, with the arguments exactly as Triton keys them, on either backend (``harness.triton_launches``:
    ``Autotuner`` and ``kernel[grid]`` both end in the jit function's ``run``)."""
    watched = {id(base_jit_function(k)) for k in kernels}

    def listener(fn, args, kwargs, warmup):
        if not warmup and id(fn) in watched:
            on_launch(fn, args, kwargs)

    with listening(listener):
        yield


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
