"""Compile-only warmup registry: every specialization the SSD path can need, compiled at startup (DESIGN section 7).

Triton compiles one binary per *specialization* of a kernel's arguments (``harness.guards.specialization``): pointer
dtype and 16-byte alignment, int == 1 / multiple of 16 / other, constexpr values, launch options. Which classes a
real call produces is decided by Mamba2 metadata, not by the model: index tensors are int32 or int64; they are
contiguous (stride 1) or block-table columns ``bt[rows_before:, j]`` (stride = columns: a multiple of 16 or not),
and such a column's pointer is 16-byte aligned only when ``(rows_before * columns + j) * itemsize % 16 == 0``
(DESIGN section 8); the state cache has a padded row stride and a storage offset; the batch and chunk counts vary.
Each kernel registers here, by parameter name, the classes it can see; ``warmup`` enumerates their product,
computes every specialization key, compiles each distinct key once with ``JITFunction.warmup`` (nothing launches)
and returns the keys, which the recompile guard then holds real calls to.

Stand-ins: a ``torch.dtype`` makes Triton's ``MockTensor``, whose ``data_ptr()`` is 0 (aligned); an unaligned
pointer class needs ``UnalignedPointer``, whose ``data_ptr()`` is one element past an aligned address.

Per-kernel decisions on ``do_not_specialize_on_alignment`` (and ``do_not_specialize`` for ints) are in
``SCALAR_ONLY``: arguments a kernel reads only as scalars gain nothing from specialization, and every such argument
multiplies the number of binaries. The registry does not depend on the decision: it enumerates all classes and
deduplicates by key, so a kernel that stops specializing an argument simply compiles fewer binaries.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from triton.runtime.jit import MockTensor

from harness.guards.specialization import SpecKey, base_jit_function, kernel_name, specialization_key

INDEX_DTYPES = (torch.int32, torch.int64)
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The three value classes Triton specializes a non-constexpr int on, by a representative value.
INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER = 1, 16, 3
INDEX_STRIDES = (INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER)  # contiguous, block table with 16k / other columns
COUNT_CLASSES = (INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER)  # batch, nchunks
ROW_PADS = (0, 1)  # padded state-cache row: H*P*N + pad keeps or breaks the multiple-of-16 class
ALIGNMENTS = (True, False)

# Arguments each kernel reads only as scalars (one element per program): alignment (and for strides, value)
# specialization buys nothing for them. Asked of the kernel owners as decorator flags; see the report in
# tests/test_gather_warmup.py::test_scalar_only_arguments_decision.
SCALAR_ONLY = {
    "kernels.gather._gather_initial_states_kernel": {
        "do_not_specialize_on_alignment": ("idx_ptr", "has_ptr"),
        "do_not_specialize": ("stride_idx", "stride_has"),
    },
    "kernels.state_passing_indexed._state_passing_indexed_kernel": {
        "do_not_specialize_on_alignment": ("init_slot_ptr", "has_init_ptr", "final_slot_ptr"),
        "do_not_specialize": ("nchunks",),
    },
    "kernels.state_passing._state_passing_kernel": {
        "do_not_specialize_on_alignment": ("seq_idx_ptr", "final_idx_ptr", "last_chunk_ptr"),
        "do_not_specialize": ("nchunks", "stride_seq_idx", "stride_final_idx", "stride_last_chunk"),
    },
}


class UnalignedPointer:
    """A tensor stand-in whose address is not a multiple of 16 (a dtype stand-in would claim alignment)."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.shape = [1]

    def data_ptr(self) -> int:
        return 16 + torch.empty(0, dtype=self.dtype).element_size()  # itemsize 1..8: never a multiple of 16

    def stride(self):
        return (1,)

    def __repr__(self) -> str:
        return f"UnalignedPointer({self.dtype})"


def pointer(dtype: torch.dtype, aligned: bool = True):
    return MockTensor(dtype) if aligned else UnalignedPointer(dtype)


@dataclass(frozen=True)
class ModelShape:
    """What a server knows at startup; everything shape-derived takes its exact class from here."""

    nheads: int
    headdim: int
    dstate: int
    ngroups: int = 1
    chunk_size: int = 256


@dataclass(frozen=True)
class WarmupRequest:
    shape: ModelShape
    io_dtypes: tuple[torch.dtype, ...]
    state_dtypes: tuple[torch.dtype, ...]
    index_dtypes: tuple[torch.dtype, ...] = INDEX_DTYPES
    index_strides: tuple[int, ...] = INDEX_STRIDES  # restrict to (1,) for a stride-1-only warmup
    index_alignments: tuple[bool, ...] = ALIGNMENTS
    mask_dtypes: tuple[torch.dtype, ...] = (torch.bool,)


@dataclass(frozen=True)
class WarmupSpec:
    """One specialization: the kernel object the launcher calls and its arguments by parameter name."""

    kernel: Any
    arguments: dict = field(hash=False)
    why: str = ""


_REGISTRY: dict[str, Callable[[WarmupRequest], Iterator[WarmupSpec]]] = {}


def register(name: str):
    """Register ``fn(request) -> iterable of WarmupSpec`` for one kernel under ``name``."""

    def deco(fn):
        if name in _REGISTRY:
            raise ValueError(f"warmup registry: {name!r} registered twice")
        _REGISTRY[name] = fn
        return fn

    return deco


def registered() -> list[str]:
    return list(_REGISTRY)


def _split_arguments(kernel: Any, arguments: dict) -> tuple[tuple, dict]:
    """Positional runtime arguments (as launchers pass them, and as ``Autotuner`` keys on) plus constexprs by name.

    Raises KeyError naming every parameter the registration forgot (the kernel gained an argument), and
    TypeError for names the kernel does not have (the kernel renamed one)."""
    view = base_jit_function(kernel)
    names = list(view.arg_names)
    tuned = set()
    for cfg in getattr(kernel, "configs", ()) if len(getattr(kernel, "configs", ())) > 0 else ():
        tuned.update(cfg.kwargs)
    unknown = set(arguments) - set(names)
    if unknown:
        raise TypeError(f"{kernel_name(kernel)}: warmup passes unknown parameters {sorted(unknown)}")
    annotations = getattr(view.fn, "__annotations__", {})
    is_constexpr = {n: "constexpr" in str(annotations.get(n, "")) for n in names}
    runtime = [n for n in names if not is_constexpr[n]]
    missing = [n for n in names if n not in arguments and n not in tuned]
    if missing:
        raise KeyError(f"{kernel_name(kernel)}: warmup registration lacks parameters {missing}")
    args = tuple(arguments[n] for n in runtime)
    constexprs = {n: arguments[n] for n in names if is_constexpr[n] and n in arguments}
    return args, constexprs


def _configs(kernel: Any, args: tuple, kwargs: dict) -> list[dict]:
    """The launch kwargs per config that ``Autotuner.warmup``/``run`` would add (one empty dict if not tuned)."""
    if not hasattr(kernel, "configs") or len(kernel.configs) <= 1:
        return [kernel.configs[0].all_kwargs()] if hasattr(kernel, "configs") else [{}]
    kernel.nargs = dict(zip(kernel.arg_names, args))
    try:
        return [c.all_kwargs() for c in kernel.prune_configs(kwargs)]
    finally:
        kernel.nargs = None


def spec_keys(spec: WarmupSpec) -> list[SpecKey]:
    args, kwargs = _split_arguments(spec.kernel, spec.arguments)
    return [specialization_key(spec.kernel, args, {**kwargs, **cfg}) for cfg in _configs(spec.kernel, args, kwargs)]


@dataclass
class WarmupReport:
    keys: list[SpecKey]  # every distinct specialization warmed (compiled on the GPU, keyed on the CPU)
    compiled: int  # binaries compiled (0 under the interpreter)
    seconds: float
    per_kernel: dict[str, int]
    enumerated: int  # class combinations before deduplication by key

    def summary(self) -> str:
        kinds = ", ".join(f"{k.rsplit('.', 1)[-1]}: {n}" for k, n in self.per_kernel.items())
        return (f"warmup: {len(self.keys)} specializations from {self.enumerated} class combinations, "
                f"{self.compiled} compiled in {self.seconds:.2f}s ({kinds})")


def warmup(
    device: str,
    shape: ModelShape,
    io_dtypes: Sequence[torch.dtype],
    state_dtypes: Sequence[torch.dtype],
    *,
    kernels: Iterable[str] | None = None,
    **request: Any,
) -> WarmupReport:
    """Compile (GPU) or key (interpreter) every registered specialization; nothing is launched.

    device: "cuda" or "cpu"; kernels: registry names (default all); request: further ``WarmupRequest`` fields
    (``index_dtypes``, ``index_strides``, ``index_alignments``, ``mask_dtypes``).
    """
    req = WarmupRequest(shape, tuple(io_dtypes), tuple(state_dtypes), **request)
    names = list(kernels) if kernels is not None else registered()
    unknown = [n for n in names if n not in _REGISTRY]
    if unknown:
        raise KeyError(f"warmup: no registration named {unknown}; registered: {registered()}")
    start = time.perf_counter()
    keys: dict[tuple[str, str], SpecKey] = {}
    per_kernel: dict[str, int] = {}
    compiled = enumerated = 0
    for name in names:
        for spec in _REGISTRY[name](req):
            enumerated += 1
            new = [k for k in spec_keys(spec) if (k.kernel, k.key) not in keys]
            if not new:
                continue
            for k in new:
                keys[(k.kernel, k.key)] = k
                per_kernel[k.kernel] = per_kernel.get(k.kernel, 0) + 1
            if device == "cuda":
                args, kwargs = _split_arguments(spec.kernel, spec.arguments)
                spec.kernel.warmup(*args, grid=(1,), **kwargs)
                compiled += len(new)
    return WarmupReport(list(keys.values()), compiled, time.perf_counter() - start, per_kernel, enumerated)


# ---------------------------------------------------------------------------------------------------------------
# Registrations. Each mirrors its launcher's argument list by parameter name; a kernel that gains or renames a
# parameter makes ``_split_arguments`` raise, so the registry cannot silently fall behind.


def _mask_kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    """Launchers view a bool mask as uint8 (same bytes) before passing it."""
    return torch.uint8 if dtype == torch.bool else dtype


@register("gather")
def _gather_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import gather

    s = req.shape
    row = s.nheads * s.headdim * s.dstate
    for (state, cache_aligned, pad, idx_dtype, idx_aligned, idx_stride, mask_dtype, has_aligned,
         has_stride) in itertools.product(req.state_dtypes, ALIGNMENTS, ROW_PADS, req.index_dtypes,
                                          req.index_alignments, req.index_strides, req.mask_dtypes,
                                          req.index_alignments, req.index_strides):
        yield WarmupSpec(gather._gather_initial_states_kernel, dict(
            cache_ptr=pointer(state, cache_aligned), idx_ptr=pointer(idx_dtype, idx_aligned),
            has_ptr=pointer(_mask_kernel_dtype(mask_dtype), has_aligned), out_ptr=pointer(state),
            row=row, stride_cache_slot=row + pad, stride_idx=idx_stride, stride_has=has_stride,
            stride_out_batch=row, BLOCK_SIZE=gather.BLOCK_SIZE,
        ), why=f"{state} cache, {idx_dtype} index stride {idx_stride}")


@register("state_passing_indexed")
def _state_passing_indexed_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import state_passing_indexed as spi

    s = req.shape
    dim, q = s.headdim * s.dstate, s.chunk_size
    for (state, cache_aligned, pad, idx_dtype, init_aligned, final_aligned, mask_dtype, has_aligned,
         nchunks) in itertools.product(req.state_dtypes, ALIGNMENTS, ROW_PADS, req.index_dtypes,
                                       req.index_alignments, req.index_alignments, req.mask_dtypes,
                                       req.index_alignments, COUNT_CLASSES):
        # the dense workspace strides are (C*H*dim, H*dim...) of fresh tensors; dA_cumsum is (H, C, Q)
        yield WarmupSpec(spi._state_passing_indexed_kernel, dict(
            states_ptr=pointer(torch.float32), out_ptr=pointer(state), dA_cs_ptr=pointer(torch.float32),
            cache_ptr=pointer(state, cache_aligned), init_slot_ptr=pointer(idx_dtype, init_aligned),
            has_init_ptr=pointer(_mask_kernel_dtype(mask_dtype), has_aligned),
            final_slot_ptr=pointer(idx_dtype, final_aligned),
            dim=dim, nchunks=nchunks, chunk_size=q,
            stride_states_chunk=s.nheads * dim, stride_states_head=dim,
            stride_out_chunk=s.nheads * dim, stride_out_head=dim,
            stride_dA_head=nchunks * q, stride_dA_chunk=q, stride_dA_q=1,
            stride_cache_slot=s.nheads * dim + pad, stride_cache_head=dim,
            BLOCK_SIZE=spi.BLOCK_SIZE,
        ), why=f"{state} cache, {idx_dtype} slots, {nchunks} chunks")
