"""``ssd_prefill``: the five SSD stages composed, with the snapshot / indexed dispatch (docs/provider.md).

``kernels.plan.plan`` decides from the call's facts which kernels run (``Plan``); ``ssd_prefill`` runs them as
numbered steps. Every plan computes the same bits.

Snapshot path: a dense copy of the initial states out of the cache (in the cumsum's kernel where the cache's rows are
aligned, else the Triton gather's own kernel on CUDA or the same copy in PyTorch ops), then the chunk states computed
and passed on, the exiting state of every chunk into the workspace and, in direct mode, the final states into the
cache. Chunk scan reads the dense copy, so a final slot that is also an initial slot is safe to overwrite.

Indexed path (one sequence, direct writeback, no intermediate states, cache dtype == workspace dtype): no copy. The
states kernel reads the initial state from the cache by slot index and stores each chunk's *entering* state into the
workspace; chunk scan reads only the workspace (``states_are_entering=True``), never the cache after the writeback.
Bit-identical to the snapshot path.

On either path the states run in one kernel (``kernels.chunk_state_passing``) on calls of few chunks, and as chunk
state's kernel then a state passing kernel on calls of many (``kernels.plan.PAIR_FROM_CHUNKS``).

A call whose signature was seen before is replayed (``kernels.call_replay``): its launches, recorded from the
signature's first call whose every launch was direct, go to the same binaries with this call's addresses.
"""

from __future__ import annotations

import math

import torch

from kernels.bmm_chunk import bmm_chunk
from kernels.call_replay import replayed
from kernels.chunk_cumsum import chunk_cumsum
from kernels.chunk_cumsum_gather import chunk_cumsum_gather
from kernels.chunk_cumsum_gather import fuses as cumsum_gather_fuses
from kernels.chunk_scan import chunk_scan
from kernels.chunk_state import chunk_state
from kernels.chunk_state_bmm import chunk_state_bmm, chunk_state_bmm_config
from kernels.chunk_state_passing import chunk_state_passing
from kernels.gather import gather_initial_states, gather_initial_states_torch
from kernels.interface import CallShape, choose_gather, choose_path, kernel_mask, kernel_slots
from kernels.plan import plan, states_pair
from kernels.state_passing_batched import state_passing_batched
from kernels.state_passing_indexed import state_passing_indexed


@replayed
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
    unfused: bool = False,
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
    CUDA); ``unfused`` runs every stage in a kernel of its own, launched alone (``kernels.plan``: the stage bench's
    plan); ``workspace_out``, a dict, receives the ``plan``, the chosen ``path``, ``gather`` and the intermediates
    (``states``: the (C, H, P, N) workspace, exiting states on the snapshot path and entering states on the indexed
    path; ``chunk_states``, where chunk state ran as a kernel of its own (calls of ``kernels.plan.PAIR_FROM_CHUNKS``
    chunks and more), else None; ``chunk_state_bmm``, the config under which that kernel also ran
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
    # Slots and mask in the one form the kernels read (``kernel_slots``, ``kernel_mask``), before the first launch:
    # a copy made between two kernels would stand between a kernel that signals the next one early and the kernel
    # that starts beside it without waiting (the gather beside the cumsum reads the slots).
    initial_state_indices, has_initial_states = kernel_slots(initial_state_indices), kernel_mask(has_initial_states)
    if final_state_indices is not None:
        final_state_indices = kernel_slots(final_state_indices)
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

    nchunks = cu_chunk_seqlens.shape[0] - 1
    p = plan(path=chosen, copy=copy, nchunks=nchunks, cache_rows_aligned=cumsum_gather_fuses(state_cache),
             chunk_state_bmm=chunk_state_bmm_config(P, N, chunk_size, nchunks) if states_pair(nchunks) else None,
             unfused=unfused)
    dt_options = dict(dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    workspace = torch.empty((nchunks, H, P, N), dtype=ws_dtype, device=x.device)
    initial_states = chunk_states = CB = None

    # 1. The cumsum, and the snapshot copy of the initial states where the cumsum's kernel makes it.
    if p.gather == "in_cumsum":
        dA_cumsum, dt_out, initial_states = chunk_cumsum_gather(
            dt, A, chunk_size, cu_chunk_seqlens, state_cache, initial_state_indices, has_initial_states, **dt_options)
    else:
        dA_cumsum, dt_out = chunk_cumsum(dt, A, chunk_size, cu_chunk_seqlens, signal_next=p.signals_after_cumsum,
                                         **dt_options)

    # 2. The snapshot copy elsewhere: the gather's own kernel (beside the cumsum's, which it does not read) or torch.
    if p.gather in ("beside_cumsum", "alone"):
        initial_states = gather_initial_states(state_cache, initial_state_indices, has_initial_states,
                                               overlaps_previous=p.gather == "beside_cumsum")
    elif p.gather == "torch":
        initial_states = gather_initial_states_torch(state_cache, initial_state_indices, has_initial_states)

    # 3. bmm alone (the unfused plan).
    if p.bmm == "alone":
        CB = bmm_chunk(C, B, chunk_size, cu_chunk_seqlens)

    # 4. The states: entering states into the workspace on the indexed path (the initial state read from the cache
    #    by slot), exiting states on the snapshot path; final states into the writeback target.
    writeback, result = _writeback(p.path, call.mode, state_cache, final_state_indices, batch, x.device)
    if p.states == "fused":
        if p.path == "indexed":  # one sequence (``choose_path``): each index tensor is that sequence's one entry
            sources = dict(state_cache=state_cache, initial_state_indices=initial_state_indices,
                           has_initial_states=has_initial_states, final_state_indices=final_state_indices,
                           last_chunk_indices=last_chunk_indices)
        else:
            sources = dict(initial_states=initial_states, last_chunk_indices=last_chunk_indices if writeback else None,
                           **writeback)
        chunk_state_passing(B, x, dt_out, dA_cumsum, cu_chunk_seqlens, seq_idx, out=workspace,
                            signal_next=p.bmm == "after_states", **sources)
        # 5. bmm beside the fused states kernel, which writes nothing it reads.
        if p.bmm == "after_states":
            CB = bmm_chunk(C, B, chunk_size, cu_chunk_seqlens, overlaps_previous=True)
    else:
        if p.bmm == "in_chunk_state":
            chunk_states, CB = chunk_state_bmm(B, x, C, dt_out, dA_cumsum, cu_chunk_seqlens, p.chunk_state_bmm)
        else:
            if p.bmm == "before_chunk_state":
                CB = bmm_chunk(C, B, chunk_size, cu_chunk_seqlens, signal_next=True)
            chunk_states = chunk_state(B, x, dt_out, dA_cumsum, cu_chunk_seqlens,
                                       overlaps_previous=p.bmm == "before_chunk_state")
        if p.path == "indexed":
            state_passing_indexed(chunk_states, dA_cumsum, state_cache=state_cache,
                                  init_slot_index=initial_state_indices, has_initial_state=has_initial_states,
                                  final_slot_index=final_state_indices, out=workspace)
        else:
            state_passing_batched(chunk_states, dA_cumsum, last_chunk_indices, initial_states=initial_states,
                                  out=workspace, **writeback)
    if call.mode == "checkpoint":
        result = workspace

    # 6. The chunk scan: it reads the workspace and the dense copy, never the cache the final states went to.
    chunk_scan(CB, x, dt_out, dA_cumsum, C, workspace, cu_chunk_seqlens, seq_idx, out=out, D=D, z=z,
               initial_states=initial_states, states_are_entering=p.path == "indexed")
    if workspace_out is not None:
        workspace_out.update(
            plan=p,
            path=chosen,
            gather=copy,
            states=workspace,
            chunk_states=chunk_states,
            chunk_state_bmm=p.chunk_state_bmm,
            cumsum_gather=p.gather == "in_cumsum",
            dA_cumsum=dA_cumsum,
            dt_out=dt_out,
            initial_states=initial_states,
        )
    return result


def _writeback(path: str, mode: str, state_cache: torch.Tensor, final_state_indices: torch.Tensor | None, batch: int,
               device: torch.device) -> tuple[dict, torch.Tensor | None]:
    """(where the snapshot path's states kernel writes the final states, the tensor ``ssd_prefill`` returns). In
    returned mode the kernel's own writeback goes into a dense tensor: the same single fp32 -> cache dtype rounding
    as a direct writeback, whatever the workspace dtype. The indexed path writes by slot (``ssd_prefill``)."""
    if path == "indexed" or mode == "checkpoint":
        return {}, None
    if mode == "direct":
        return dict(state_cache=state_cache, final_state_indices=final_state_indices), None
    H, P, N = state_cache.shape[1:]
    result = torch.empty((batch, H, P, N), dtype=state_cache.dtype, device=device)
    identity = torch.arange(batch, dtype=torch.int32, device=device)
    return dict(state_cache=result, final_state_indices=identity), result
