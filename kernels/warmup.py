"""Compile-only warmup registry: every specialization the SSD path can need, compiled at startup (docs/checks.md).

Triton compiles one binary per *specialization* of a kernel's arguments (``harness.guards.specialization``): pointer
dtype and 16-byte alignment, int == 1 / multiple of 16 / other, constexpr values, launch options. Which classes a
real call produces is decided by Mamba2 metadata, not by the model: index tensors are int32 or int64; they are
contiguous (stride 1) or block-table columns ``bt[rows_before:, j]`` (stride = columns: a multiple of 16 or not),
and such a column's pointer is 16-byte aligned only when ``(rows_before * columns + j) * itemsize % 16 == 0``
(docs/exactness.md); the state cache has a padded row stride and a storage offset; the batch and chunk counts vary.
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
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from triton.runtime.jit import MockTensor

from harness.guards.specialization import SpecKey, base_jit_function, kernel_name, specialization_key
from harness.compile_claims import ClaimBoard, compile_claimed

INDEX_DTYPES = (torch.int32, torch.int64)
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The three value classes Triton specializes a non-constexpr int on, by a representative value.
INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER = 1, 16, 3
INDEX_STRIDES = (INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER)  # contiguous, block table with 16k / other columns
COUNT_CLASSES = (INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER)  # batch, nchunks
ROW_PADS = (0, 1)  # padded state-cache row: H*P*N + pad keeps or breaks the multiple-of-16 class
# nchunks / batch / pad values tried for a count that enters ints as a*n + b: 1..16 cover every residue mod 16 and
# 17 is "== 1 mod 16 but not 1"; ``representatives`` keeps one value per distinct tuple of classes.
COUNT_CANDIDATES = tuple(range(1, 18))
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
    # What ssd_prefill may be called with. Defaults: everything the case schema allows (the GPU suite); a server
    # that knows its model's options narrows them. Metadata tensors are int32 as vLLM and the case builder make them.
    metadata_dtypes: tuple[torch.dtype, ...] = (torch.int32,)
    d_kinds: tuple[str, ...] = ("none", "per_head", "per_channel")
    z_options: tuple[bool, ...] = (False, True)
    dt_bias_options: tuple[bool, ...] = (False, True)
    softplus_options: tuple[bool, ...] = (False, True)
    dt_limit_options: tuple[bool, ...] = (False, True)  # True: a limit other than (0, inf)
    paths: tuple[str, ...] = ("snapshot", "indexed")
    modes: tuple[str, ...] = ("direct", "returned", "checkpoint")


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


def watched_kernels() -> list[Any]:
    """The kernel objects the SSD path launches (what a recompile guard watches): one per registration."""
    from kernels import bmm_chunk, chunk_cumsum, chunk_scan, chunk_state, gather, state_passing
    from kernels import state_passing_indexed

    return [gather._gather_initial_states_kernel, state_passing_indexed._state_passing_indexed_kernel,
            chunk_cumsum._chunk_cumsum_kernel, chunk_state.chunk_state_kernel, bmm_chunk.bmm_chunk_kernel,
            chunk_scan.chunk_scan_kernel, state_passing._state_passing_kernel]


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
    jobs: int = 1  # processes that compiled first (``jobs`` > 1), before this one loaded everything
    parallel_seconds: float = 0.0  # their wall time (included in ``seconds``)

    def summary(self) -> str:
        kinds = ", ".join(f"{k.rsplit('.', 1)[-1]}: {n}" for k, n in self.per_kernel.items())
        how = f", by {self.jobs} processes in {self.parallel_seconds:.2f}s then loaded" if self.jobs > 1 else ""
        return (f"warmup: {len(self.keys)} specializations from {self.enumerated} class combinations, "
                f"{self.compiled} compiled in {self.seconds:.2f}s{how} ({kinds})")


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
    return warmup_all(device, [(shape, tuple(io_dtypes), tuple(state_dtypes), request)], kernels=kernels)


def _plan(requests: Iterable[tuple], names: list[str]) -> tuple[list[tuple[WarmupSpec, list[SpecKey], list[str]]],
                                                                 int]:
    """Every spec that adds a specialization not seen before, with those keys and the claim names of all the
    binaries it compiles (the same in every process, whatever else that process plans), in registry order; and
    the number of class combinations enumerated."""
    seen: set[tuple[str, str]] = set()
    todo: list[tuple[WarmupSpec, list[SpecKey], list[str]]] = []
    enumerated = 0
    for shape, io, state, *options in requests:
        req = WarmupRequest(shape, tuple(io), tuple(state), **(options[0] if options else {}))
        for name in names:
            for spec in _REGISTRY[name](req):
                enumerated += 1
                keys = spec_keys(spec)
                new = [k for k in keys if (k.kernel, k.key) not in seen]
                if new:
                    seen.update((k.kernel, k.key) for k in new)
                    todo.append((spec, new, [ClaimBoard.name(k.kernel, k.key) for k in keys]))
    return todo, enumerated


def compile_order(n: int, first: float = 0.0, part: tuple[int, int] | None = None) -> list[int]:
    """Indices of ``n`` specs in the order to compile them: rotated to start at fraction ``first`` of the list (so
    xdist workers warming the same request at once start on different specs and find the rest in the shared disk
    cache instead of compiling them all twice), and with ``part=(k, count)`` only every count-th spec from k (one
    of count parallel warmup processes)."""
    start = int(n * first) % n if n else 0
    order = list(range(start, n)) + list(range(start))
    if part is not None:
        k, count = part
        order = [i for i in order if i % count == k]
    return order


def warmup_all(
    device: str,
    requests: Iterable[tuple],
    *,
    kernels: Iterable[str] | None = None,
    first: float = 0.0,
    part: tuple[int, int] | None = None,
    jobs: int = 1,
    claims: ClaimBoard | None = None,
) -> WarmupReport:
    """One warmup for several (shape, io dtypes, state dtypes[, request options]); keys merged (the same class
    compiled for two shapes is one binary: shapes enter keys only through their int classes and the block-size
    constexprs). ``first`` and ``part``: see ``compile_order``; ``keys`` always lists every specialization.
    ``jobs > 1`` (GPU): at the first specialization the disk cache lacks, ``jobs`` child processes compile a part
    each into the Triton disk cache, then this process loads the rest from there (Triton compiles one kernel at a
    time per process); a warm cache is loaded without starting any (their start-up cost 5-25 s on a busy host).
    ``claims`` (GPU; default: the board named by ``SSD_HARNESS_COMPILE_CLAIMS``, which the pytest plugin sets for
    an xdist session): processes warming at once share the compiles (``harness.compile_claims.compile_claimed``),
    the ``jobs`` children among them (each its own part; the parent, which only loads after them, claims nothing),
    so that workers warming overlapping requests with children do not compile the overlap once per worker."""
    names = list(kernels) if kernels is not None else registered()
    unknown = [n for n in names if n not in _REGISTRY]
    if unknown:
        raise KeyError(f"warmup: no registration named {unknown}; registered: {registered()}")
    requests = list(requests)
    start = time.perf_counter()
    parallel = 0.0
    todo, enumerated = _plan(requests, names)
    compiled = 0
    if claims is None and device == "cuda" and jobs == 1:
        claims = ClaimBoard.from_env()
    order = compile_order(len(todo), first, part)
    if device == "cuda" and claims is not None:
        compile_claimed([(spec, claim_names) for spec, _, claim_names in todo], order, claims, _compile_one)
        compiled = sum(len(todo[i][1]) for i in order)
    elif device == "cuda":
        spawn = jobs > 1 and part is None
        for i in order:
            before = _disk_cache_entries() if spawn else None
            _compile_one(todo[i][0])
            compiled += len(todo[i][1])
            if spawn and (before is None or _disk_cache_entries() != before):
                # A real compile (or a cache we cannot see into): the children compile the rest in parallel, and
                # this process loads it from the disk cache below. A warm cache never pays for the processes.
                parallel = _compile_in_children(requests, names, jobs)
                spawn = False
    keys = [k for _, new, _ in todo for k in new]
    per_kernel: dict[str, int] = {}
    for k in keys:
        per_kernel[k.kernel] = per_kernel.get(k.kernel, 0) + 1
    return WarmupReport(keys, compiled, time.perf_counter() - start, per_kernel, enumerated,
                        jobs if parallel else 1, parallel)


def _compile_one(spec) -> None:
    args, kwargs = _split_arguments(spec.kernel, spec.arguments)
    spec.kernel.warmup(*args, grid=(1,), **kwargs)


def _disk_cache_entries() -> int | None:
    """Entries in Triton's disk cache folder (a compile adds one; a load adds none), or None when it has none."""
    from triton import knobs

    try:
        return len(os.listdir(knobs.cache.dir))
    except (OSError, TypeError):
        return None


def _compile_in_children(requests: list[tuple], names: list[str], jobs: int) -> float:
    """Run ``compile_part`` for parts 0..jobs-1 of ``requests`` in child processes; raise naming any part that
    failed. Returns their wall time."""
    import pickle
    import subprocess
    import tempfile

    from harness.guards.gpu_compile import compiler_child_env

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "requests.pkl")
        with open(job, "wb") as fh:
            pickle.dump((requests, names), fh)
        env = compiler_child_env()
        code = "import sys; from kernels.warmup import compile_part; compile_part(sys.argv[1], sys.argv[2])"
        children = [subprocess.Popen([sys.executable, "-c", code, job, f"{k}/{jobs}"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    for k in range(jobs)]
        errors = [child.communicate()[1] for child in children]
    failed = [f"part {k}/{jobs} (exit {c.returncode}):\n{err[-2000:]}"
              for k, (c, err) in enumerate(zip(children, errors)) if c.returncode != 0]
    if failed:
        raise RuntimeError("warmup: parallel compile failed:\n" + "\n".join(failed))
    return time.perf_counter() - start


def compile_part(job: str, part: str) -> None:
    """Child body of ``_compile_in_children``: compile part ``K/N`` of the pickled requests."""
    import pickle

    with open(job, "rb") as fh:
        requests, names = pickle.load(fh)
    k, n = (int(v) for v in part.split("/"))
    warmup_all("cuda", requests, kernels=names, part=(k, n))


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


# ---- class derivation ---------------------------------------------------------------------------------------------
# The enumeration is pruned by what each kernel specializes (its ``do_not_specialize`` /
# ``do_not_specialize_on_alignment`` lists, read from the jit object), so the registry is right before and after
# the decorator changes and enumerates fewer combinations after them; the final word is always the key dedup.


def int_class(v: int) -> str:
    """Triton's value class of a specialized int (below 2**31; larger values are i64 and not produced here)."""
    return "=1" if v == 1 else ("16k" if v % 16 == 0 else "other")


def representatives(*fns: Callable[[int], int], candidates: Iterable[int] = COUNT_CANDIDATES) -> list[int]:
    """One count per distinct tuple of ``int_class(f(n))``: the counts whose derived ints differ in class."""
    seen: dict[tuple, int] = {}
    for n in candidates:
        seen.setdefault(tuple(int_class(f(n)) for f in fns), n)
    return list(seen.values())


def _param(kernel: Any, name: str):
    from harness.guards.specialization import _gpu_view

    for p in _gpu_view(kernel).params:
        if p.name == name:
            return p
    raise KeyError(f"{kernel_name(kernel)} has no parameter {name!r}")


def alignments(kernel: Any, name: str, wanted: Iterable[bool]) -> tuple[bool, ...]:
    """Pointer alignments worth enumerating for ``name``: one when the kernel ignores its alignment."""
    p = _param(kernel, name)
    return (True,) if p.do_not_specialize or p.do_not_specialize_on_alignment else tuple(wanted)


def int_values(kernel: Any, name: str, values: Iterable[int]) -> tuple[int, ...]:
    """Values worth enumerating for int ``name``: one when not specialized at all; ``=1`` vs not when only the
    multiple-of-16 class is switched off (``do_not_specialize_on_alignment`` also governs ints)."""
    values = tuple(values)
    p = _param(kernel, name)
    if p.do_not_specialize:
        return values[:1]
    if p.do_not_specialize_on_alignment:
        return tuple({(v == 1): v for v in reversed(values)}.values())
    return values


def _strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Contiguous strides of a fresh tensor."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _index_views(kernel: Any, ptr: str, stride: str, req: WarmupRequest) -> Iterator[tuple[Any, int]]:
    """(pointer stand-in, stride) of a user index tensor: contiguous or a block-table column, any dtype."""
    for dtype, aligned, st in itertools.product(req.index_dtypes, alignments(kernel, ptr, req.index_alignments),
                                                int_values(kernel, stride, req.index_strides)):
        yield pointer(dtype, aligned), st


# ---- the five SSD stages ------------------------------------------------------------------------------------------
# Inputs x, dt, B, C, z, D, dt_bias, A and out are fresh contiguous tensors (aligned, strides from the shape), as
# the case builder and vLLM's packed varlen layout give them; workspaces are allocated by the launchers. What varies
# per call: nchunks (in the (H, C, Q) strides), batch, index views, the cache's row pad and offset, and the flags.


@register("chunk_cumsum")
def _chunk_cumsum_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import chunk_cumsum as cc
    from kernels.backend import USE_LIBDEVICE

    k = cc._chunk_cumsum_kernel
    s = req.shape
    H, Q = s.nheads, s.chunk_size
    for meta, bias, softplus, limit, nchunks in itertools.product(
            req.metadata_dtypes, req.dt_bias_options, req.softplus_options, req.dt_limit_options,
            representatives(lambda c: c * Q)):
        ws = _strides((H, nchunks, Q))
        yield WarmupSpec(k, dict(
            dt_ptr=pointer(torch.float32), A_ptr=pointer(torch.float32), dt_bias_ptr=pointer(torch.float32),
            cu_chunk_seqlens_ptr=pointer(meta), dt_out_ptr=pointer(torch.float32),
            dA_cumsum_ptr=pointer(torch.float32), nheads=H, chunk_size=Q,
            dt_min=0.0 if not limit else 0.001, dt_max=float("inf") if not limit else 0.1,
            stride_dt_token=H, stride_dt_head=1, stride_A_head=1, stride_dt_bias_head=1 if bias else 0,
            stride_dt_out_head=ws[0], stride_dt_out_chunk=ws[1], stride_dt_out_pos=ws[2],
            stride_dA_cs_head=ws[0], stride_dA_cs_chunk=ws[1], stride_dA_cs_pos=ws[2],
            HAS_DT_BIAS=bias, DT_SOFTPLUS=softplus, HAS_DT_LIMIT=limit, LOG1P_LIBDEVICE=USE_LIBDEVICE,
            BLOCK_SIZE_H=cc.BLOCK_SIZE_H, BLOCK_SIZE_CHUNK=_next_pow2(Q),
        ), why=f"bias={bias} softplus={softplus} limit={limit} nchunks~{nchunks}")


@register("chunk_state")
def _chunk_state_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import chunk_state as cs
    from kernels.backend import DOT_FP32_OPERANDS, FP32_DOT_PRECISION

    s = req.shape
    H, P, N, G, Q = s.nheads, s.headdim, s.dstate, s.ngroups, s.chunk_size
    for io, meta, nchunks in itertools.product(req.io_dtypes, req.metadata_dtypes, representatives(lambda c: c * Q)):
        ws = _strides((H, nchunks, Q))
        x, b, st = _strides((1, H, P)), _strides((1, G, N)), _strides((nchunks, H, P, N))
        yield WarmupSpec(cs.chunk_state_kernel, dict(
            x_ptr=pointer(io), B_ptr=pointer(io), dt_ptr=pointer(torch.float32), dA_cumsum_ptr=pointer(torch.float32),
            cu_chunk_seqlens_ptr=pointer(meta), states_ptr=pointer(torch.float32),
            hdim=P, dstate=N, chunk_size=Q, nheads_per_group=H // G,
            stride_x_token=x[0], stride_x_head=x[1], stride_x_hdim=x[2],
            stride_B_token=b[0], stride_B_group=b[1], stride_B_dstate=b[2],
            stride_dt_head=ws[0], stride_dt_chunk=ws[1], stride_dt_pos=ws[2],
            stride_dA_cs_head=ws[0], stride_dA_cs_chunk=ws[1], stride_dA_cs_pos=ws[2],
            stride_states_chunk=st[0], stride_states_head=st[1], stride_states_hdim=st[2],
            stride_states_dstate=st[3],
            DOT_FP32_OPERANDS=DOT_FP32_OPERANDS, FP32_DOT_PRECISION=FP32_DOT_PRECISION,
        ), why=f"{io} nchunks~{nchunks}")


@register("bmm_chunk")
def _bmm_chunk_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import bmm_chunk as bc
    from kernels.backend import DOT_FP32_OPERANDS, FP32_DOT_PRECISION

    s = req.shape
    N, G, Q = s.dstate, s.ngroups, s.chunk_size
    for io, meta in itertools.product(req.io_dtypes, req.metadata_dtypes):
        cb, b = _strides((1, G, Q, Q)), _strides((1, G, N))  # (C, G, Q, Q): stride(0) does not depend on C
        yield WarmupSpec(bc.bmm_chunk_kernel, dict(
            C_ptr=pointer(io), B_ptr=pointer(io), cu_chunk_seqlens_ptr=pointer(meta), CB_ptr=pointer(torch.float32),
            dstate=N, chunk_size=Q,
            stride_C_token=b[0], stride_C_group=b[1], stride_C_dstate=b[2],
            stride_B_token=b[0], stride_B_group=b[1], stride_B_dstate=b[2],
            stride_CB_chunk=cb[0], stride_CB_group=cb[1], stride_CB_m=cb[2], stride_CB_n=cb[3],
            DOT_FP32_OPERANDS=DOT_FP32_OPERANDS, FP32_DOT_PRECISION=FP32_DOT_PRECISION,
        ), why=f"{io}")


@register("chunk_scan")
def _chunk_scan_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import chunk_scan as csc
    from kernels.backend import DOT_FP32_OPERANDS, FP32_DOT_PRECISION

    s = req.shape
    H, P, N, G, Q = s.nheads, s.headdim, s.dstate, s.ngroups, s.chunk_size
    for io, state, meta, d_kind, has_z, path, nchunks in itertools.product(
            req.io_dtypes, req.state_dtypes, req.metadata_dtypes, req.d_kinds, req.z_options, req.paths,
            representatives(lambda c: c * Q)):
        ws = _strides((H, nchunks, Q))
        cb, x, c = _strides((1, G, Q, Q)), _strides((1, H, P)), _strides((1, G, N))
        st = _strides((1, H, P, N))
        snapshot = path == "snapshot"  # dense initial states (gathered, fresh); indexed: entering states only
        init = st if snapshot else (0, 0)
        d = {"none": (0, 0), "per_head": (1, 0), "per_channel": (P, 1)}[d_kind]
        yield WarmupSpec(csc.chunk_scan_kernel, dict(
            CB_ptr=pointer(torch.float32), x_ptr=pointer(io), z_ptr=pointer(io), out_ptr=pointer(io),
            dt_ptr=pointer(torch.float32), dA_cumsum_ptr=pointer(torch.float32), seq_idx_ptr=pointer(meta),
            C_ptr=pointer(io), states_ptr=pointer(state),
            D_ptr=pointer(torch.float32), initial_states_ptr=pointer(state), cu_chunk_seqlens_ptr=pointer(meta),
            prev_chunk_offset=1 if snapshot else 0, has_initial_states=int(snapshot), chunk_size=Q, hdim=P, dstate=N, nheads_per_group=H // G,
            stride_CB_chunk=cb[0], stride_CB_group=cb[1], stride_CB_m=cb[2], stride_CB_k=cb[3],
            stride_x_token=x[0], stride_x_head=x[1], stride_x_hdim=x[2],
            **dict(zip(("stride_z_token", "stride_z_head", "stride_z_hdim"), x if has_z else (0, 0, 0))),
            stride_out_token=x[0], stride_out_head=x[1], stride_out_hdim=x[2],
            stride_dt_head=ws[0], stride_dt_chunk=ws[1], stride_dt_pos=ws[2],
            stride_dA_cs_head=ws[0], stride_dA_cs_chunk=ws[1], stride_dA_cs_pos=ws[2],
            stride_C_token=c[0], stride_C_group=c[1], stride_C_dstate=c[2],
            stride_states_chunk=st[0], stride_states_head=st[1], stride_states_hdim=st[2],
            stride_states_dstate=st[3],
            stride_init_batch=init[0], stride_init_head=init[1],
            stride_D_head=d[0], stride_D_hdim=d[1],
            HAS_D=d_kind != "none", HAS_Z=has_z,
            DOT_FP32_OPERANDS=DOT_FP32_OPERANDS, FP32_DOT_PRECISION=FP32_DOT_PRECISION,
            BLOCK_SIZE_DSTATE=csc.dstate_block(N),
        ), why=f"{io} io, {state} states, D {d_kind}, z={has_z}, {path}, nchunks~{nchunks}")


@register("state_passing")
def _state_passing_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    """Snapshot path only (the indexed path has its own kernel). ssd_prefill always passes the dense initial
    states (zeros where masked), so HAS_INIT is True; the writeback target depends on the mode."""
    from kernels import state_passing as sp

    k = sp._state_passing_kernel
    if "snapshot" not in req.paths:
        return
    s = req.shape
    H, P, N, Q = s.nheads, s.headdim, s.dstate, s.chunk_size
    dim, row = P * N, H * P * N
    # nchunks is an argument (its own class, unless the kernel does not specialize it) and a factor of the dA strides
    # (always specialized): prune only by the classes of both.
    nchunks_param = _param(k, "nchunks")
    own = (lambda c: 0) if nchunks_param.do_not_specialize else (lambda c: c)
    counts = representatives(lambda c: c * Q, own)
    for state, meta, mode, nchunks in itertools.product(req.state_dtypes, req.metadata_dtypes, req.modes, counts):
        ws = _strides((H, nchunks, Q))
        if mode == "direct":  # the user's cache and final slots
            targets = ((pointer(state, cache_aligned), row + pad, final, final_stride)
                       for cache_aligned in ALIGNMENTS for pad in representatives(lambda p: row + p, candidates=range(17))
                       for final, final_stride in _index_views(k, "final_idx_ptr", "stride_final_idx", req))
        elif mode == "returned":  # a fresh (Bt, H, P, N) result and an int64 arange of slots
            targets = [(pointer(state), row, pointer(torch.int64), 1)]
        else:  # checkpoint: nothing written; placeholders are the workspace and seq_idx
            targets = [(pointer(state), row, pointer(meta), 1)]
        for cache, cache_stride, final, final_stride in targets:
            yield WarmupSpec(k, dict(
                states_ptr=pointer(torch.float32), out_ptr=pointer(state), dA_cs_ptr=pointer(torch.float32),
                init_ptr=pointer(state), seq_idx_ptr=pointer(meta), cache_ptr=cache, final_idx_ptr=final,
                last_chunk_ptr=pointer(meta),
                dim=dim, nchunks=nchunks, chunk_size=Q,
                stride_states_chunk=row, stride_states_head=dim, stride_out_chunk=row, stride_out_head=dim,
                stride_dA_head=ws[0], stride_dA_chunk=ws[1], stride_dA_q=ws[2],
                stride_init_batch=row, stride_init_head=dim, stride_seq_idx=1,
                stride_cache_slot=cache_stride, stride_cache_head=dim,
                stride_final_idx=final_stride, stride_last_chunk=1,
                HAS_INIT=True, WRITE_CACHE=mode != "checkpoint",
            ), why=f"{state} {mode}, nchunks~{nchunks}")


# ---- entry point (``python -m harness warmup``) ---------------------------------------------------------------------


def requests_from_cases(cases: Iterable[Any]) -> list[tuple[ModelShape, tuple, tuple, dict]]:
    """(shape, io dtypes, state dtypes, request options) per distinct (shape, dtypes, D/z/dt_bias/softplus/dt_limit)
    of ``cases`` (harness.cases.model.Case). Paths, modes and index classes stay complete: a check may call a case
    on either path and in a mode other than its own, but never with other options or dtypes."""
    groups: dict[tuple, None] = {}
    for c in cases:
        sh, o = c.shape, c.options
        shape = ModelShape(sh.nheads, sh.headdim, sh.dstate, sh.ngroups, sh.chunk_size)
        has_limit = tuple(o.dt_limit) != (0.0, math.inf)
        groups[(shape, c.dtype.io_torch, c.dtype.state_torch, o.D, o.z, o.dt_bias, o.dt_softplus, has_limit)] = None
    return [(shape, (io,), (state,), dict(d_kinds=(d,), z_options=(z,), dt_bias_options=(bias,),
                                          softplus_options=(softplus,), dt_limit_options=(limit,)))
            for shape, io, state, d, z, bias, softplus, limit in groups]


_DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness warmup``: compile (GPU) or key (interpreter) every specialization the SSD path needs for
    the shapes of a case corpus (or one ``--shape``), print the time and the number of specializations.

    The backend is the one the kernels were imported for (``harness.backend.configure`` runs before); ``--device``
    only checks it. Exit status 0; 2 on bad arguments.
    """
    import argparse

    from triton import knobs

    parser = argparse.ArgumentParser(prog="python -m harness warmup", description=main.__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=["cases"], help="case files or directories (default: cases)")
    parser.add_argument("--shape", help="one model shape instead of the cases: nheads,headdim,dstate,ngroups,chunk")
    parser.add_argument("--io", nargs="+", choices=sorted(_DTYPE_NAMES), help="io dtypes (with --shape)")
    parser.add_argument("--state", nargs="+", choices=sorted(_DTYPE_NAMES), help="state dtypes (with --shape)")
    parser.add_argument("--kernels", nargs="+", choices=registered(), help="registrations to warm (default all)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--verbose", action="store_true", help="list every specialization")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="compile in N processes first (each a share, into the Triton disk cache), then load "
                             "everything here (GPU only; default 1)")
    parser.add_argument("--part", default=None, metavar="K/N",
                        help="compile only every N-th specialization from the K-th (0-based; to split by hand)")
    args = parser.parse_args(argv)
    part = None
    if args.part:
        try:
            k, n = (int(v) for v in args.part.split("/"))
        except ValueError:
            k, n = -1, 0
        if not 0 <= k < n:
            parser.error(f"--part: expected K/N with 0 <= K < N, found {args.part!r}")
        part = (k, n)
    if args.jobs < 1:
        parser.error(f"--jobs: expected a positive count, found {args.jobs}")

    device = "cpu" if knobs.runtime.interpret else "cuda"
    if args.device not in ("auto", device):
        parser.error(f"--device {args.device}: kernels were imported for {device} (set it before importing kernels)")
    if args.shape:
        try:
            shape = ModelShape(*(int(v) for v in args.shape.split(",")))
        except (TypeError, ValueError):
            parser.error(f"--shape: expected nheads,headdim,dstate,ngroups,chunk_size; found {args.shape!r}")
        io = tuple(_DTYPE_NAMES[d] for d in (args.io or _DTYPE_NAMES))
        state = tuple(_DTYPE_NAMES[d] for d in (args.state or _DTYPE_NAMES))
        requests = [(shape, io, state)]
    else:
        from harness.cases.loader import load_cases

        requests = requests_from_cases(load_cases(args.paths))
        if not requests:
            parser.error(f"no cases under {args.paths}")
    report = warmup_all(device, requests, kernels=args.kernels, part=part, jobs=args.jobs)
    shapes = len({r[0] for r in requests})
    print(f"{report.summary()} over {shapes} model shape(s), {len(requests)} option set(s) on {device}")
    if device == "cpu":
        print("(interpreter: nothing compiles; the keys are what the GPU would compile, and what the CPU guard "
              "compares launches against)")
    if args.verbose:
        for k in report.keys:
            print("  " + k.describe())
    return 0
