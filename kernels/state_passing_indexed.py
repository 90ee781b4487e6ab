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

from kernels.backend import fixed_block, let_next_kernel_start, pdl_arguments, wait_for_previous_kernel
from kernels.chunk_ready import signal_states_stored
from kernels.interface import INDEX_DTYPES, MASK_DTYPES
from kernels.state_passing import (
    READ_AHEAD,
    chunk_row,
    load_chunk_at,
    memory_overlaps,
    recurrence_step,
)

# The fixed block over a head's P * N states on the GPU (under the interpreter a head is one block:
# kernels.backend.fixed_block; the recurrence is elementwise, so the bits do not depend on the block).
BLOCK_SIZE = 512

# The software pipeline's stages in this kernel's walk (``walk_entering_states``): rows in flight, plus one.
STAGES = tl.constexpr(4)

# Slot indices and the mask are single scalars, nchunks a loop bound: specializing on them only multiplies
# binaries, so they are compiled once for all classes.
SCALAR_ONLY = {
    "do_not_specialize": ("nchunks", "signal_next"),
    "do_not_specialize_on_alignment": ("init_slot_ptr", "has_init_ptr", "final_slot_ptr"),
}


@triton.jit
def _step_and_store(s, new, dA_end, next_entering_ptr, offs, mask, store):
    """A chunk's step of the recurrence (the snapshot kernel's arithmetic, same code) and the state exiting it stored
    as the next chunk's entering state (``next_entering_ptr``: a scalar pointer at that row of this program's head)
    where ``store``: the last chunk's exiting state is not stored there but left to the final slot."""
    s = recurrence_step(s, new, dA_end)
    tl.store(next_entering_ptr + offs, s.to(next_entering_ptr.dtype.element_ty), mask=mask & store)
    return s


@triton.jit
def walk_entering_states(states_ptr, out_ptr, dA_cs_ptr, cache_ptr, has_init, init_slot, final_slot, ready_ptr,
                         pid_m, pid_h, nheads, dim, nchunks, chunk_size, stride_states_chunk, stride_states_head,
                         stride_out_chunk, stride_out_head, stride_dA_head, stride_dA_chunk, stride_dA_q,
                         stride_cache_slot, stride_cache_head, SIGNAL: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                         STAGES: tl.constexpr):
    """The indexed state passing of block ``pid_m`` of head ``pid_h``'s P * N states: this kernel's body, and the
    walkers' in the chunk scan's launch (launch order "walk", kernels/chunk_ready.py), which count the entering rows
    they store (``SIGNAL``), a group of rows at a time. The mask and the slots are the caller's loads (int1, int64):
    the caller loads them together, the final slot with them (after the loop's stores the compiler could not hoist
    that load, the pointers may alias, and every call would end waiting on one more load)."""
    offs = pid_m * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < dim
    elements = tl.minimum(BLOCK_SIZE, dim - pid_m * BLOCK_SIZE)

    # Scalar bases (this program's head): the loops carry only scalars and the state (chunk_row says why).
    states_ptr += pid_h * stride_states_head
    out_ptr += pid_h * stride_out_head
    dA_cs_ptr += pid_h * stride_dA_head + (chunk_size - 1) * stride_dA_q
    cache_ptr += pid_h * stride_cache_head

    # Read this program's slice of the initial state before any write (in-place safety), masked by the mask (one
    # latency after the mask and slot, as in kernels.gather): a masked-off initial state is never read, since the
    # slot may hold garbage or NaN.
    init_slot = tl.where(has_init, init_slot, 0)
    entering = tl.load(cache_ptr + init_slot * stride_cache_slot + offs, mask=mask & has_init, other=0.0)
    s = entering.to(tl.float32)
    tl.store(out_ptr + offs, entering, mask=mask)
    if SIGNAL:
        signal_states_stored(ready_ptr, 0, 1, 0, pid_h, nheads, elements)

    # Groups of READ_AHEAD chunks, one chunk an iteration, its row read STAGES - 1 iterations ahead by Triton's
    # software pipeline (asynchronous copies into shared memory: the rows in flight take no registers); the rows a
    # group stored are counted after it (kernels/chunk_ready.py), so the release fence is paid once a group.
    for first in range(0, nchunks, READ_AHEAD):
        for c in tl.range(first, tl.minimum(first + READ_AHEAD, nchunks), num_stages=STAGES):
            new, dA_end = load_chunk_at(states_ptr, dA_cs_ptr, offs, mask, c, stride_states_chunk, stride_dA_chunk)
            s = _step_and_store(s, new, dA_end, chunk_row(out_ptr, c + 1, stride_out_chunk), offs, mask,
                                c + 1 < nchunks)
        if SIGNAL:
            signal_states_stored(ready_ptr, first + 1, READ_AHEAD, nchunks - 1, pid_h, nheads, elements)

    if final_slot >= 0:  # negative slot: padded sequence, write nothing
        tl.store(cache_ptr + final_slot * stride_cache_slot + offs, s.to(cache_ptr.dtype.element_ty), mask=mask)


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
    signal_next,  # nonzero: let the next kernel start early (kernels/backend.py)
    USE_PDL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    let_next_kernel_start(signal_next, USE_PDL)
    has_init = tl.load(has_init_ptr) != 0
    init_slot = tl.load(init_slot_ptr).to(tl.int64)
    final_slot = tl.load(final_slot_ptr).to(tl.int64)
    walk_entering_states(states_ptr, out_ptr, dA_cs_ptr, cache_ptr, has_init, init_slot, final_slot, states_ptr,
                         tl.program_id(0), tl.program_id(1), tl.num_programs(1), dim, nchunks, chunk_size,
                         stride_states_chunk, stride_states_head, stride_out_chunk, stride_out_head, stride_dA_head,
                         stride_dA_chunk, stride_dA_q, stride_cache_slot, stride_cache_head, False, BLOCK_SIZE, STAGES)


def _check_slot_view(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    assert t.dim() == 1 and t.shape[0] == 1, f"{name}: expected a (1,) view, found {tuple(t.shape)}"
    assert t.dtype in dtypes, f"{name}: expected one of {dtypes}, found {t.dtype}"


def check_indexed_walk(states: torch.Tensor, dA_cumsum: torch.Tensor, *, state_cache: torch.Tensor,
                       init_slot_index: torch.Tensor, has_initial_state: torch.Tensor, final_slot_index: torch.Tensor,
                       out: torch.Tensor) -> None:
    """The arguments of ``state_passing_indexed`` (its docstring), for it and for the walkers in the chunk scan's
    launch (kernels/chunk_ready.py)."""
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


def mask_bytes(has_initial_state: torch.Tensor) -> torch.Tensor:
    """The mask as the kernels read it: a bool mask as a same-width uint8 view, not a copy."""
    return has_initial_state.view(torch.uint8) if has_initial_state.dtype == torch.bool else has_initial_state


def as_words(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """A (1,) index or mask view as ``dtype`` words (int32 or uint8; a view, no copy) and how many words hold its
    value: a kernel that reads them (``load_slot_words``, ``load_mask_bytes``) is one binary for every index and
    mask dtype (the chunk scan's walkers: kernels/chunk_ready.py). The narrow view of one element spans its bytes
    whatever the view's stride."""
    words = t.element_size() // torch.empty((), dtype=dtype).element_size()
    single = t.as_strided((1,), (1,))  # a dtype view needs a unit stride
    return (single.view(torch.uint8) if t.dtype == torch.bool else single).view(dtype), words


@triton.jit
def load_slot_words(words_ptr, words):
    """An int32 or int64 slot from its ``words`` (1 or 2) little-endian int32 words, as int64."""
    low = tl.load(words_ptr).to(tl.int64)
    high = tl.load(words_ptr + 1, mask=words == 2, other=0).to(tl.int64)
    return tl.where(words == 2, (high << 32) | (low & 0xFFFFFFFF), low)


@triton.jit
def load_mask_bytes(bytes_ptr, nbytes):
    """Whether a mask element of ``nbytes`` (1, 4 or 8) bytes is nonzero."""
    offs = tl.arange(0, 8)
    return tl.max(tl.load(bytes_ptr + offs, mask=offs < nbytes, other=0).to(tl.int32), axis=0) != 0


def state_passing_indexed(
    states: torch.Tensor,
    dA_cumsum: torch.Tensor,
    *,
    state_cache: torch.Tensor,
    init_slot_index: torch.Tensor,
    has_initial_state: torch.Tensor,
    final_slot_index: torch.Tensor,
    out: torch.Tensor,
    signal_next: bool = False,
) -> None:
    """Entering states into ``out`` and the final state into the cache, for one sequence.

    states (C, H, P, N) fp32; dA_cumsum (H, C, Q) fp32; state_cache (slots, H, P, N) with compact (H, P, N)
    (padded stride(0) and storage offset allowed); init_slot_index, final_slot_index (1,) int32/int64 and
    has_initial_state (1,) bool/int, each possibly a strided view; out (C, H, P, N) in the cache dtype.
    ``signal_next``: the next kernel may start early (kernels/backend.py).
    """
    check_indexed_walk(states, dA_cumsum, state_cache=state_cache, init_slot_index=init_slot_index,
                       has_initial_state=has_initial_state, final_slot_index=final_slot_index, out=out)
    C, H, P, N = states.shape
    arguments = launch_arguments(states, dA_cumsum, state_cache=state_cache, init_slot_index=init_slot_index,
                                 has_initial_state=has_initial_state, final_slot_index=final_slot_index, out=out,
                                 signal_next=signal_next)
    grid = (triton.cdiv(P * N, arguments["BLOCK_SIZE"]), H)
    _state_passing_indexed_kernel[grid](**arguments)


def launch_arguments(states: torch.Tensor, dA_cumsum: torch.Tensor, *, state_cache: torch.Tensor,
                     init_slot_index: torch.Tensor, has_initial_state: torch.Tensor, final_slot_index: torch.Tensor,
                     out: torch.Tensor, signal_next: bool = False) -> dict:
    """The kernel's arguments by name for these tensors (the launcher's, and the warmup registry's on stand-ins)."""
    nchunks, _, P, N = states.shape
    has_init = mask_bytes(has_initial_state)
    return dict(
        states_ptr=states, out_ptr=out, dA_cs_ptr=dA_cumsum, cache_ptr=state_cache, init_slot_ptr=init_slot_index,
        has_init_ptr=has_init, final_slot_ptr=final_slot_index,
        dim=P * N, nchunks=nchunks, chunk_size=dA_cumsum.shape[2],
        stride_states_chunk=states.stride(0), stride_states_head=states.stride(1),
        stride_out_chunk=out.stride(0), stride_out_head=out.stride(1),
        stride_dA_head=dA_cumsum.stride(0), stride_dA_chunk=dA_cumsum.stride(1), stride_dA_q=dA_cumsum.stride(2),
        stride_cache_slot=state_cache.stride(0), stride_cache_head=state_cache.stride(1),
        signal_next=int(signal_next),
        BLOCK_SIZE=fixed_block(P * N, BLOCK_SIZE),
        **pdl_arguments(),
    )
