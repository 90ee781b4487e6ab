"""Compile-only warmup registry: every specialization the SSD path can need, compiled at startup (docs/checks.md).

Triton compiles one binary per *specialization* of a kernel's arguments (``kernels.specialization``): pointer
dtype and 16-byte alignment, int == 1 / multiple of 16 / other, constexpr values, launch options. Which classes a
real call produces is decided by Mamba2 metadata, not by the model: index tensors are int32 or int64; they are
contiguous (stride 1) or block-table columns ``bt[rows_before:, j]`` (stride = columns: a multiple of 16 or not),
and such a column's pointer is 16-byte aligned only when ``(rows_before * columns + j) * itemsize % 16 == 0``
(docs/exactness.md); the state cache has a padded row stride and a storage offset; the batch and chunk counts vary.

Each kernel registers here the tensors it can see, as stand-ins on the meta device (a real call's shapes and
strides, an address that is aligned or not, no storage), and passes them through its launcher's own
``launch_arguments``: the registry and the launcher derive the kernel's arguments from the same description, so they
cannot drift apart. ``plan`` enumerates the classes, computes every specialization key and keeps each distinct key
once; ``warmup_all`` compiles the plan with ``JITFunction.warmup`` (nothing launches), in this process unless the
caller passes another compile strategy (the harness compiles in child processes and shares work between test
workers), and returns the keys, which a recompile guard then holds real calls to. ``warmup_models`` is the same for
model configurations: ``kernels:provider``'s warmup hook (docs/provider.md#optional-hooks).

A kernel that reads an argument only as a scalar leaves it unspecialized (its module's ``SCALAR_ONLY``, passed to
``@triton.jit``): every specialized class multiplies the binaries. The registry does not depend on that decision:
it reads the decorator flags to skip classes that cannot matter, and deduplicates by key.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from kernels.backend import LAUNCH_OPTIONS
from kernels.interface import INDEX_DTYPES
from kernels.plan import PAIR_FROM_CHUNKS
from kernels.specialization import SpecKey, base_jit_function, gpu_view, kernel_name, specialization_key
from kernels.triton_internals import MockTensor
from kernels.tuned_configs import chunk_count_class

# The three value classes Triton specializes a non-constexpr int on, by a representative value.
INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER = 1, 16, 3
INDEX_STRIDES = (INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER)  # contiguous, block table with 16k / other columns
COUNT_CLASSES = (INT_ONE, INT_MULTIPLE_OF_16, INT_OTHER)  # batch, nchunks
# nchunks / batch / pad values tried for a count that enters ints as a*n + b: 1..16 cover every residue mod 16 and
# 17 is "== 1 mod 16 but not 1"; ``representatives`` keeps one value per distinct tuple of classes.
COUNT_CANDIDATES = tuple(range(1, 18))
ALIGNMENTS = (True, False)


class UnalignedPointer:
    """A pointer argument whose address is not a multiple of 16 (Triton's ``MockTensor`` claims address 0)."""

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
    """What a tensor argument is to Triton's specialization: its dtype and whether its address is 16-byte aligned."""
    return MockTensor(dtype) if aligned else UnalignedPointer(dtype)


def standin(shape: Sequence[int], dtype: torch.dtype, *, strides: Sequence[int] | None = None,
            aligned: bool = True) -> torch.Tensor:
    """A tensor on the meta device (no storage) with a real call's shape and strides, for ``launch_arguments``. Its
    address is 0, or one element further when not ``aligned`` (itemsize 1..8 bytes: never a multiple of 16)."""
    strides = tuple(strides) if strides is not None else contiguous_strides(shape)
    offset = 0 if aligned else 1
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    return torch.empty(offset + extent, dtype=dtype, device="meta").as_strided(tuple(shape), strides, offset)


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


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
    # What ssd_prefill may be called with. Defaults: every option a call can take; a server that knows its model's
    # options narrows them. Metadata tensors are int32 as vLLM makes them.
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
    """One specialization: the kernel object the launcher calls and its arguments by parameter name (tensors as
    pointer stand-ins)."""

    kernel: Any
    arguments: dict = field(hash=False)
    why: str = ""


def spec_for(kernel: Any, arguments: dict, why: str = "") -> WarmupSpec:
    """A spec from ``launch_arguments`` output: each tensor reduced to what Triton specializes it on."""
    reduced = {name: pointer(v.dtype, v.data_ptr() % 16 == 0) if isinstance(v, torch.Tensor) else v
               for name, v in arguments.items()}
    return WarmupSpec(kernel, reduced, why)


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
    from kernels import (
        bmm_chunk,
        chunk_cumsum,
        chunk_cumsum_gather,
        chunk_scan,
        chunk_state,
        chunk_state_bmm,
        chunk_state_passing,
        gather,
        state_passing_batched,
        state_passing_indexed,
    )

    return [gather._gather_initial_states_kernel, state_passing_indexed._state_passing_indexed_kernel,
            chunk_cumsum.chunk_cumsum_kernel, chunk_state.chunk_state_kernel, bmm_chunk.bmm_chunk_kernel,
            chunk_state_bmm._chunk_state_bmm_kernel, chunk_cumsum_gather._chunk_cumsum_gather_kernel,
            chunk_scan.chunk_scan_kernel,
            state_passing_batched._state_passing_batched_kernel, chunk_state_passing._chunk_state_passing_kernel]


def _split_arguments(kernel: Any, arguments: dict) -> tuple[tuple, dict]:
    """The runtime arguments before the first constexpr parameter, positionally (``Autotuner`` names them by
    position, as a launch does), and every later argument by name (a constexpr such as chunk_scan's dimensions may
    sit among runtime ones), then the launch options (``kernels.backend.LAUNCH_OPTIONS``) by name, last, as the
    launchers pass them.

    Raises KeyError naming every parameter the registration forgot (the kernel gained an argument), and
    TypeError for names the kernel does not have (the kernel renamed one)."""
    view = base_jit_function(kernel)
    names = list(view.arg_names)
    tuned = set()
    for cfg in getattr(kernel, "configs", ()) if len(getattr(kernel, "configs", ())) > 0 else ():
        tuned.update(cfg.kwargs)
    unknown = set(arguments) - set(names) - set(LAUNCH_OPTIONS)
    if unknown:
        raise TypeError(f"{kernel_name(kernel)}: warmup passes unknown parameters {sorted(unknown)}")
    annotations = getattr(view.fn, "__annotations__", {})
    is_constexpr = {n: "constexpr" in str(annotations.get(n, "")) for n in names}
    missing = [n for n in names if n not in arguments and n not in tuned]
    if missing:
        raise KeyError(f"{kernel_name(kernel)}: warmup registration lacks parameters {missing}")
    first_constexpr = next((i for i, n in enumerate(names) if is_constexpr[n]), len(names))
    args = tuple(arguments[n] for n in names[:first_constexpr])
    by_name = {n: arguments[n] for n in names[first_constexpr:] if n in arguments}
    # In the launcher's order: a launch's key string depends on the order of its options.
    by_name.update((n, v) for n, v in arguments.items() if n in LAUNCH_OPTIONS)
    return args, by_name


def _configs(kernel: Any, args: tuple, kwargs: dict) -> list[dict]:
    """The launch kwargs per config that ``Autotuner.warmup``/``run`` would add (one empty dict if not tuned)."""
    if not hasattr(kernel, "configs") or len(kernel.configs) <= 1:
        return [kernel.configs[0].all_kwargs()] if hasattr(kernel, "configs") else [{}]
    kernel.nargs = dict(zip(kernel.arg_names, args, strict=False))  # args may end before the kwargs-passed ones
    try:
        return [c.all_kwargs() for c in kernel.prune_configs(kwargs)]
    finally:
        kernel.nargs = None


def spec_keys(spec: WarmupSpec) -> list[SpecKey]:
    """The keys of every binary the spec compiles (one per config the autotuner keeps for it)."""
    args, kwargs = _split_arguments(spec.kernel, spec.arguments)
    return [specialization_key(spec.kernel, args, {**kwargs, **cfg}) for cfg in _configs(spec.kernel, args, kwargs)]


def compile_spec(spec: WarmupSpec) -> None:
    """Compile (or load from Triton's disk cache) every binary of ``spec`` in this process; nothing launches."""
    args, kwargs = _split_arguments(spec.kernel, spec.arguments)
    spec.kernel.warmup(*args, grid=(1,), **kwargs)


@dataclass(frozen=True)
class PlannedSpec:
    spec: WarmupSpec
    keys: list[SpecKey]  # every binary the spec compiles
    new: list[SpecKey]  # those no earlier spec of the plan compiles


def plan(requests: Iterable[tuple], names: Iterable[str] | None = None) -> tuple[list[PlannedSpec], int]:
    """Every spec of ``requests`` (each ``(shape, io dtypes, state dtypes[, WarmupRequest options])``) that adds a
    specialization not seen before, in registry order, for the registrations ``names`` (default all); and the
    number of class combinations enumerated. The plan is the same in every process that plans the same requests.
    Shapes enter keys only through their int classes and the block-size constexprs, so one class needed by two
    shapes is one binary."""
    names = registered() if names is None else list(names)
    unknown = [n for n in names if n not in _REGISTRY]
    if unknown:
        raise KeyError(f"warmup: no registration named {unknown}; registered: {registered()}")
    seen: set[tuple[str, str]] = set()
    todo: list[PlannedSpec] = []
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
                    todo.append(PlannedSpec(spec, keys, new))
    return todo, enumerated


def compile_order(n: int, first: float = 0.0, part: tuple[int, int] | None = None) -> list[int]:
    """Indices of ``n`` specs in the order to compile them: rotated to start at fraction ``first`` of the list (so
    processes warming the same request at once start on different specs and find the rest in the shared disk
    cache instead of compiling them all twice), and with ``part=(k, count)`` only every count-th spec from k (one
    of count parallel warmup processes)."""
    start = int(n * first) % n if n else 0
    order = list(range(start, n)) + list(range(start))
    if part is not None:
        k, count = part
        order = [i for i in order if i % count == k]
    return order


# How a plan is compiled on the GPU: called with the plan and the indices to compile, in order.
CompileStrategy = Callable[[list[PlannedSpec], list[int]], None]


def compile_in_process(planned: list[PlannedSpec], order: list[int]) -> None:
    for i in order:
        compile_spec(planned[i].spec)


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
                f"{self.compiled} compiled in {self.seconds:.2f}s{self.how()} ({kinds})")

    def how(self) -> str:
        """What a compile strategy adds to the summary (nothing for the in-process one)."""
        return ""


def warmup_all(device: str, requests: Iterable[tuple], *, kernels: Iterable[str] | None = None, first: float = 0.0,
               part: tuple[int, int] | None = None, compile: CompileStrategy = compile_in_process) -> WarmupReport:
    """Compile (``device`` "cuda") or only key ("cpu": the interpreter compiles nothing, though every spec still
    passes through Triton's warmup entry) every specialization of ``requests`` (see ``plan``) for the
    registrations ``kernels`` (default all). ``first`` and ``part``: see ``compile_order``; the report's ``keys``
    always list every specialization of the plan."""
    start = time.perf_counter()
    planned, enumerated = plan(requests, kernels)
    order = compile_order(len(planned), first, part)
    # Under the interpreter Triton's warmup entry compiles nothing, but the specs still pass through it, so that
    # whoever watches jit functions' runs (the recompile guard, harness.triton_launches) sees what was warmed.
    compile(planned, order)
    compiled = sum(len(planned[i].new) for i in order) if device == "cuda" else 0
    keys = [k for p in planned for k in p.new]
    per_kernel: dict[str, int] = {}
    for k in keys:
        per_kernel[k.kernel] = per_kernel.get(k.kernel, 0) + 1
    return WarmupReport(keys, compiled, time.perf_counter() - start, per_kernel, enumerated)


def warmup(device: str, shape: ModelShape, io_dtypes: Sequence[torch.dtype], state_dtypes: Sequence[torch.dtype], *,
           kernels: Iterable[str] | None = None, **request: Any) -> WarmupReport:
    """``warmup_all`` for one request; ``request``: further ``WarmupRequest`` fields (``index_dtypes``,
    ``index_strides``, ``index_alignments``, ``mask_dtypes``, ...)."""
    return warmup_all(device, [(shape, tuple(io_dtypes), tuple(state_dtypes), request)], kernels=kernels)


# ---- the provider's warmup hook ------------------------------------------------------------------------------------
# ``kernels:provider.warmup(requests)`` (docs/provider.md#optional-hooks) takes model configurations, plain values
# read by attribute (the harness's ``ModelConfig``): nheads, headdim, dstate, ngroups, chunk_size, io_dtype,
# state_dtype, D ("none" / "per_head" / "per_channel"), z, dt_bias, dt_softplus, dt_limit.


def model_request(config: Any) -> tuple[ModelShape, tuple, tuple, dict]:
    """The registry request of one model configuration: its shape, dtypes and options, with every path, final-state
    mode, index dtype and layout class and cache layout class (what a server learns only per call)."""
    shape = ModelShape(config.nheads, config.headdim, config.dstate, config.ngroups, config.chunk_size)
    has_limit = tuple(config.dt_limit) != (0.0, math.inf)
    return (shape, (config.io_dtype,), (config.state_dtype,),
            dict(d_kinds=(config.D,), z_options=(bool(config.z),), dt_bias_options=(bool(config.dt_bias),),
                 softplus_options=(bool(config.dt_softplus),), dt_limit_options=(has_limit,)))


@dataclass
class _HookCompile:
    compile: CompileStrategy = compile_in_process
    first: float = 0.0


_hook_compile = _HookCompile()


@contextlib.contextmanager
def hook_compiles_with(compile: CompileStrategy, first: float = 0.0) -> Iterator[None]:
    """Inside the block, ``warmup_models`` compiles with ``compile`` starting at fraction ``first`` of its plan (a
    caller that runs many warming processes at once shares their compiles this way); it changes how, never what."""
    global _hook_compile
    saved, _hook_compile = _hook_compile, _HookCompile(compile, first)
    try:
        yield
    finally:
        _hook_compile = saved


def warmup_models(configs: Iterable[Any]) -> WarmupReport:
    """The warmup hook: every specialization the registrations can need for these model configurations, compiled
    on the GPU (nothing launches) or passed through Triton's warmup entry under the interpreter."""
    from triton import knobs

    requests = list({repr(r): r for r in map(model_request, configs)}.values())
    device = "cpu" if knobs.runtime.interpret else "cuda"
    return warmup_all(device, requests, first=_hook_compile.first, compile=_hook_compile.compile)


# ---- class derivation ---------------------------------------------------------------------------------------------
# The enumeration is pruned by what each kernel specializes (its ``do_not_specialize`` /
# ``do_not_specialize_on_alignment`` lists, read from the jit object), so the registry is right whatever the
# decorators say and enumerates fewer combinations where they switch classes off; the final word is the key dedup.


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
    for p in gpu_view(kernel).params:
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


def _index_views(kernel: Any, ptr: str, stride: str, req: WarmupRequest,
                 dtypes: tuple[torch.dtype, ...] | None = None) -> Iterator[torch.Tensor]:
    """Stand-ins of a user index tensor (or, with ``dtypes``, a mask's): contiguous or a block-table column (any
    stride class, aligned or not), in every index dtype; classes the kernel does not specialize ``ptr`` or
    ``stride`` on are skipped."""
    for dtype, aligned, st in itertools.product(dtypes or req.index_dtypes,
                                                alignments(kernel, ptr, req.index_alignments),
                                                int_values(kernel, stride, req.index_strides)):
        yield standin((1,), dtype, strides=(st,), aligned=aligned)


def _cache(state: torch.dtype, shape: ModelShape, pad: int, aligned: bool) -> torch.Tensor:
    """A paged state cache: two slots of compact (H, P, N) rows padded by ``pad`` elements, aligned or not."""
    H, P, N = shape.nheads, shape.headdim, shape.dstate
    return standin((2, H, P, N), state, strides=(H * P * N + pad, P * N, N, 1), aligned=aligned)


# ---- registrations ------------------------------------------------------------------------------------------------
# The kernels' inputs x, dt, B, C, z, D, dt_bias, A and out are fresh contiguous tensors (aligned, strides from the
# shape), as vLLM's packed varlen layout gives them; workspaces are allocated by the launchers, in the shapes used
# here. What varies per call: nchunks (in the (H, C, Q) strides), index views, the cache's row pad and offset, the
# flags. Token and batch counts do not enter any argument's class (only grids), so the stand-ins use one of each.

F32 = torch.float32


@register("gather")
def _gather_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    """Every cache layout (aligned or offset, rows padded to a multiple of 16 or not) and index view, of the classes
    the kernel specializes (``kernels.gather.SCALAR_ONLY``)."""
    from kernels import gather

    k = gather._gather_initial_states_kernel
    s = req.shape
    for state, (cache_aligned, pad) in itertools.product(
            req.state_dtypes, _cache_layouts(k, s, (("cache_ptr", "stride_cache_slot"),))):
        for idx, has in itertools.product(_index_views(k, "idx_ptr", "stride_idx", req),
                                          _index_views(k, "has_ptr", "stride_has", req, req.mask_dtypes)):
            arguments = gather.launch_arguments(_cache(state, s, pad, cache_aligned), idx, has,
                                                standin((1, s.nheads, s.headdim, s.dstate), state))
            yield spec_for(k, arguments, why=f"{state} cache, {idx.dtype} index stride {idx.stride(0)}")


@register("chunk_cumsum_gather")
def _chunk_cumsum_gather_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    """The snapshot path's cumsum with the gather's copy in one kernel (``kernels.plan``: gather "in_cumsum"), for
    the caches it runs on (``kernels.chunk_cumsum_gather.fuses``: aligned rows; the two kernels elsewhere)."""
    from kernels import chunk_cumsum_gather as ccg

    if "snapshot" not in req.paths:
        return
    s = req.shape
    H, Q = s.nheads, s.chunk_size
    kernel = ccg._chunk_cumsum_gather_kernel
    pad = -(H * s.headdim * s.dstate) % 16  # the one class of row stride it runs on: a multiple of 16
    for state, meta, bias, softplus, limit, nchunks in itertools.product(
            req.state_dtypes, req.metadata_dtypes, req.dt_bias_options, req.softplus_options, req.dt_limit_options,
            representatives(lambda c: c * Q)):
        cache = _cache(state, s, pad, aligned=True)
        assert ccg.fuses(cache)
        for idx, has in itertools.product(_index_views(kernel, "idx_ptr", "stride_idx", req),
                                          _index_views(kernel, "has_ptr", "stride_has", req, req.mask_dtypes)):
            arguments = ccg.launch_arguments(
                standin((1, H), F32), standin((H,), F32), standin((nchunks + 1,), meta),
                standin((H, nchunks, Q), F32), standin((H, nchunks, Q), F32), cache, idx, has,
                standin((1, H, s.headdim, s.dstate), state),
                dt_bias=standin((H,), F32) if bias else None, dt_softplus=softplus,
                dt_limit=(0.001, 0.1) if limit else (0.0, math.inf))
            yield spec_for(kernel, arguments, why=f"{state} cache, {idx.dtype} index, bias={bias} "
                                                  f"softplus={softplus} limit={limit} nchunks~{nchunks}")


@register("state_passing_indexed")
def _state_passing_indexed_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    """Every cache layout and slot or mask view, of the classes the kernel specializes
    (``kernels.state_passing_indexed.SCALAR_ONLY``)."""
    from kernels import state_passing_indexed as spi

    k = spi._state_passing_indexed_kernel
    s = req.shape
    H, P, N, Q = s.nheads, s.headdim, s.dstate, s.chunk_size
    for ((cache_aligned, pad), state, idx_dtype, init_aligned, final_aligned, mask_dtype, has_aligned,
         nchunks) in itertools.product(_cache_layouts(k, s, (("cache_ptr", "stride_cache_slot"),)),
                                       req.state_dtypes, req.index_dtypes,
                                       alignments(k, "init_slot_ptr", req.index_alignments),
                                       alignments(k, "final_slot_ptr", req.index_alignments), req.mask_dtypes,
                                       alignments(k, "has_init_ptr", req.index_alignments),
                                       COUNT_CLASSES):
        arguments = spi.launch_arguments(
            standin((nchunks, H, P, N), F32), standin((H, nchunks, Q), F32),
            state_cache=_cache(state, s, pad, cache_aligned),
            init_slot_index=standin((1,), idx_dtype, aligned=init_aligned),
            has_initial_state=standin((1,), mask_dtype, aligned=has_aligned),
            final_slot_index=standin((1,), idx_dtype, aligned=final_aligned),
            out=standin((nchunks, H, P, N), state))
        yield spec_for(k, arguments, why=f"{state} cache, {idx_dtype} slots, {nchunks} chunks")


@register("chunk_cumsum")
def _chunk_cumsum_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import chunk_cumsum as cc

    s = req.shape
    H, Q = s.nheads, s.chunk_size
    for meta, bias, softplus, limit, nchunks in itertools.product(
            req.metadata_dtypes, req.dt_bias_options, req.softplus_options, req.dt_limit_options,
            representatives(lambda c: c * Q)):
        arguments = cc.launch_arguments(
            standin((1, H), F32), standin((H,), F32), standin((nchunks + 1,), meta),
            standin((H, nchunks, Q), F32), standin((H, nchunks, Q), F32),
            dt_bias=standin((H,), F32) if bias else None, dt_softplus=softplus,
            dt_limit=(0.001, 0.1) if limit else (0.0, math.inf))
        yield spec_for(cc.chunk_cumsum_kernel, arguments,
                       why=f"bias={bias} softplus={softplus} limit={limit} nchunks~{nchunks}")


@register("chunk_state")
def _chunk_state_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    """Either path's on calls of many chunks (``kernels.plan.states_pair``), where chunk state's and bmm's configs
    cannot share a kernel, and the unfused plan's (``kernels.plan``)."""
    from kernels import chunk_state as cs

    s = req.shape
    H, P, N, G, Q = s.nheads, s.headdim, s.dstate, s.ngroups, s.chunk_size
    for io, meta, nchunks in itertools.product(req.io_dtypes, req.metadata_dtypes, _counts_per_config_class(Q)):
        arguments = cs.launch_arguments(
            standin((1, G, N), io), standin((1, H, P), io), standin((H, nchunks, Q), F32),
            standin((H, nchunks, Q), F32), standin((nchunks + 1,), meta), standin((nchunks, H, P, N), F32))
        yield spec_for(cs.chunk_state_kernel, arguments, why=f"{io} nchunks~{nchunks}")


def _counts_per_config_class(Q: int) -> list[int]:
    """One chunk count per class of the (H, C, Q) strides and per chunk count class (chunk state's config depends
    on it: ``kernels.tuned_configs.chunk_count_class``)."""
    classes = sorted({chunk_count_class(c) for c in COUNT_CANDIDATES})
    return [n for cls in classes for n in representatives(
        lambda c: c * Q, candidates=[c for c in COUNT_CANDIDATES if chunk_count_class(c) == cls])]


@register("chunk_state_bmm")
def _chunk_state_bmm_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    """Chunk state's and bmm's programs in one kernel, where ``ssd_prefill`` runs chunk state: at the shapes where
    both stages' configs are fixed (``kernels.chunk_state_bmm.chunk_state_bmm_config``; none elsewhere)."""
    from kernels import chunk_state_bmm as csb

    s = req.shape
    H, P, N, G, Q = s.nheads, s.headdim, s.dstate, s.ngroups, s.chunk_size
    for io, meta, nchunks in itertools.product(req.io_dtypes, req.metadata_dtypes, _counts_per_config_class(Q)):
        config = csb.chunk_state_bmm_config(P, N, Q, nchunks)
        if config is None:
            continue
        tokens = standin((1, G, N), io)
        arguments = csb.launch_arguments(
            tokens, standin((1, H, P), io), tokens, standin((H, nchunks, Q), F32), standin((H, nchunks, Q), F32),
            standin((nchunks + 1,), meta), standin((nchunks, H, P, N), F32), standin((nchunks, G, Q, Q), F32),
            config)
        yield spec_for(csb._chunk_state_bmm_kernel, arguments, why=f"{io} nchunks~{nchunks}")


@register("bmm_chunk")
def _bmm_chunk_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import bmm_chunk as bc

    s = req.shape
    N, G, Q = s.dstate, s.ngroups, s.chunk_size
    for io, meta in itertools.product(req.io_dtypes, req.metadata_dtypes):
        # CB is (C, G, Q, Q): its strides do not depend on the chunk count.
        arguments = bc.launch_arguments(standin((1, G, N), io), standin((1, G, N), io), standin((2,), meta),
                                        standin((1, G, Q, Q), F32))
        yield spec_for(bc.bmm_chunk_kernel, arguments, why=f"{io}")


@register("chunk_scan")
def _chunk_scan_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    from kernels import chunk_scan as csc

    s = req.shape
    H, P, N, G, Q = s.nheads, s.headdim, s.dstate, s.ngroups, s.chunk_size
    D = {"none": None, "per_head": standin((H,), F32), "per_channel": standin((H, P), F32)}
    for io, state, meta, d_kind, has_z, path, nchunks in itertools.product(
            req.io_dtypes, req.state_dtypes, req.metadata_dtypes, req.d_kinds, req.z_options, req.paths,
            representatives(lambda c: c * Q)):
        snapshot = path == "snapshot"  # dense initial states (gathered, fresh); indexed: entering states only
        arguments = csc.launch_arguments(
            standin((1, G, Q, Q), F32), standin((1, H, P), io), standin((H, nchunks, Q), F32),
            standin((H, nchunks, Q), F32), standin((1, G, N), io), standin((nchunks, H, P, N), state),
            standin((nchunks + 1,), meta), standin((nchunks,), meta),
            out=standin((1, H, P), io), D=D[d_kind], z=standin((1, H, P), io) if has_z else None,
            initial_states=standin((1, H, P, N), state) if snapshot else None, states_are_entering=not snapshot)
        yield spec_for(csc.chunk_scan_kernel, arguments,
                       why=f"{io} io, {state} states, D {d_kind}, z={has_z}, {path}, nchunks~{nchunks}")


def _cache_layouts(kernel: Any, shape: ModelShape,
                   through: Sequence[tuple[str, str]]) -> list[tuple[bool, int]]:
    """(aligned, row pad) of the paged caches a kernel sees through its (pointer, row stride) parameters
    ``through``: aligned or offset where one of the pointers is specialized on alignment, one row pad per class of
    the row stride where one of the strides is specialized; otherwise one layout stands in for all."""
    row = shape.nheads * shape.headdim * shape.dstate
    aligned = sorted({a for ptr, _ in through for a in alignments(kernel, ptr, ALIGNMENTS)}, reverse=True)
    pads = representatives(lambda p: row + p, candidates=range(17))
    if all(_param(kernel, stride).do_not_specialize for _, stride in through):
        pads = pads[:1]
    return list(itertools.product(aligned, pads))


def _writeback_targets(kernel: Any, req: WarmupRequest, state: torch.dtype, mode: str,
                       through: Sequence[tuple[str, str]] = (("cache_ptr", "stride_cache_slot"),)) -> list[tuple]:
    """(cache, final slots) stand-ins a states kernel writes its final states through, in ``mode``: the user's
    cache and final slots (direct; the cache's layouts those the kernel specializes ``through``), a fresh
    (Bt, H, P, N) result and an int64 arange of slots (returned), or nothing (checkpoint: the launcher's
    placeholders stand in)."""
    s = req.shape
    if mode == "direct":
        return [(_cache(state, s, pad, aligned), final) for aligned, pad in _cache_layouts(kernel, s, through)
                for final in _index_views(kernel, "final_idx_ptr", "stride_final_idx", req)]
    if mode == "returned":
        return [(standin((1, s.nheads, s.headdim, s.dstate), state), standin((1,), torch.int64))]
    return [(None, None)]


@register("state_passing_batched")
def _state_passing_batched_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    """The snapshot path's state passing on calls of many chunks: dense initial states (fresh), the writeback
    target of each mode (as the fused kernel's), both loop shapes (the chunk and sequence counts choose one)."""
    from kernels import state_passing_batched as spb

    k = spb._state_passing_batched_kernel
    if "snapshot" not in req.paths:
        return
    s = req.shape
    H, P, N, Q = s.nheads, s.headdim, s.dstate, s.chunk_size
    for state, meta, nchunks, read_ahead, mode in itertools.product(
            req.state_dtypes, req.metadata_dtypes, representatives(lambda c: c * Q), (False, True), req.modes):
        for cache, final in _writeback_targets(k, req, state, mode):
            arguments = spb.launch_arguments(
                standin((nchunks, H, P, N), F32), standin((H, nchunks, Q), F32), standin((1,), meta),
                initial_states=standin((1, H, P, N), state), out=standin((nchunks, H, P, N), state),
                state_cache=cache, final_state_indices=final)
            yield spec_for(k, {**arguments, "READ_AHEAD_LOOP": read_ahead},
                           why=f"{state} states {mode}, nchunks~{nchunks}, read-ahead={read_ahead}")


@register("chunk_state_passing")
def _chunk_state_passing_specs(req: WarmupRequest) -> Iterator[WarmupSpec]:
    """The snapshot path's fused kernel: ssd_prefill always passes the dense initial states (zeros where masked);
    the writeback target depends on the mode. Also its teacher-forced mode, the provider's ``stages.state_passing``
    (``teacher_forced_tokens``, given chunk states, with or without a writeback); and the indexed path's calls of few
    chunks (``kernels.plan``): the initial state read from the cache by slot, entering states stored in the cache
    dtype, a direct writeback."""
    from kernels import chunk_state_passing as csp

    k = csp._chunk_state_passing_kernel
    s = req.shape
    H, P, N, G, Q = s.nheads, s.headdim, s.dstate, s.ngroups, s.chunk_size
    own = (lambda c: 0) if _param(k, "nchunks").do_not_specialize else (lambda c: c)
    counts = representatives(lambda c: c * Q, own)
    # The indexed path runs this kernel only on calls of fewer chunks than the pair's (``kernels.plan``).
    few = representatives(lambda c: c * Q, own, candidates=range(1, PAIR_FROM_CHUNKS))

    # By slot the cache is also read, through the initial state's pointer and row stride.
    by_slot = (("cache_ptr", "stride_cache_slot"), ("init_ptr", "stride_init_row"))

    if "indexed" in req.paths and "direct" in req.modes:
        for state, meta, nchunks, io in itertools.product(req.state_dtypes, req.metadata_dtypes, few,
                                                          req.io_dtypes):
            fp32 = standin((H, nchunks, Q), F32)
            for (cache, final), slot, has in itertools.product(
                    _writeback_targets(k, req, state, "direct", by_slot),
                    _index_views(k, "init_slot_ptr", "stride_init_slot", req),
                    _index_views(k, "has_init_ptr", "stride_has_init", req, req.mask_dtypes)):
                arguments = csp.launch_arguments(
                    standin((1, G, N), io), standin((1, H, P), io), fp32, fp32, standin((nchunks + 1,), meta),
                    standin((nchunks,), meta), out=standin((nchunks, H, P, N), state), state_cache=cache,
                    initial_state_indices=slot, has_initial_states=has, final_state_indices=final,
                    last_chunk_indices=standin((1,), meta))
                yield spec_for(k, arguments, why=f"{state} {io} indexed by slot, nchunks~{nchunks}")
    if "snapshot" not in req.paths:
        return
    for state, meta, nchunks in itertools.product(req.state_dtypes, req.metadata_dtypes, counts):
        fp32 = standin((H, nchunks, Q), F32)
        seq_idx = standin((nchunks,), meta)
        calls = []
        for io, mode in itertools.product(req.io_dtypes, req.modes):
            tokens = (standin((1, G, N), io), standin((1, H, P), io), standin((nchunks + 1,), meta))
            calls += [(f"{io} {mode}", tokens, target, None) for target in _writeback_targets(k, req, state, mode)]
        stand_in_tokens = csp.teacher_forced_tokens(nchunks, H, P, N, "meta")
        given = standin((nchunks, H, P, N), F32)
        calls += [("teacher-forced direct", stand_in_tokens, target, given)
                  for target in _writeback_targets(k, req, state, "direct")]
        calls += [("teacher-forced", stand_in_tokens, (None, None), given)]
        for what, (B, x, cu), (cache, final), chunk_states in calls:
            arguments = csp.launch_arguments(
                B, x, fp32, fp32, cu, seq_idx, out=standin((nchunks, H, P, N), state),
                initial_states=standin((1, H, P, N), state), state_cache=cache, final_state_indices=final,
                last_chunk_indices=None if final is None else standin((1,), meta), chunk_states=chunk_states,
                config=None if chunk_states is None else csp.teacher_forced_config(P, N, Q))
            yield spec_for(k, arguments, why=f"{state} {what}, nchunks~{nchunks}")
