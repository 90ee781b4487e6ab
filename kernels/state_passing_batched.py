"""State passing over a batch of sequences, one program per (block of states, sequence, head): the snapshot path's
second kernel on calls of many chunks, after ``kernels.chunk_state`` (``kernels.ssd``; docs/architecture.md).

Each program finds its sequence's chunks from ``last_chunk_indices`` (sequence b's run from the chunk after
sequence b - 1's last to its own last), starts from the sequence's row of the dense snapshot ``initial_states``
(zeros where it had no initial state), steps the fp32 recurrence (``kernels.state_passing.recurrence_step``, the
code of the fused and the indexed kernels) over those chunks, stores each exiting state into the workspace ``out``
and, with a writeback, the last one into ``state_cache[final_state_indices[b]]`` (skipped for a negative slot).
The bits are those of the fused kernel (``kernels.chunk_state_passing``): the same recurrence and the same casts.

A program walks only its own sequence, so a call's longest sequence sets the loop's length, not its chunk count.
Two loop shapes (the constexpr ``READ_AHEAD_LOOP``, ``read_ahead``): four chunks' rows read before their steps
(``kernels.state_passing.load_chunks_ahead``), which wins one long sequence; or one chunk a step (the read-ahead
loop's second loop from chunk 0), which wins batches of short ones by a little (docs/decisions.md: the batched
state passing). Never autotuned (a trial launch would write final slots): one fixed block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import cdiv, fixed_block, pdl_arguments, wait_for_previous_kernel
from kernels.direct_launch import launch
from kernels.interface import kernel_slots
from kernels.state_passing import (
    READ_AHEAD,
    check_index,
    check_state_rows,
    chunk_row,
    grouped_chunks,
    load_chunk_at,
    load_chunks_ahead,
    memory_overlaps,
    recurrence_step,
)
from kernels.triton_internals import settle_cache_keys

# States a program: the block of both loop shapes' best on the serving shape (docs/decisions.md: the batched state
# passing; under the interpreter a head is one block: kernels.backend.fixed_block).
BLOCK_SIZE = 1024
# Chunks per sequence, on average over the call, from which the read-ahead loop runs: a long sequence's reads of the
# next chunks overlap its steps, while batches of short sequences gain nothing from reading ahead and pay its masked
# loads (docs/decisions.md: the batched state passing).
READ_AHEAD_FROM = 8

# Index tensors are read one scalar per program; the writeback flag is a branch condition: specializing on their
# alignment or value class would only multiply binaries. The state cache gets one store per program, after the loop:
# its pointer's alignment and row stride's class would only choose that store's vector width (never a value stored)
# and multiplied the binaries by the cache layout classes a server meets (aligned or offset, padded or not).
SCALAR_ONLY = {
    "do_not_specialize": ("stride_final_idx", "stride_last_chunk", "write_cache", "stride_cache_slot"),
    "do_not_specialize_on_alignment": ("final_idx_ptr", "last_chunk_ptr", "cache_ptr"),
}


@triton.jit
def _step_and_store(s, new, dA_end, row_ptr, offs, mask):
    """A chunk's step and its exiting state stored at ``row_ptr`` (a scalar pointer at that chunk's row)."""
    s = recurrence_step(s, new, dA_end)
    tl.store(row_ptr + offs, s.to(row_ptr.dtype.element_ty), mask=mask)
    return s


@triton.jit(**SCALAR_ONLY)
def _state_passing_batched_kernel(
    states_ptr,  # (C, H, P*N) fp32 chunk states
    out_ptr,  # (C, H, P*N) workspace dtype: exiting states
    dA_cs_ptr,  # (H, C, Q) fp32
    init_ptr,  # (Bt, H, P*N) dense snapshot
    cache_ptr,  # (slots, H, P*N) the writeback target
    final_idx_ptr,  # (Bt,) int32/int64
    last_chunk_ptr,  # (Bt,) int32/int64
    dim,  # P * N
    chunk_size,
    stride_states_chunk,
    stride_states_head,
    stride_out_chunk,
    stride_out_head,
    stride_dA_head,
    stride_dA_chunk,
    stride_dA_q,
    stride_init_row,
    stride_init_head,
    stride_cache_slot,
    stride_cache_head,
    stride_final_idx,
    stride_last_chunk,
    write_cache,  # nonzero: write each sequence's final state into its slot
    USE_PDL: tl.constexpr,
    READ_AHEAD_LOOP: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    pid_m = tl.program_id(0)
    seq = tl.program_id(1)
    pid_h = tl.program_id(2)
    offs = pid_m * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < dim
    row = seq.to(tl.int64)
    # The sequence's range, its slot and its initial state are loaded side by side: one latency before the loop.
    end = tl.load(last_chunk_ptr + row * stride_last_chunk).to(tl.int64) + 1
    start = tl.load(last_chunk_ptr + (row - 1) * stride_last_chunk, mask=seq > 0, other=-1).to(tl.int64) + 1
    slot = tl.load(final_idx_ptr + row * stride_final_idx, mask=write_cache != 0, other=-1).to(tl.int64)
    s = tl.load(init_ptr + row * stride_init_row + pid_h * stride_init_head + offs, mask=mask,
                other=0.0).to(tl.float32)
    # Scalar bases at the sequence's first chunk (kernels.state_passing.chunk_row says why scalars).
    states_ptr = chunk_row(states_ptr + pid_h * stride_states_head, start, stride_states_chunk)
    out_ptr = chunk_row(out_ptr + pid_h * stride_out_head, start, stride_out_chunk)
    dA_cs_ptr = chunk_row(dA_cs_ptr + pid_h * stride_dA_head + (chunk_size - 1) * stride_dA_q, start,
                          stride_dA_chunk)
    n = (end - start).to(tl.int32)
    singles_from = 0
    if READ_AHEAD_LOOP:
        singles_from = grouped_chunks(n)
        for first in range(0, singles_from, READ_AHEAD):
            new0, end0, new1, end1, new2, end2, new3, end3 = load_chunks_ahead(
                states_ptr, dA_cs_ptr, offs, mask, first, stride_states_chunk, stride_dA_chunk)
            group = chunk_row(out_ptr, first, stride_out_chunk)
            s = _step_and_store(s, new0, end0, group, offs, mask)
            s = _step_and_store(s, new1, end1, group + stride_out_chunk, offs, mask)
            s = _step_and_store(s, new2, end2, group + 2 * stride_out_chunk, offs, mask)
            s = _step_and_store(s, new3, end3, group + 3 * stride_out_chunk, offs, mask)
    # The chunks after the groups, or every chunk one a step.
    for c in range(singles_from, n):
        new, dA_end = load_chunk_at(states_ptr, dA_cs_ptr, offs, mask, c, stride_states_chunk, stride_dA_chunk)
        s = _step_and_store(s, new, dA_end, chunk_row(out_ptr, c, stride_out_chunk), offs, mask)
    if slot >= 0:  # negative: a padded sequence, or no writeback
        tl.store(cache_ptr + slot * stride_cache_slot + pid_h * stride_cache_head + offs,
                 s.to(cache_ptr.dtype.element_ty), mask=mask)


def read_ahead(nchunks: int, batch: int) -> bool:
    """Whether a call of ``nchunks`` chunks over ``batch`` sequences runs the read-ahead loop (shapes only: no
    device read, so the choice is the same inside a CUDA graph capture)."""
    return nchunks >= READ_AHEAD_FROM * batch


def state_passing_batched(
    states: torch.Tensor,
    dA_cumsum: torch.Tensor,
    last_chunk_indices: torch.Tensor,
    *,
    initial_states: torch.Tensor,
    out: torch.Tensor,
    state_cache: torch.Tensor | None = None,
    final_state_indices: torch.Tensor | None = None,
) -> None:
    """Exiting states into ``out`` and, with ``final_state_indices``, each sequence's final state into its slot of
    ``state_cache``.

    states (C, H, P, N) fp32; dA_cumsum (H, C, Q) fp32; last_chunk_indices (Bt,) int32/int64; initial_states
    (Bt, H, P, N) with compact (H, P, N) (zeros where a sequence has none); out (C, H, P, N); state_cache
    (slots, H, P, N) with compact (H, P, N) rows (padded stride(0), storage offset allowed); final_state_indices
    (Bt,) int32/int64, possibly a strided view (negative: write nothing).
    """
    assert states.dim() == 4 and states.dtype == torch.float32, f"states: expected (C,H,P,N) fp32, found {states.dtype}"
    C, H, P, N = states.shape
    check_state_rows("states", states, H, P, N)
    check_state_rows("out", out, H, P, N)
    assert out.shape[0] == C, f"out: expected {C} chunk rows, found {out.shape[0]}"
    assert not memory_overlaps(out, states), "out: must not overlap states (the kernel reads chunks before its stores)"
    assert dA_cumsum.dim() == 3 and tuple(dA_cumsum.shape[:2]) == (H, C), (
        f"dA_cumsum: expected ({H}, {C}, Q), found {tuple(dA_cumsum.shape)}")
    assert dA_cumsum.dtype == torch.float32, f"dA_cumsum: expected fp32, found {dA_cumsum.dtype}"
    batch = last_chunk_indices.shape[0]
    check_index("last_chunk_indices", last_chunk_indices, batch)
    check_state_rows("initial_states", initial_states, H, P, N)
    assert initial_states.shape[0] == batch and initial_states.stride(1) == P * N, (
        f"initial_states: expected ({batch}, {H}, {P}, {N}) with compact (H, P, N), found "
        f"{tuple(initial_states.shape)} strides {initial_states.stride()}")
    if final_state_indices is not None:
        assert state_cache is not None, "final_state_indices: state_cache is needed for the writeback"
        check_index("final_state_indices", final_state_indices, batch)
        check_state_rows("state_cache", state_cache, H, P, N)
        assert state_cache.stride(1) == P * N, f"state_cache: (H, P, N) must be compact, found {state_cache.stride()}"
    for name, t in (("dA_cumsum", dA_cumsum), ("last_chunk_indices", last_chunk_indices),
                    ("initial_states", initial_states), ("out", out), ("state_cache", state_cache),
                    ("final_state_indices", final_state_indices)):
        assert t is None or t.device == states.device, f"{name}: on {t.device}, states on {states.device}"
    arguments = launch_arguments(states, dA_cumsum, last_chunk_indices, initial_states=initial_states, out=out,
                                 state_cache=state_cache, final_state_indices=final_state_indices)
    launch(_state_passing_batched_kernel, (cdiv(P * N, arguments["BLOCK_SIZE"]), batch, H), arguments)


def launch_arguments(states: torch.Tensor, dA_cumsum: torch.Tensor, last_chunk_indices: torch.Tensor, *,
                     initial_states: torch.Tensor, out: torch.Tensor, state_cache: torch.Tensor | None = None,
                     final_state_indices: torch.Tensor | None = None) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins).
    Without a writeback the cache and slot pointers are placeholders, never read or written."""
    C, _, P, N = states.shape
    write_cache = final_state_indices is not None
    cache = state_cache if write_cache else out
    final = kernel_slots(final_state_indices) if write_cache else last_chunk_indices
    return dict(
        states_ptr=states, out_ptr=out, dA_cs_ptr=dA_cumsum, init_ptr=initial_states, cache_ptr=cache,
        final_idx_ptr=final, last_chunk_ptr=last_chunk_indices,
        dim=P * N, chunk_size=dA_cumsum.shape[2],
        stride_states_chunk=states.stride(0), stride_states_head=states.stride(1),
        stride_out_chunk=out.stride(0), stride_out_head=out.stride(1),
        stride_dA_head=dA_cumsum.stride(0), stride_dA_chunk=dA_cumsum.stride(1), stride_dA_q=dA_cumsum.stride(2),
        stride_init_row=initial_states.stride(0), stride_init_head=initial_states.stride(1),
        stride_cache_slot=cache.stride(0), stride_cache_head=cache.stride(1),
        stride_final_idx=final.stride(0), stride_last_chunk=last_chunk_indices.stride(0),
        write_cache=int(write_cache),
        READ_AHEAD_LOOP=read_ahead(C, last_chunk_indices.shape[0]),
        BLOCK_SIZE=fixed_block(P * N, BLOCK_SIZE),
        **pdl_arguments(),
    )


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
