"""Indexed state passing for ONE sequence: the initial state is read from the paged cache by slot index.

Instead of a dense snapshot of the initial state, this kernel reads ``state_cache[init_slot]`` itself, stores each
chunk's *entering* state into the SSD workspace ``out`` (C, H, P, N) in the cache dtype, and writes the final state
into ``state_cache[final_slot]`` (skipped when the slot is negative). Chunk scan then reads only the workspace.

Bits equal the snapshot kernel (``kernels.state_passing``): the same fp32 recurrence expression and the same
fp32 -> cache dtype cast of the final state. ``out[0]`` is a raw copy of the cache row (no fp32 round trip, so even
NaN payloads match the snapshot's gathered copy), ``out[c + 1]`` is the state exiting chunk c.

In place (init slot == final slot) is safe: each program reads its slice of the initial state before it writes
anything, and no other program touches that slice. For the same reason the kernel is never autotuned: a trial launch
would overwrite an aliased initial state, so it runs one fixed BLOCK_SIZE.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import cdiv, fixed_block, pdl_arguments, wait_for_previous_kernel
from kernels.direct_launch import launch
from kernels.interface import INDEX_DTYPES, MASK_DTYPES, kernel_mask, kernel_slots
from kernels.state_passing import (
    READ_AHEAD,
    chunk_row,
    grouped_chunks,
    load_chunk_at,
    load_chunks_ahead,
    memory_overlaps,
    recurrence_step,
)
from kernels.triton_internals import settle_cache_keys

# The fixed block over a head's P * N states on the GPU (under the interpreter a head is one block:
# kernels.backend.fixed_block; the recurrence is elementwise, so the bits do not depend on the block).
BLOCK_SIZE = 512

# Slot indices and the mask are single scalars, nchunks a loop bound: specializing on them only multiplies
# binaries, so they are compiled once for all classes. The state cache is touched twice per program, outside the
# chunk loop (the initial row's load, the final row's store): its pointer's alignment and row stride's class would
# only choose those two accesses' vector width (never a value) and multiplied the binaries by the cache layout
# classes a server meets (aligned or offset, padded or not).
SCALAR_ONLY = {
    "do_not_specialize": ("nchunks", "stride_cache_slot"),
    "do_not_specialize_on_alignment": ("init_slot_ptr", "has_init_ptr", "final_slot_ptr", "cache_ptr"),
}


@triton.jit
def _step_and_store(s, new, dA_end, next_entering_ptr, offs, mask, store):
    """A chunk's step of the recurrence (the snapshot kernel's arithmetic, same code) and the state exiting it stored
    as the next chunk's entering state (``next_entering_ptr``: a scalar pointer at that row of this program's head)
    where ``store``: the last chunk's exiting state is not stored there but left to the final slot. The row is kept
    in L2 (evicted last): the chunk scan that comes next reads it first thing in each of its programs, so an L2 hit
    there shortens every program (docs/decisions.md: L2 eviction hints). A hint on what L2 keeps; the same values."""
    s = recurrence_step(s, new, dA_end)
    tl.store(next_entering_ptr + offs, s.to(next_entering_ptr.dtype.element_ty), mask=mask & store,
             eviction_policy="evict_last")
    return s


@triton.jit(**SCALAR_ONLY)
def _state_passing_indexed_kernel(
    states_ptr,  # (C, H, P*N) fp32
    out_ptr,  # (C, H, P*N) cache dtype: entering states
    dA_cs_ptr,  # (H, C, Q) fp32
    cache_ptr,  # (slots, H, P*N)
    init_slot_ptr,  # (1,) int32/int64
    has_init_ptr,  # (1,) uint8/int: nonzero means read the initial state
    final_slot_ptr,  # (1,) int32/int64
    dim,  # P * N
    nchunks,
    chunk_size,
    stride_states_chunk,
    stride_states_head,
    stride_out_chunk,
    stride_out_head,
    stride_dA_head,
    stride_dA_chunk,
    stride_dA_q,
    stride_cache_slot,
    stride_cache_head,
    USE_PDL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    pid_m = tl.program_id(0)
    pid_h = tl.program_id(1)
    offs = pid_m * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < dim

    # Scalar bases (this program's head): the loops carry only scalars and the state (chunk_row says why).
    states_ptr += pid_h * stride_states_head
    out_ptr += pid_h * stride_out_head
    dA_cs_ptr += pid_h * stride_dA_head + (chunk_size - 1) * stride_dA_q
    cache_ptr += pid_h * stride_cache_head

    # Read this program's slice of the initial state before any write (in-place safety). Mask and slot are loaded
    # side by side and the row's load is masked by both (one latency before it, as in kernels.gather): a masked-off
    # initial state is never read, since the slot may hold garbage or NaN.
    has_init = tl.load(has_init_ptr) != 0
    init_slot = tl.where(has_init, tl.load(init_slot_ptr).to(tl.int64), 0)
    # Read with the others: after the loop's stores the compiler could not hoist it (the pointers may alias), and
    # every call would end waiting on one more load.
    final_slot = tl.load(final_slot_ptr).to(tl.int64)
    entering = tl.load(cache_ptr + init_slot * stride_cache_slot + offs, mask=mask & has_init, other=0.0)
    s = entering.to(tl.float32)
    tl.store(out_ptr + offs, entering, mask=mask)

    # Whole groups of READ_AHEAD chunks: their rows are read before their steps and stores
    # (kernels.state_passing.recurrence_step says why); then the 0-3 chunks left, one at a time. Only a group that
    # ends at the last chunk skips its last store.
    for first in range(0, grouped_chunks(nchunks), READ_AHEAD):
        new0, end0, new1, end1, new2, end2, new3, end3 = load_chunks_ahead(
            states_ptr, dA_cs_ptr, offs, mask, first, stride_states_chunk, stride_dA_chunk)
        out_group_ptr = chunk_row(out_ptr, first, stride_out_chunk)
        s = _step_and_store(s, new0, end0, out_group_ptr + stride_out_chunk, offs, mask, True)
        s = _step_and_store(s, new1, end1, out_group_ptr + 2 * stride_out_chunk, offs, mask, True)
        s = _step_and_store(s, new2, end2, out_group_ptr + 3 * stride_out_chunk, offs, mask, True)
        s = _step_and_store(s, new3, end3, out_group_ptr + 4 * stride_out_chunk, offs, mask, first + 4 < nchunks)
    for c in range(grouped_chunks(nchunks), nchunks):
        new, dA_end = load_chunk_at(states_ptr, dA_cs_ptr, offs, mask, c, stride_states_chunk, stride_dA_chunk)
        s = _step_and_store(s, new, dA_end, chunk_row(out_ptr, c + 1, stride_out_chunk), offs, mask, c + 1 < nchunks)

    if final_slot >= 0:  # negative slot: padded sequence, write nothing
        tl.store(cache_ptr + final_slot * stride_cache_slot + offs, s.to(cache_ptr.dtype.element_ty), mask=mask)


def _check_slot_view(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    assert t.dim() == 1 and t.shape[0] == 1, f"{name}: expected a (1,) view, found {tuple(t.shape)}"
    assert t.dtype in dtypes, f"{name}: expected one of {dtypes}, found {t.dtype}"


def state_passing_indexed(
    states: torch.Tensor,
    dA_cumsum: torch.Tensor,
    *,
    state_cache: torch.Tensor,
    init_slot_index: torch.Tensor,
    has_initial_state: torch.Tensor,
    final_slot_index: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Entering states into ``out`` and the final state into the cache, for one sequence.

    states (C, H, P, N) fp32; dA_cumsum (H, C, Q) fp32; state_cache (slots, H, P, N) with compact (H, P, N)
    (padded stride(0) and storage offset allowed); init_slot_index, final_slot_index (1,) int32/int64 and
    has_initial_state (1,) bool/int, each possibly a strided view; out (C, H, P, N) in the cache dtype.
    """
    assert states.dim() == 4 and states.dtype == torch.float32, f"states: expected (C,H,P,N) fp32, found {states.dtype}"
    C, H, P, N = states.shape
    assert states.stride(3) == 1 and states.stride(2) == N, f"states: (P, N) must be compact, found {states.stride()}"
    assert dA_cumsum.dim() == 3 and tuple(dA_cumsum.shape[:2]) == (H, C), (
        f"dA_cumsum: expected ({H}, {C}, Q), found {tuple(dA_cumsum.shape)}")
    assert dA_cumsum.dtype == torch.float32, f"dA_cumsum: expected fp32, found {dA_cumsum.dtype}"
    assert state_cache.dim() == 4 and tuple(state_cache.shape[1:]) == (H, P, N), (
        f"state_cache: expected (slots, {H}, {P}, {N}), found {tuple(state_cache.shape)}")
    assert state_cache.stride(3) == 1 and state_cache.stride(2) == N and state_cache.stride(1) == P * N, (
        f"state_cache: (H, P, N) must be compact, found strides {state_cache.stride()}")
    assert tuple(out.shape) == (C, H, P, N) and out.dtype == state_cache.dtype, (
        f"out: expected ({C}, {H}, {P}, {N}) {state_cache.dtype}, found {tuple(out.shape)} {out.dtype}")
    assert out.stride(3) == 1 and out.stride(2) == N, f"out: (P, N) must be compact, found {out.stride()}"
    assert not memory_overlaps(out, states), "out: must not overlap states (the kernel reads chunks before its stores)"
    _check_slot_view("init_slot_index", init_slot_index, INDEX_DTYPES)
    _check_slot_view("final_slot_index", final_slot_index, INDEX_DTYPES)
    _check_slot_view("has_initial_state", has_initial_state, MASK_DTYPES)
    for name, t in (("dA_cumsum", dA_cumsum), ("state_cache", state_cache), ("init_slot_index", init_slot_index),
                    ("has_initial_state", has_initial_state), ("final_slot_index", final_slot_index), ("out", out)):
        assert t.device == states.device, f"{name}: on {t.device}, states on {states.device}"
    arguments = launch_arguments(states, dA_cumsum, state_cache=state_cache, init_slot_index=init_slot_index,
                                 has_initial_state=has_initial_state, final_slot_index=final_slot_index, out=out)
    grid = (cdiv(P * N, arguments["BLOCK_SIZE"]), H)
    launch(_state_passing_indexed_kernel, grid, arguments)


def launch_arguments(states: torch.Tensor, dA_cumsum: torch.Tensor, *, state_cache: torch.Tensor,
                     init_slot_index: torch.Tensor, has_initial_state: torch.Tensor, final_slot_index: torch.Tensor,
                     out: torch.Tensor) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins)."""
    nchunks, _, P, N = states.shape
    dA_cumsum_strides = dA_cumsum.stride()
    out_strides = out.stride()
    state_cache_strides = state_cache.stride()
    states_strides = states.stride()
    return dict(
        states_ptr=states, out_ptr=out, dA_cs_ptr=dA_cumsum, cache_ptr=state_cache,
        init_slot_ptr=kernel_slots(init_slot_index), has_init_ptr=kernel_mask(has_initial_state),
        final_slot_ptr=kernel_slots(final_slot_index),
        dim=P * N, nchunks=nchunks, chunk_size=dA_cumsum.shape[2],
        stride_states_chunk=states_strides[0], stride_states_head=states_strides[1],
        stride_out_chunk=out_strides[0], stride_out_head=out_strides[1],
        stride_dA_head=dA_cumsum_strides[0], stride_dA_chunk=dA_cumsum_strides[1], stride_dA_q=dA_cumsum_strides[2],
        stride_cache_slot=state_cache_strides[0], stride_cache_head=state_cache_strides[1],
        BLOCK_SIZE=fixed_block(P * N, BLOCK_SIZE),
        **pdl_arguments(),
    )


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
