"""The cumsum and the snapshot path's gather in one launch (docs/architecture.md, stage 1 and the copy): the first
programs compute the cumsum's blocks (``kernels.chunk_cumsum.chunk_cumsum_tile``), the others copy the gather's
(``kernels.gather.gather_tile``), each with its own code and blocks, so each tensor gets the bits its own kernel
would write.

The two read only the call's inputs and write different tensors. Run as two kernels they overlap anyway
(``kernels.ssd``: the cumsum signals early and the gather computes beside it, waiting at its end); one kernel places
the same programs with one launch fewer, and its programs wait for the kernel before them as every stage kernel does.

Fused only where the cache's rows start 16-byte aligned (``fuses``: the layout an engine allocates), so that the
copy's binaries are the gather's fast ones and the kernel adds few to the warmup (each combines a cumsum's flags
with a cache's classes); elsewhere ``kernels.ssd`` launches the two kernels.

The cumsum's config is always fixed (``kernels.chunk_cumsum.chunk_cumsum_config``: nothing times it), so its programs
here run the blocks and warps its own kernel runs: dA_cumsum's scan order follows the warps, and the indexed path,
which has no gather, runs the cumsum's own kernel. The gather's programs run under the same warps (a copy's bits do
not depend on them).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels import chunk_cumsum, gather
from kernels.backend import cdiv, wait_for_previous_kernel
from kernels.chunk_cumsum import RUNTIME_FLAGS, chunk_cumsum_tile
from kernels.direct_launch import launch
from kernels.gather import gather_tile
from kernels.triton_internals import settle_cache_keys


# The chunk count is a grid extent read as a scalar; the index and mask are read one element per program (as in the
# gather's own kernel); the dt options are the cumsum's run-time branches (``kernels.chunk_cumsum.RUNTIME_FLAGS``):
# specializing any of them would only multiply binaries.
@triton.jit(do_not_specialize=("nchunks", "stride_idx", "stride_has", *RUNTIME_FLAGS),
            do_not_specialize_on_alignment=("idx_ptr", "has_ptr"))
def _chunk_cumsum_gather_kernel(
    dt_ptr,  # (T, H) any float dtype
    A_ptr,  # (H,) fp32
    dt_bias_ptr,  # (H,) fp32, unused without has_dt_bias
    cu_chunk_seqlens_ptr,  # (C + 1,) int32/int64
    dt_out_ptr,  # (H, C, Q) fp32
    dA_cumsum_ptr,  # (H, C, Q) fp32
    cache_ptr,  # (slots, H*P*N)
    idx_ptr,  # (Bt,) int32/int64
    has_ptr,  # (Bt,) uint8/int: nonzero means copy the slot
    out_ptr,  # (Bt, H*P*N) cache dtype
    nheads,
    chunk_size,
    dt_min,
    dt_max,
    nchunks,
    row,  # H * P * N
    stride_dt_token,
    stride_dt_head,
    stride_A_head,
    stride_dt_bias_head,
    stride_dt_out_head,
    stride_dt_out_chunk,
    stride_dt_out_pos,
    stride_dA_cs_head,
    stride_dA_cs_chunk,
    stride_dA_cs_pos,
    stride_cache_slot,
    stride_idx,
    stride_has,
    stride_out_batch,
    has_dt_bias,
    dt_softplus,
    has_dt_limit,
    LOG1P_LIBDEVICE: tl.constexpr,
    USE_PDL: tl.constexpr,
    BLOCK_SIZE_H: tl.constexpr,
    BLOCK_SIZE_CHUNK: tl.constexpr,
    GATHER_BLOCK_SIZE: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    # A 1-D grid: the cumsum's programs first, in its own grid's order (chunks, then head blocks), so that their
    # chains of loads start first; then the gather's, in its grid's order (row blocks, then rows).
    pid = tl.program_id(axis=0)
    cumsum_programs = nchunks * tl.cdiv(nheads, BLOCK_SIZE_H)
    if pid < cumsum_programs:
        chunk_cumsum_tile(
            dt_ptr, A_ptr, dt_bias_ptr, cu_chunk_seqlens_ptr, dt_out_ptr, dA_cumsum_ptr, pid % nchunks, pid // nchunks,
            nheads, chunk_size, dt_min, dt_max, stride_dt_token, stride_dt_head, stride_A_head, stride_dt_bias_head,
            stride_dt_out_head, stride_dt_out_chunk, stride_dt_out_pos, stride_dA_cs_head, stride_dA_cs_chunk,
            stride_dA_cs_pos, has_dt_bias, dt_softplus, has_dt_limit, LOG1P_LIBDEVICE, BLOCK_SIZE_H, BLOCK_SIZE_CHUNK)
    else:
        place = pid - cumsum_programs
        row_blocks = tl.cdiv(row, GATHER_BLOCK_SIZE)
        gather_tile(cache_ptr, idx_ptr, has_ptr, out_ptr, place % row_blocks, (place // row_blocks).to(tl.int64), row,
                    stride_cache_slot, stride_idx, stride_has, stride_out_batch, GATHER_BLOCK_SIZE)


def fuses(state_cache: torch.Tensor) -> bool:
    """Whether a call with this cache runs the one kernel: the cache's first row 16-byte aligned and its row stride
    a multiple of 16 elements (so every row is; known from the tensor, no device read)."""
    return state_cache.data_ptr() % 16 == 0 and state_cache.stride(0) % 16 == 0


def chunk_cumsum_gather(
    dt: torch.Tensor,
    A: torch.Tensor,
    chunk_size: int,
    cu_chunk_seqlens: torch.Tensor,
    state_cache: torch.Tensor,
    initial_state_indices: torch.Tensor,
    has_initial_states: torch.Tensor,
    *,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(*chunk_cumsum(dt, A, chunk_size, cu_chunk_seqlens, ...), gather_initial_states(state_cache,
    initial_state_indices, has_initial_states))`` in one launch: (dA_cumsum, dt_out, initial states), with the
    two functions' checks and bits."""
    dA_cumsum, dt_out = chunk_cumsum.cumsum_outputs(dt, A, chunk_size, cu_chunk_seqlens, dt_bias)
    initial_states = gather.gather_output(state_cache, initial_state_indices, has_initial_states)
    arguments = launch_arguments(
        dt, A, cu_chunk_seqlens, dt_out, dA_cumsum, state_cache, initial_state_indices, has_initial_states,
        initial_states, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    launch(_chunk_cumsum_gather_kernel, (programs(arguments),), arguments)
    return dA_cumsum, dt_out, initial_states


def programs(arguments: dict) -> int:
    """The grid's size: the cumsum's programs, then the gather's."""
    cumsum = arguments["nchunks"] * cdiv(arguments["nheads"], arguments["BLOCK_SIZE_H"])
    return cumsum + cdiv(arguments["row"], arguments["GATHER_BLOCK_SIZE"]) * arguments["out_ptr"].shape[0]


def launch_arguments(dt: torch.Tensor, A: torch.Tensor, cu_chunk_seqlens: torch.Tensor, dt_out: torch.Tensor,
                     dA_cumsum: torch.Tensor, state_cache: torch.Tensor, initial_state_indices: torch.Tensor,
                     has_initial_states: torch.Tensor, out: torch.Tensor, *, dt_bias: torch.Tensor | None,
                     dt_softplus: bool, dt_limit: tuple[float, float]) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins),
    with the cumsum's config (``chunk_cumsum_config``) and the gather's block."""
    cumsum = chunk_cumsum.launch_arguments(dt, A, cu_chunk_seqlens, dt_out, dA_cumsum, dt_bias=dt_bias,
                                           dt_softplus=dt_softplus, dt_limit=dt_limit)
    copy = gather.launch_arguments(state_cache, initial_state_indices, has_initial_states, out)
    del cumsum["signal_next"], copy["overlaps_previous"], copy["num_warps"]
    config = chunk_cumsum.chunk_cumsum_config(dt_out.shape[2], dt_out.shape[0])
    gather_block = copy.pop("BLOCK_SIZE")
    return dict(cumsum, **copy, nchunks=dt_out.shape[1], GATHER_BLOCK_SIZE=gather_block, **config)


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
