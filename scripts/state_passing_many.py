"""A lab kernel (scripts/fusion_lab.py imports it after the backend is configured): the state passing over many
sequences in the indexed kernel's shape (``kernels.state_passing_indexed``), for the snapshot path's calls of many
chunks, where the fused kernel (``kernels.chunk_state_passing``) walks every chunk with few programs.

Per program a block of one head's states: the chunk rows are read ``READ_AHEAD`` at a time before their steps (the
shipped kernels' helpers); where the sequence changes the state is reset to that sequence's row of the dense
snapshot (zeros where it has no initial state), and its last chunk and final slot are read; each chunk's exiting
state is stored (the snapshot path's workspace), and a sequence's final state is written to its slot at its last
chunk (negative slot: nothing). The recurrence is ``kernels.state_passing.recurrence_step``: the fused kernel's bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import fixed_block, pdl_arguments, wait_for_previous_kernel
from kernels.state_passing import (
    READ_AHEAD,
    chunk_row,
    grouped_chunks,
    load_chunk_at,
    load_chunks_ahead,
    recurrence_step,
)

BLOCK_SIZE = 512  # states a program, as the indexed kernel's


@triton.jit
def _step(s, prev_seq, last, slot, c, new, dA_end, seq_idx_ptr, init_ptr, out_ptr, cache_ptr, final_idx_ptr,
          last_chunk_ptr, offs, mask, stride_seq_idx, stride_init_row, stride_out_chunk, stride_cache_slot,
          stride_final_idx, stride_last_chunk):
    """Chunk ``c``'s step: the reset where its sequence starts, the recurrence, the exiting state's store and the
    final slot's write at the sequence's last chunk."""
    seq = tl.load(seq_idx_ptr + c * stride_seq_idx)
    if seq != prev_seq:
        row = seq.to(tl.int64)
        s = tl.load(init_ptr + row * stride_init_row + offs, mask=mask, other=0.0).to(tl.float32)
        last = tl.load(last_chunk_ptr + row * stride_last_chunk).to(tl.int64)
        slot = tl.load(final_idx_ptr + row * stride_final_idx).to(tl.int64)
    s = recurrence_step(s, new, dA_end)
    tl.store(chunk_row(out_ptr, c, stride_out_chunk) + offs, s.to(out_ptr.dtype.element_ty), mask=mask)
    if last == c:
        if slot >= 0:
            tl.store(cache_ptr + slot * stride_cache_slot + offs, s.to(cache_ptr.dtype.element_ty), mask=mask)
    return s, seq, last, slot


@triton.jit
def _state_passing_many_kernel(
    states_ptr, out_ptr, dA_cs_ptr, seq_idx_ptr, init_ptr, cache_ptr, final_idx_ptr, last_chunk_ptr,
    dim, nchunks, chunk_size, stride_states_chunk, stride_states_head, stride_out_chunk, stride_out_head,
    stride_dA_head, stride_dA_chunk, stride_dA_q, stride_seq_idx, stride_init_row, stride_init_head,
    stride_cache_slot, stride_cache_head, stride_final_idx, stride_last_chunk,
    USE_PDL: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    offs = pid_m * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < dim
    states_ptr += pid_h * stride_states_head
    out_ptr += pid_h * stride_out_head
    dA_cs_ptr += pid_h * stride_dA_head + (chunk_size - 1) * stride_dA_q
    init_ptr += pid_h * stride_init_head
    cache_ptr += pid_h * stride_cache_head
    s = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    prev = tl.load(seq_idx_ptr) - 1  # a sequence no chunk has: the first step loads its sequence's state
    last = tl.load(last_chunk_ptr).to(tl.int64) * 0 - 1
    slot = tl.load(final_idx_ptr).to(tl.int64) * 0 - 1
    for first in range(0, grouped_chunks(nchunks), READ_AHEAD):
        new0, end0, new1, end1, new2, end2, new3, end3 = load_chunks_ahead(
            states_ptr, dA_cs_ptr, offs, mask, first, stride_states_chunk, stride_dA_chunk)
        s, prev, last, slot = _step(s, prev, last, slot, first, new0, end0, seq_idx_ptr, init_ptr, out_ptr,
                                    cache_ptr, final_idx_ptr, last_chunk_ptr, offs, mask, stride_seq_idx,
                                    stride_init_row, stride_out_chunk, stride_cache_slot, stride_final_idx,
                                    stride_last_chunk)
        s, prev, last, slot = _step(s, prev, last, slot, first + 1, new1, end1, seq_idx_ptr, init_ptr, out_ptr,
                                    cache_ptr, final_idx_ptr, last_chunk_ptr, offs, mask, stride_seq_idx,
                                    stride_init_row, stride_out_chunk, stride_cache_slot, stride_final_idx,
                                    stride_last_chunk)
        s, prev, last, slot = _step(s, prev, last, slot, first + 2, new2, end2, seq_idx_ptr, init_ptr, out_ptr,
                                    cache_ptr, final_idx_ptr, last_chunk_ptr, offs, mask, stride_seq_idx,
                                    stride_init_row, stride_out_chunk, stride_cache_slot, stride_final_idx,
                                    stride_last_chunk)
        s, prev, last, slot = _step(s, prev, last, slot, first + 3, new3, end3, seq_idx_ptr, init_ptr, out_ptr,
                                    cache_ptr, final_idx_ptr, last_chunk_ptr, offs, mask, stride_seq_idx,
                                    stride_init_row, stride_out_chunk, stride_cache_slot, stride_final_idx,
                                    stride_last_chunk)
    for c in range(grouped_chunks(nchunks), nchunks):
        new, dA_end = load_chunk_at(states_ptr, dA_cs_ptr, offs, mask, c, stride_states_chunk, stride_dA_chunk)
        s, prev, last, slot = _step(s, prev, last, slot, c, new, dA_end, seq_idx_ptr, init_ptr, out_ptr, cache_ptr,
                                    final_idx_ptr, last_chunk_ptr, offs, mask, stride_seq_idx, stride_init_row,
                                    stride_out_chunk, stride_cache_slot, stride_final_idx, stride_last_chunk)


def state_passing_many(states: torch.Tensor, dA_cumsum: torch.Tensor, seq_idx: torch.Tensor, *,
                       initial_states: torch.Tensor, out: torch.Tensor, state_cache: torch.Tensor,
                       final_state_indices: torch.Tensor, last_chunk_indices: torch.Tensor) -> None:
    """Exiting states into ``out`` (C, H, P, N) and each sequence's final state into its cache slot, from the chunk
    states (C, H, P, N) fp32 and the dense snapshot ``initial_states`` (Bt, H, P, N); (P, N) compact everywhere."""
    C, H, P, N = states.shape
    for name, t in (("states", states), ("out", out), ("initial_states", initial_states),
                    ("state_cache", state_cache)):
        assert t.stride(3) == 1 and t.stride(2) == N, f"{name}: (P, N) must be compact, found {t.stride()}"
    block = fixed_block(P * N, BLOCK_SIZE)
    pdl = pdl_arguments()
    _state_passing_many_kernel[(triton.cdiv(P * N, block), H)](
        states, out, dA_cumsum, seq_idx, initial_states, state_cache, final_state_indices, last_chunk_indices,
        P * N, C, dA_cumsum.shape[2], states.stride(0), states.stride(1), out.stride(0), out.stride(1),
        dA_cumsum.stride(0), dA_cumsum.stride(1), dA_cumsum.stride(2), seq_idx.stride(0), initial_states.stride(0),
        initial_states.stride(1), state_cache.stride(0), state_cache.stride(1), final_state_indices.stride(0),
        last_chunk_indices.stride(0), USE_PDL=pdl["USE_PDL"], BLOCK_SIZE=block, launch_pdl=pdl["launch_pdl"])

