"""``ssd_prefill``: the five SSD stages composed, with the snapshot / indexed dispatch (docs/provider.md).

Snapshot path: copy the initial states out of the cache first (fused Triton gather on CUDA, the same copy in
PyTorch ops elsewhere: ``kernels.gather``), then one kernel computes the chunk states and passes them on
(``kernels.chunk_state_passing``), writing the exiting state of every chunk into the workspace and, in direct mode,
the final states into the cache; from ``SNAPSHOT_PAIR_FROM`` chunks, chunk state and a state passing with a
program per sequence (``kernels.state_passing_batched``) do the same in two kernels, with the same bits. Chunk scan
reads the dense copy, so a final slot that is also an initial slot is safe to overwrite.

Indexed path (one sequence, direct writeback, no intermediate states, cache dtype == workspace dtype): no copy.
Chunk state, then state passing reads the initial state from the cache by slot index and stores each chunk's
*entering* state into the workspace; chunk scan reads only the workspace (``states_are_entering=True``), never the
cache after the writeback. Bit-identical to the snapshot path.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch

from kernels.bmm_chunk import bmm_chunk
from kernels.chunk_cumsum import chunk_cumsum
from kernels.chunk_cumsum_gather import chunk_cumsum_gather
from kernels.chunk_cumsum_gather import fuses as cumsum_gather_fuses
from kernels.chunk_scan import chunk_scan
from kernels.chunk_state import chunk_state
from kernels.chunk_state_bmm import chunk_state_bmm, chunk_state_bmm_config
from kernels.chunk_state_passing import chunk_state_passing
from kernels.environment import LAUNCH_ORDER_ENV
from kernels.gather import gather_initial_states, gather_initial_states_torch
from kernels.interface import CallShape, choose_gather, choose_path
from kernels.state_passing_batched import state_passing_batched
from kernels.state_passing_indexed import state_passing_indexed

# The launch orders (kernels/backend.py: a kernel that reads nothing the one before it writes runs beside it), each
# the set of what it does (``ORDER_FEATURES``; scripts/order_lab.py times them):
# - "bmm_beside": bmm beside the chunk state kernel (the fused kernel on the snapshot path), launched after it;
#   without it ("none") every kernel runs alone, bmm right after the cumsum;
# - "scan_early": the chunk scan's programs placed early behind the indexed state passing;
# - "gather_beside": the fused gather beside the cumsum;
# - "bmm_first": bmm launched before the chunk state kernel where chunk state runs as a kernel of its own (the
#   indexed path's, and the snapshot path's on calls of many chunks): bmm's programs are placed first and chunk
#   state's fill the slots around them, instead of bmm's waiting for chunk state's last partial wave and outlasting
#   it. Where the snapshot path runs its fused kernel, bmm stays after it: the fused kernel's few programs, each
#   walking every chunk, lost time placed behind bmm's (notes/gpu-runs.md);
# - "one_kernel": bmm's and chunk state's programs in one kernel, bmm's first (``kernels.chunk_state_bmm``), where
#   both stages' configs are fixed (elsewhere "bmm_first"): the same placement with one launch fewer;
# - "gather_in_cumsum": the fused gather's programs in the cumsum's kernel (``kernels.chunk_cumsum_gather``) where
#   the cache's rows are 16-byte aligned (elsewhere "gather_beside"), one launch fewer again;
# - "indexed_fused": the indexed path's calls of fewer than ``SNAPSHOT_PAIR_FROM`` chunks run the snapshot path's
#   kernels for such calls without the gather: the fused chunk state + state passing kernel, reading the initial
#   state from the cache by slot and storing entering states, then bmm beside it.
_STATE = frozenset({"bmm_beside"})
_GATHER = _STATE | {"gather_beside"}
_ONE_KERNEL = _GATHER | {"bmm_first", "one_kernel"}
ORDER_FEATURES: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "state": _STATE,
    "state-scan": _STATE | {"scan_early"},
    "state+gather": _GATHER,
    "bmm-first": _GATHER | {"bmm_first"},
    "one-kernel": _ONE_KERNEL,
    "cumsum-gather": _ONE_KERNEL | {"gather_in_cumsum"},
    "indexed-fused": _ONE_KERNEL | {"gather_in_cumsum", "indexed_fused"},
}
LAUNCH_ORDERS = tuple(ORDER_FEATURES)
SHIPPED_LAUNCH_ORDER = "cumsum-gather"


def launch_order_setting(raw: str | None) -> str:
    """``SSD_LAUNCH_ORDER``: unset or empty -> the shipped order, else one of ``LAUNCH_ORDERS``."""
    if not raw:
        return SHIPPED_LAUNCH_ORDER
    if raw not in LAUNCH_ORDERS:
        raise ValueError(f"{LAUNCH_ORDER_ENV}={raw!r}: expected one of {', '.join(LAUNCH_ORDERS)}")
    return raw


LAUNCH_ORDER = launch_order_setting(os.environ.get(LAUNCH_ORDER_ENV))


@contextlib.contextmanager
def launched_in_order(order: str):
    """``ssd_prefill`` launches in ``order`` inside the block (one of ``LAUNCH_ORDERS``): for the tests and labs
    that need the kernels another order launches, e.g. chunk state's own kernel where the shipped order runs it with
    bmm's programs."""
    global LAUNCH_ORDER
    saved, LAUNCH_ORDER = LAUNCH_ORDER, launch_order_setting(order)
    try:
        yield
    finally:
        LAUNCH_ORDER = saved


# From this many chunks in a call the snapshot path runs chunk state and the batched state passing
# (``kernels.state_passing_batched``) instead of the fused kernel, whose few programs each walk every chunk: alone,
# the pair won a 17-chunk call (47.6 against 52.6 us) and lost a 3-chunk one (11.5 against 10.6); in the whole
# 11-chunk mixed-3 call it took 80.9 us against 82.7 (notes/gpu-runs.md runs 110-115). The same bits either way.
SNAPSHOT_PAIR_FROM = 8


def snapshot_pair(nchunks: int) -> bool:
    """Whether the snapshot path of a call of ``nchunks`` chunks runs the pair (a shape, known without a device
    read)."""
    return nchunks >= SNAPSHOT_PAIR_FROM


def ssd_prefill(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int,
    cu_seqlens: torch.Tensor,
    cu_chunk_seqlens: torch.Tensor,
    last_chunk_indices: torch.Tensor,
    seq_idx: torch.Tensor,
    out: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    state_cache: torch.Tensor,
    initial_state_indices: torch.Tensor,
    has_initial_states: torch.Tensor,
    final_state_indices: torch.Tensor | None = None,
    return_intermediate_states: bool = False,
    path: str = "auto",
    state_dtype: torch.dtype | None = None,
    gather: str = "auto",
    workspace_out: dict | None = None,
) -> torch.Tensor | None:
    """Mamba2 SSD prefill over packed varlen sequences, writing ``out`` (T, H, P) in place.

    x (T, H, P), dt (T, H), A (H,) fp32, B, C (T, G, N), z (T, H, P) or None, D (H,) / (H, P) or None;
    varlen metadata cu_seqlens (Bt + 1,), cu_chunk_seqlens (C + 1,), last_chunk_indices (Bt,), seq_idx (C,), each
    int32/int64; state_cache (slots, H, P, N) (padded stride(0) and a storage offset allowed);
    initial_state_indices (Bt,) int32/int64, has_initial_states (Bt,) bool/int, final_state_indices (Bt,) or None,
    each possibly a strided view (negative final slot: write nothing).

    Modes: ``final_state_indices`` given -> direct writeback, returns None; None -> returns (Bt, H, P, N) final
    states in the cache dtype; ``return_intermediate_states`` -> checkpoint: returns (C, H, P, N) chunk-end states in
    the workspace dtype and writes nothing into the cache.

    Extensions beyond docs/provider.md (defaults keep its semantics): ``state_dtype`` is the workspace dtype (vLLM's
    name; default the cache dtype); ``gather`` picks the snapshot copy (``fused``/``torch``; ``auto``: fused on
    CUDA); ``workspace_out``, a dict, receives the chosen ``path``, ``gather`` and the intermediates
    (``states``: the (C, H, P, N) workspace, exiting states on the snapshot path and entering states on the indexed
    path; ``chunk_states``, where chunk state ran as a kernel of its own (the indexed path, and the snapshot path
    from ``SNAPSHOT_PAIR_FROM`` chunks), else None; ``chunk_state_bmm``, the config under which that kernel also ran
    bmm's tiles (``kernels.chunk_state_bmm``), else None; ``cumsum_gather``, whether the cumsum's kernel also ran
    the gather's copy (``kernels.chunk_cumsum_gather``); ``dA_cumsum``, ``dt_out``, ``initial_states``) for tests.
    """
    T, H, P = x.shape
    N = B.shape[-1]
    batch = initial_state_indices.shape[0]
    assert state_cache.dim() == 4 and tuple(state_cache.shape[1:]) == (H, P, N), (
        f"state_cache: expected (slots, {H}, {P}, {N}), found {tuple(state_cache.shape)}")
    assert tuple(has_initial_states.shape) == (batch,), (
        f"has_initial_states: expected ({batch},), found {tuple(has_initial_states.shape)}")
    assert final_state_indices is None or tuple(final_state_indices.shape) == (batch,), (
        f"final_state_indices: expected ({batch},), found {tuple(final_state_indices.shape)}")
    assert tuple(last_chunk_indices.shape) == (batch,), (
        f"last_chunk_indices: expected ({batch},), found {tuple(last_chunk_indices.shape)}")
    assert tuple(out.shape) == (T, H, P), f"out: expected ({T}, {H}, {P}), found {tuple(out.shape)}"
    assert tuple(cu_seqlens.shape) == (batch + 1,), (
        f"cu_seqlens: expected ({batch + 1},), found {tuple(cu_seqlens.shape)}")
    ws_dtype = state_cache.dtype if state_dtype is None else state_dtype
    call = CallShape(
        batch=batch,
        direct=final_state_indices is not None,
        intermediate=bool(return_intermediate_states),
        cache_dtype=state_cache.dtype,
        state_dtype=ws_dtype,
        on_cuda=x.is_cuda,
    )
    chosen = choose_path(path, call)
    copy = choose_gather(gather, call.on_cuda) if chosen == "snapshot" else None

    order = ORDER_FEATURES[LAUNCH_ORDER]
    nchunks = cu_chunk_seqlens.shape[0] - 1
    indexed_fused = "indexed_fused" in order and chosen == "indexed" and not snapshot_pair(nchunks)
    # chunk state as a kernel of its own, not in the fused kernel
    pair = snapshot_pair(nchunks) or (chosen == "indexed" and not indexed_fused)
    gather_in_cumsum = "gather_in_cumsum" in order and copy == "fused" and cumsum_gather_fuses(state_cache)
    gather_beside = "gather_beside" in order and copy == "fused" and not gather_in_cumsum
    one_kernel = chunk_state_bmm_config(P, N, chunk_size, nchunks) if "one_kernel" in order and pair else None
    bmm_first = "bmm_first" in order and pair and one_kernel is None
    bmm_after = "bmm_beside" in order and not bmm_first
    dt_options = dict(dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    if gather_in_cumsum:
        dA_cumsum, dt_out, initial_states = chunk_cumsum_gather(
            dt, A, chunk_size, cu_chunk_seqlens, state_cache, initial_state_indices, has_initial_states, **dt_options)
    else:
        dA_cumsum, dt_out = chunk_cumsum(dt, A, chunk_size, cu_chunk_seqlens, signal_next=gather_beside, **dt_options)
    CB = bmm_chunk(C, B, chunk_size, cu_chunk_seqlens) if "bmm_beside" not in order else None

    def chunk_states_beside_bmm(CB: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(chunk states, CB): chunk state as a kernel of its own, bmm's programs in it or bmm launched beside it
        as the order says."""
        if one_kernel is not None:
            return chunk_state_bmm(B, x, C, dt_out, dA_cumsum, cu_chunk_seqlens, one_kernel)
        if bmm_first:
            CB = bmm_chunk(C, B, chunk_size, cu_chunk_seqlens, signal_next=True)
        states = chunk_state(B, x, dt_out, dA_cumsum, cu_chunk_seqlens, signal_next=bmm_after,
                             overlaps_previous=bmm_first)
        if bmm_after:
            CB = bmm_chunk(C, B, chunk_size, cu_chunk_seqlens, overlaps_previous=True)
        return states, CB

    def fused_states_beside_bmm(CB: torch.Tensor | None, **states) -> torch.Tensor | None:
        """CB: the fused chunk state + state passing kernel into ``workspace`` (``states``: its initial states and
        writeback), then bmm beside it as the order says; the chunk states never leave the chip."""
        chunk_state_passing(B, x, dt_out, dA_cumsum, cu_chunk_seqlens, seq_idx, out=workspace, signal_next=bmm_after,
                            **states)
        if bmm_after:
            CB = bmm_chunk(C, B, chunk_size, cu_chunk_seqlens, overlaps_previous=True)
        return CB

    workspace = torch.empty((nchunks, H, P, N), dtype=ws_dtype, device=x.device)
    if chosen == "indexed":
        initial_states = None
        if indexed_fused:
            chunk_states = None
            CB = fused_states_beside_bmm(
                CB, state_cache=state_cache, initial_state_indices=initial_state_indices[:1],
                has_initial_states=has_initial_states[:1], final_state_indices=final_state_indices[:1],
                last_chunk_indices=last_chunk_indices[:1])
        else:
            chunk_states, CB = chunk_states_beside_bmm(CB)
            state_passing_indexed(
                chunk_states,
                dA_cumsum,
                state_cache=state_cache,
                init_slot_index=initial_state_indices[:1],
                has_initial_state=has_initial_states[:1],
                final_slot_index=final_state_indices[:1],
                out=workspace,
                signal_next="scan_early" in order,
            )
        result = None
    else:
        if copy == "torch":
            initial_states = gather_initial_states_torch(state_cache, initial_state_indices, has_initial_states)
        elif not gather_in_cumsum:  # the fused gather's own kernel, unless the cumsum's kernel made the copy
            initial_states = gather_initial_states(state_cache, initial_state_indices, has_initial_states,
                                                   overlaps_previous=gather_beside)
        result = None
        if call.mode == "direct":
            writeback = dict(state_cache=state_cache, final_state_indices=final_state_indices)
        elif call.mode == "returned":
            # The kernel's own writeback into a dense tensor: the same single fp32 -> cache dtype rounding as a
            # direct writeback, whatever the workspace dtype.
            result = torch.empty((batch, H, P, N), dtype=state_cache.dtype, device=x.device)
            identity = torch.arange(batch, dtype=torch.int64, device=x.device)
            writeback = dict(state_cache=result, final_state_indices=identity)
        else:
            writeback = {}
        if pair:
            chunk_states, CB = chunk_states_beside_bmm(CB)
            state_passing_batched(chunk_states, dA_cumsum, last_chunk_indices, initial_states=initial_states,
                                  out=workspace, **writeback)
        else:
            chunk_states = None
            CB = fused_states_beside_bmm(CB, initial_states=initial_states,
                                         last_chunk_indices=last_chunk_indices if writeback else None, **writeback)
        if call.mode == "checkpoint":
            result = workspace

    chunk_scan(
        CB,
        x,
        dt_out,
        dA_cumsum,
        C,
        workspace,
        cu_chunk_seqlens,
        seq_idx,
        out=out,
        D=D,
        z=z,
        initial_states=initial_states,
        states_are_entering=chosen == "indexed",
    )
    if workspace_out is not None:
        workspace_out.update(
            path=chosen,
            gather=copy,
            states=workspace,
            chunk_states=chunk_states,
            chunk_state_bmm=one_kernel,
            cumsum_gather=gather_in_cumsum,
            dA_cumsum=dA_cumsum,
            dt_out=dt_out,
            initial_states=initial_states,
        )
    return result
