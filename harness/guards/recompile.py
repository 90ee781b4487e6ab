"""Recompile guard: after the startup warmup, a real call must not compile anything (docs/checks.md).

The guard judges every ``@triton.jit`` function launched inside it, whoever wrote it (or only a listed few): launches
are seen at the jit classes' ``run`` (``harness.triton_launches``), compiles at Triton's compile hook. On the GPU two
independent witnesses are used: Triton's runtime compile hook (``knobs.runtime.jit_cache_hook``, called before every
in-memory compile with the kernel and its cache key) and the per-device kernel caches of every launched function
(``JITFunction.device_caches[device][0]``, compared between its first launch in the block and the block's end).
The hook never returns a truthy value of its own: a truthy return makes Triton skip the compile *and the launch*
(``JITFunction._do_compile``), which would turn the guard into a silent no-op of the kernel. A hook installed by
someone else is still called and its answer passed through unchanged.

Under the interpreter nothing compiles, so both witnesses are empty by construction; the guard then requires the
warmed specialization keys and compares each launch's key against them (``specialization.py``).

Version notes: the hook lives in ``knobs.runtime.jit_cache_hook`` from Triton 3.4 on (before: the class attribute
``JITFunction.cache_hook``); hook keyword arguments have been stable (key, repr, fn, compile, is_manual_warmup,
already_compiled), taken here as ``**kwargs`` so additions do not break it. ``device_caches`` values are tuples whose
first element is the ``{key: CompiledKernel}`` dict in 3.4 .. 3.6 (3.5 added the key cache as the second element).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import pytest
from triton import knobs
from triton.runtime.jit import JITFunction

from harness.guards.specialization import (
    MissingSpecialization,
    SpecKey,
    assert_keys_warmed,
    base_jit_function,
    explain_missing,
    kernel_name,
    specialization_key,
)
from harness.triton_launches import listening


class RecompileError(AssertionError):
    """A kernel compiled in memory during a call that the warmup should have covered."""


@dataclass(frozen=True)
class CompileEvent:
    kernel: str
    key: str
    signature: str  # Triton's readable repr: name[num_warps=...](arg: type, ...)
    is_warmup: bool


def _get_hook():
    if hasattr(knobs, "runtime") and hasattr(knobs.runtime, "jit_cache_hook"):
        return knobs.runtime.jit_cache_hook
    return JITFunction.cache_hook  # Triton < 3.4


def _set_hook(hook) -> None:
    if hasattr(knobs, "runtime") and hasattr(knobs.runtime, "jit_cache_hook"):
        knobs.runtime.jit_cache_hook = hook
    else:
        JITFunction.cache_hook = hook


@contextlib.contextmanager
def compile_events() -> Iterator[list[CompileEvent]]:
    """Record every in-memory JIT compile (any kernel) inside the block; compiles still happen and launch."""
    events: list[CompileEvent] = []
    previous = _get_hook()

    def hook(*, key, repr=None, fn=None, compile=None, is_manual_warmup=False, **kwargs):
        name = f"{fn.module}.{fn.name}" if fn is not None else "<unknown>"
        events.append(CompileEvent(name, str(key), str(repr), bool(is_manual_warmup)))
        if previous is not None:  # someone else's decision, passed through; ours is always None
            return previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup, **kwargs)
        return None

    _set_hook(hook)
    try:
        yield events
    finally:
        _set_hook(previous)


def kernel_cache_keys(kernel: Any) -> set[tuple[Any, str]]:
    """(device, key) of every compiled specialization held in memory for ``kernel`` (empty under the interpreter)."""
    jit = base_jit_function(kernel)
    caches = getattr(jit, "device_caches", None)
    if caches is None:
        return set()
    keys = set()
    for device, entry in list(caches.items()):
        kernel_cache = entry[0] if isinstance(entry, tuple) else entry
        keys.update((device, str(k)) for k in kernel_cache)
    return keys


@contextlib.contextmanager
def cold_in_memory_cache(kernel: Any) -> Iterator[None]:
    """Run the block with ``kernel``'s in-memory binaries set aside, so that a class nobody warmed really compiles
    (the hook fires on every in-memory miss; Triton's disk cache does not matter), then put back exactly what was
    there. Clearing without restoring left an xdist worker's warmed corpus cold for every case it ran after such a
    test: later case items compiled and the recompile guard failed them."""
    jit = base_jit_function(kernel)
    if getattr(jit, "device_caches", None) is None:  # the interpreter holds no binaries: nothing to set aside
        yield
        return
    saved = dict(jit.device_caches)
    jit.device_caches.clear()
    try:
        yield
    finally:
        jit.device_caches.clear()
        jit.device_caches.update(saved)


def compiles_possible() -> bool:
    """False under the interpreter, where the compile witnesses cannot see anything."""
    return not knobs.runtime.interpret


EVERY_KERNEL = None  # ``guard_no_recompile(EVERY_KERNEL, ...)``: every jit function launched in the block, anyone's


@dataclass
class GuardRecord:
    """What a guarded block launched (real launches, not warmups): the kernels seen and, when warmed keys were
    given, every launch's specialization key."""

    kernels: dict[str, int] = field(default_factory=dict)  # kernel name -> launches
    keys: list[SpecKey] = field(default_factory=list)

    @property
    def launches(self) -> int:
        return sum(self.kernels.values())


@contextlib.contextmanager
def guard_no_recompile(kernels: Iterable[Any] | None = EVERY_KERNEL,
                       warmed: Iterable[SpecKey] | None = None) -> Iterator[GuardRecord]:
    """Fail on exit if anything compiled inside the block (GPU), or if a launch used a key outside ``warmed``
    (both backends; required under the interpreter, where nothing compiles).

    kernels: ``EVERY_KERNEL`` (default) judges every ``@triton.jit`` function launched inside the block, whoever
    wrote it (``harness.triton_launches``); a list (Autotuner or jit objects) judges only those, and a block that
    launches none of them fails (the guard would have checked nothing).
    """
    every = kernels is EVERY_KERNEL
    kernels = [] if every else list(kernels)
    warmed = None if warmed is None else list(warmed)
    if not compiles_possible() and warmed is None:
        raise ValueError("guard_no_recompile: under the interpreter nothing compiles; pass the warmed keys "
                         "(kernels.warmup.warmup(...).keys) so that launch keys can be compared")
    if warmed is not None and not every and not kernels:
        raise ValueError("guard_no_recompile: warmed keys given but no kernels to watch")
    watched = {id(base_jit_function(k)) for k in kernels}
    # Per launched jit function, its in-memory binaries before its first launch in the block (the second GPU
    # witness): taken up front for the listed kernels, at first sight for the others.
    before: dict[int, tuple[Any, set]] = {id(base_jit_function(k)): (base_jit_function(k), kernel_cache_keys(k))
                                          for k in kernels}
    record = GuardRecord()
    unkeyed: list[str] = []

    def on_run(fn, args, kwargs, warmup):
        if warmup or not (every or id(fn) in watched):
            return
        if id(fn) not in before:
            before[id(fn)] = (fn, kernel_cache_keys(fn))
        name = kernel_name(fn)
        record.kernels[name] = record.kernels.get(name, 0) + 1
        if warmed is not None:
            try:
                record.keys.append(specialization_key(fn, args, kwargs))
            except Exception as exc:  # noqa: BLE001 - an argument Triton's binder takes but our keying does not
                unkeyed.append(f"{name}: its specialization key cannot be computed ({type(exc).__name__}: {exc})")

    with contextlib.ExitStack() as stack:
        events = stack.enter_context(compile_events())
        stack.enter_context(listening(on_run))
        yield record
    problems = []
    for e in events:
        problems.append(f"compile hook: {e.kernel} compiled{' (warmup)' if e.is_warmup else ''} key {e.key}\n"
                        f"    {e.signature}")
    for fn, keys in before.values():
        for device, key in sorted(kernel_cache_keys(fn) - keys, key=str):
            problems.append(f"kernel cache: {kernel_name(fn)} gained key {key} on device {device}")
    problems += unkeyed
    if warmed is not None:
        if not every and not record.launches:
            problems.append(f"no launch of the watched kernels happened: {sorted(kernel_name(k) for k in kernels)}")
        try:
            assert_keys_warmed(record.keys, warmed)
        except MissingSpecialization as e:
            problems.append(str(e))
    if problems:
        raise RecompileError("new compiles during a guarded call:\n" + "\n".join(problems))


@pytest.fixture
def no_recompile():
    """The guard as a fixture: ``with no_recompile(kernels, warmed=report.keys): call()``."""
    return guard_no_recompile


__all__ = ["RecompileError", "CompileEvent", "GuardRecord", "EVERY_KERNEL", "compile_events", "kernel_cache_keys",
           "compiles_possible", "guard_no_recompile", "no_recompile", "explain_missing"]
