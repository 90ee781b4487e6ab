"""Gather of initial states out of the paged cache: the snapshot path's copy.

``out[b] = state_cache[initial_state_indices[b]]`` where ``has_initial_states[b]``, else zeros, in the cache dtype.
Two implementations of the same pure data copy (no arithmetic), equal bit for bit: the fused Triton kernel (one
launch) and ``gather_initial_states_torch`` in PyTorch ops (``torch.where``, capturable in a CUDA graph). Neither
reads a masked-off row's slot (it may hold NaN or be out of range).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import cdiv, fixed_block, pdl_arguments, wait_at_end_if_overlapping, wait_unless_overlapping
from kernels.direct_launch import launch
from kernels.interface import INDEX_DTYPES, MASK_DTYPES, kernel_mask, kernel_slots
from kernels.triton_internals import settle_cache_keys

# The fixed block over a row of H * P * N states on the GPU (under the interpreter a row is one block:
# kernels.backend.fixed_block; a copy's bits do not depend on the block), and its warps: eight warps put one 16-byte
# load per thread in flight where four put two back to back, and the grid is one wave, so the kernel is that latency.
BLOCK_SIZE = 1024
NUM_WARPS = 8

# The index and mask are read one element per program: specializing on their alignment or stride class would only
# multiply binaries (block-table column views come in every class), so they are compiled once for all classes.
# The cache pointer's alignment and its row stride's class are not specialized either. A row's load can be 16-byte
# vectors only where both are (every row 16-byte aligned), and ``ssd_prefill`` then gathers inside the cumsum's
# kernel (``kernels.chunk_cumsum_gather``, which keeps that specialization); this kernel runs where the rows are not
# (no 16-byte row loads there, specialized or not), in the unfused plan of the stage bench (``kernels.plan``: there
# its loads on aligned rows are no longer 16-byte vectors) and in the stage hook. A copy's bits do not depend on its
# load width; the specialization only multiplied the binaries by the cache layout classes.
SCALAR_ONLY = {
    "do_not_specialize": ("stride_idx", "stride_has", "overlaps_previous", "stride_cache_slot"),
    "do_not_specialize_on_alignment": ("idx_ptr", "has_ptr", "cache_ptr"),
}


@triton.jit(**SCALAR_ONLY)
def _gather_initial_states_kernel(
    cache_ptr,  # (slots, H*P*N)
    idx_ptr,  # (Bt,) int32/int64
    has_ptr,  # (Bt,) uint8/int: nonzero means copy the slot
    out_ptr,  # (Bt, H*P*N) cache dtype
    row,  # H * P * N
    stride_cache_slot,
    stride_idx,
    stride_has,
    stride_out_batch,
    overlaps_previous,  # nonzero: the kernel before it signalled early, and the copy reads nothing it writes
    USE_PDL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    wait_unless_overlapping(overlaps_previous, USE_PDL)
    gather_tile(cache_ptr, idx_ptr, has_ptr, out_ptr, tl.program_id(0), tl.program_id(1).to(tl.int64), row,
                stride_cache_slot, stride_idx, stride_has, stride_out_batch, BLOCK_SIZE)
    wait_at_end_if_overlapping(overlaps_previous, USE_PDL)


@triton.jit
def gather_tile(cache_ptr, idx_ptr, has_ptr, out_ptr, pid_m, b, row, stride_cache_slot, stride_idx, stride_has,
                stride_out_batch, BLOCK_SIZE: tl.constexpr):
    """Block ``pid_m`` of row ``b`` (int64): the kernel's body, and the gather programs' of the kernel that also
    runs the cumsum's (``kernels.chunk_cumsum_gather``)."""
    offs = pid_m * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < row
    # The mask and the index are loaded side by side and the row's load is masked by both, not branched on the
    # mask: one memory latency before the row's, not two (the grid is one wave: the kernel is these latencies). A
    # masked-off row reads nothing at its slot, whatever the slot holds.
    has = tl.load(has_ptr + b * stride_has) != 0
    slot = tl.where(has, tl.load(idx_ptr + b * stride_idx).to(tl.int64), 0)
    vals = tl.load(cache_ptr + slot * stride_cache_slot + offs, mask=mask & has, other=0.0)
    tl.store(out_ptr + b * stride_out_batch + offs, vals, mask=mask)


def launch_arguments(state_cache: torch.Tensor, initial_state_indices: torch.Tensor, has_initial_states: torch.Tensor,
                     out: torch.Tensor, overlaps_previous: bool = False) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins)."""
    _, H, P, N = state_cache.shape
    slots, has = kernel_slots(initial_state_indices), kernel_mask(has_initial_states)
    return dict(
        cache_ptr=state_cache, idx_ptr=slots, has_ptr=has, out_ptr=out,
        row=H * P * N,
        stride_cache_slot=state_cache.stride(0),
        stride_idx=slots.stride(0),
        stride_has=has.stride(0),
        stride_out_batch=out.stride(0),
        overlaps_previous=int(overlaps_previous),
        BLOCK_SIZE=fixed_block(H * P * N, BLOCK_SIZE),
        num_warps=NUM_WARPS,
        **pdl_arguments(),
    )


def _check_inputs(state_cache: torch.Tensor, initial_state_indices: torch.Tensor,
                  has_initial_states: torch.Tensor) -> None:
    assert state_cache.dim() == 4, f"state_cache: expected (slots, H, P, N), found {tuple(state_cache.shape)}"
    assert initial_state_indices.dim() == 1, (
        f"initial_state_indices: expected (Bt,), found {tuple(initial_state_indices.shape)}")
    batch = initial_state_indices.shape[0]
    assert initial_state_indices.dtype in INDEX_DTYPES, (
        f"initial_state_indices: expected int32 or int64, found {initial_state_indices.dtype}")
    assert tuple(has_initial_states.shape) == (batch,), (
        f"has_initial_states: expected ({batch},), found {tuple(has_initial_states.shape)}")
    assert has_initial_states.dtype in MASK_DTYPES, (
        f"has_initial_states: expected bool or int, found {has_initial_states.dtype}")
    for name, t in (("initial_state_indices", initial_state_indices), ("has_initial_states", has_initial_states)):
        assert t.device == state_cache.device, f"{name}: on {t.device}, state_cache on {state_cache.device}"


def gather_output(state_cache: torch.Tensor, initial_state_indices: torch.Tensor,
                  has_initial_states: torch.Tensor) -> torch.Tensor:
    """The kernel's checks on its inputs, and its output, uninitialized: (Bt, H, P, N) in the cache dtype."""
    _check_inputs(state_cache, initial_state_indices, has_initial_states)
    _, H, P, N = state_cache.shape
    assert state_cache.stride(3) == 1 and state_cache.stride(2) == N and state_cache.stride(1) == P * N, (
        f"state_cache: (H, P, N) must be compact, found strides {state_cache.stride()}")
    batch = initial_state_indices.shape[0]
    return torch.empty((batch, H, P, N), dtype=state_cache.dtype, device=state_cache.device)


def gather_initial_states(
    state_cache: torch.Tensor, initial_state_indices: torch.Tensor, has_initial_states: torch.Tensor,
    overlaps_previous: bool = False,
) -> torch.Tensor:
    """Dense copy of the initial states, by the fused kernel.

    state_cache (slots, H, P, N) with compact (H, P, N) (padded stride(0), storage offset allowed);
    initial_state_indices (Bt,) int32/int64 and has_initial_states (Bt,) bool/int, possibly strided views.
    Returns (Bt, H, P, N) in the cache dtype, zeros where the mask is false. ``overlaps_previous``: only right
    after a kernel launched with ``signal_next`` (kernels/backend.py); the copy reads only the cache and indices.
    """
    out = gather_output(state_cache, initial_state_indices, has_initial_states)
    arguments = launch_arguments(state_cache, initial_state_indices, has_initial_states, out, overlaps_previous)
    grid = (cdiv(arguments["row"], arguments["BLOCK_SIZE"]), out.shape[0])
    launch(_gather_initial_states_kernel, grid, arguments)
    return out


def gather_initial_states_torch(
    state_cache: torch.Tensor, initial_state_indices: torch.Tensor, has_initial_states: torch.Tensor
) -> torch.Tensor:
    """The same copy in PyTorch ops (the snapshot path off CUDA, and ``gather="torch"``); any (H, P, N) layout.

    A masked-off row reads slot 0 instead of its own (which may be out of range) and ``torch.where`` then takes
    zeros for it: selecting, not multiplying by the mask, so a NaN in the slot read cannot leak. No data-dependent
    shapes, so the copy can be captured in a CUDA graph.
    """
    _check_inputs(state_cache, initial_state_indices, has_initial_states)
    has = has_initial_states.to(torch.bool)
    slots = torch.where(has, initial_state_indices.to(torch.int64), 0)
    rows = state_cache.index_select(0, slots)
    return torch.where(has[:, None, None, None], rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
