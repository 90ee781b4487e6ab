"""State passing (stage 3): the inter-chunk recurrence over the chunk states, the pieces its two kernels share.

Per head and state element, in fp32: at the first chunk of sequence ``b`` the state is its initial state (or 0);
then ``s = exp2(LOG2E * dA_cs[h, c, Q-1]) * s + states[c]`` (``recurrence_step``). The multiply-add is written as
one expression so that Triton contracts it into an FMA on CUDA, which equals ``torch.addcmul`` bit for bit
(docs/exactness.md); the interpreter does not fuse (the ``interpreter`` profile).

The kernels: the snapshot path's, fused with the chunk state stage (``kernels.chunk_state_passing``, whose
teacher-forced mode is the stage function ``state_passing``); the indexed path's (``kernels.state_passing_indexed``),
which reads the chunk states written by ``kernels.chunk_state`` in groups of ``READ_AHEAD`` chunks (the helpers
below).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.backend import LOG2E
from kernels.interface import INDEX_DTYPES
from kernels.triton_internals import settle_cache_keys

# Kernels may only read constexpr globals.
_LOG2E = tl.constexpr(LOG2E)
# Chunks whose rows each program reads at once (the loops are written out for four).
READ_AHEAD = tl.constexpr(4)


@triton.jit
def grouped_chunks(nchunks):
    """Where the kernels' first loop ends: it runs whole groups of ``READ_AHEAD`` chunks, none past the last chunk,
    so it reads without masks; the 0-3 chunks after them go one at a time through the second loop (a one-chunk call
    then reads one row and runs one step, not four)."""
    return nchunks - nchunks % READ_AHEAD


@triton.jit
def chunk_row(ptr, c, stride_chunk):
    """The scalar pointer ``c`` chunks past the scalar ``ptr``, in int64 (chunks x stride can pass 2**31 elements).
    The kernels form every row's pointer from scalars at its load or store, so their loops carry no pointer tensor:
    one carried through both loops has its layout converted between them (through shared memory, with more
    registers). Within a group of chunks the offsets from its first (at most ``READ_AHEAD`` strides) stay int32."""
    return ptr + tl.cast(c, tl.int64) * stride_chunk


@triton.jit
def load_chunk(states_ptr, dA_cs_ptr, offs, mask):
    """A chunk's state contribution (fp32) and the dA cumsum at its end, from scalar pointers at that chunk (this
    program's head; for dA the chunk's last position). The row is read once: evicted from L2 first, to leave room
    for what the call's next kernels read (the entering states the indexed kernel stores,
    ``kernels.state_passing_indexed``; chunk scan's inputs)."""
    new = tl.load(states_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    dA_end = tl.load(dA_cs_ptr).to(tl.float32)
    return new, dA_end


@triton.jit
def load_chunks_ahead(states_ptr, dA_cs_ptr, offs, mask, first, stride_states_chunk, stride_dA_chunk):
    """The ``READ_AHEAD`` (four) chunks from ``first``, each as ``load_chunk``, all issued before any of their steps:
    one group of the kernels' first loop (whole groups only, so none is past the last chunk). One 64-bit product
    per group, not per chunk: fewer registers."""
    states_ptr = chunk_row(states_ptr, first, stride_states_chunk)
    dA_cs_ptr = chunk_row(dA_cs_ptr, first, stride_dA_chunk)
    new0, end0 = load_chunk(states_ptr, dA_cs_ptr, offs, mask)
    new1, end1 = load_chunk(states_ptr + stride_states_chunk, dA_cs_ptr + stride_dA_chunk, offs, mask)
    new2, end2 = load_chunk(states_ptr + 2 * stride_states_chunk, dA_cs_ptr + 2 * stride_dA_chunk, offs, mask)
    new3, end3 = load_chunk(states_ptr + 3 * stride_states_chunk, dA_cs_ptr + 3 * stride_dA_chunk, offs, mask)
    return new0, end0, new1, end1, new2, end2, new3, end3


@triton.jit
def load_chunk_at(states_ptr, dA_cs_ptr, offs, mask, c, stride_states_chunk, stride_dA_chunk):
    """Chunk ``c`` as ``load_chunk``, counted from the scalar pointers at chunk 0: one step of the second loop."""
    return load_chunk(chunk_row(states_ptr, c, stride_states_chunk), chunk_row(dA_cs_ptr, c, stride_dA_chunk), offs,
                      mask)


@triton.jit
def recurrence_step(s, new, dA_end):
    """One chunk of the fp32 inter-chunk recurrence ``s = exp(dA_chunk_end) * s + chunk_state``, shared by the
    snapshot path's fused kernel and the indexed kernel so their arithmetic is one piece of code. ``exp`` as
    ``exp2(LOG2E * x)`` (equal to torch.exp2 on CUDA); the multiply-add is one expression so CUDA contracts it to an
    FMA (torch.addcmul).

    The indexed kernel reads ``READ_AHEAD`` chunks' rows (``load_chunks_ahead``; the 0-3 left after the whole groups
    one at a time: ``grouped_chunks``) before those chunks' steps and stores: the loop is bound by memory latency
    (each program has one chunk's row in flight otherwise, and every program of the grid is resident at once), and a
    load that follows a store cannot be hoisted by the compiler (the pointers may alias). So the chunk states must
    not overlap its outputs (``memory_overlaps``).
    """
    return tl.math.exp2(_LOG2E * dA_end) * s + new


def memory_overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory spans of two tensors (from their lowest to their highest element) share a byte."""
    def span(t: torch.Tensor) -> tuple[int, int]:
        dims = list(zip(t.shape, t.stride(), strict=True))
        if t.numel() == 0:
            return 0, 0
        low = t.data_ptr() + t.element_size() * sum((size - 1) * stride for size, stride in dims if stride < 0)
        extent = sum((size - 1) * abs(stride) for size, stride in dims) + 1
        return low, low + extent * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a.device == b.device and a0 < b1 and b0 < a1


def check_state_rows(name: str, t: torch.Tensor, H: int, P: int, N: int) -> None:
    """(rows, H, P, N) with compact (P, N) so that one head is a flat run of P*N elements."""
    assert t.dim() == 4 and tuple(t.shape[1:]) == (H, P, N), (
        f"{name}: expected (*, {H}, {P}, {N}), found {tuple(t.shape)}")
    assert t.stride(3) == 1 and t.stride(2) == N, f"{name}: (P, N) must be compact, found strides {t.stride()}"


def check_index(name: str, t: torch.Tensor, n: int, dtypes: tuple[torch.dtype, ...] = INDEX_DTYPES) -> None:
    """A (n,) index (or mask) tensor of one of ``dtypes``."""
    assert t.dim() == 1 and t.shape[0] == n, f"{name}: expected ({n},), found {tuple(t.shape)}"
    assert t.dtype in dtypes, f"{name}: expected one of {dtypes}, found {t.dtype}"


settle_cache_keys(globals())  # each kernel keyed as if its helpers were hashed first
