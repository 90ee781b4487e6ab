"""Per-chunk readiness inside the chunk scan's launch on the indexed path (launch order "walk", kernels/ssd.py).

The chunk scan's tile of chunk c needs the state entering chunk c, and only for its inter-chunk term; the indexed
state passing produces those states chunk by chunk, in a serial walk over the chunks that is bound by memory latency.
In order "walk" the walk runs inside the chunk scan's launch: its first programs are walkers (the indexed state
passing's body, ``kernels.state_passing_indexed.walk_entering_states``), the chunk scan's tiles come after them,
chunk by chunk. A walker counts, per (chunk, head), the entering states it has stored (``signal_states_stored``);
a tile spins before it reads its chunk's entering state until its head's count is headdim x dstate
(``wait_states_stored``). The count is in states, not programs, so it does not depend on the walkers' block. No
arithmetic changes, only when a tile may read: the bits are those of the separate state passing kernel.

Programs are placed in launch order, so every walker is placed before any tile: the programs a spinning tile waits
for are already running, and walkers never wait, so the spin cannot starve them.

The counts live in a (C, H) int32 buffer allocated per call; the chunk cumsum, the call's first kernel, zeroes it
after its own wait (the previous call's chunk scan, which read a buffer at the same address, has completed).
Release/acquire as in a split-K semaphore: a CTA barrier, then one gpu-scope release add; one gpu-scope acquire read
in a loop, then a CTA barrier before any thread loads the states.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl


def ready_counts(nchunks: int, nheads: int, device: torch.device) -> torch.Tensor:
    """A call's (C, H) count buffer: uninitialized, the chunk cumsum zeroes it (no memset launch)."""
    return torch.empty((nchunks, nheads), dtype=torch.int32, device=device)


@functools.cache
def unused_ready_counts(device: torch.device) -> torch.Tensor:
    """The pointer a kernel gets when it neither zeroes, signals nor waits on counts: int32 like a real buffer (one
    binary for both), never read or written."""
    return torch.empty((1,), dtype=torch.int32, device=device)


def check_ready_counts(ready: torch.Tensor, nchunks: int, nheads: int) -> None:
    assert ready.dtype == torch.int32 and tuple(ready.shape) == (nchunks, nheads) and ready.is_contiguous(), (
        f"ready: expected a contiguous ({nchunks}, {nheads}) int32 tensor, found {tuple(ready.shape)} {ready.dtype} "
        f"strides {ready.stride()}")


@triton.jit
def signal_states_stored(ready_ptr, first, ROWS: tl.constexpr, last, head, nheads, elements):
    """After this program's stores of ``elements`` states of ``head`` in each of the chunks ``first`` to ``first +
    ROWS - 1`` (those up to ``last``): that many more are stored in each. One barrier, then one release add per
    chunk, side by side in ROWS threads (the release fence is paid once per group of chunks, not per chunk)."""
    chunks = first + tl.arange(0, ROWS)
    tl.debug_barrier()  # every thread's stores are performed before the releases below
    tl.atomic_add(ready_ptr + chunks * nheads + head, tl.full((ROWS,), elements, tl.int32), mask=chunks <= last,
                  sem="release", scope="gpu")


@triton.jit
def wait_states_stored(ready_ptr, chunk, head, nheads, elements, wait):
    """Where ``wait`` is nonzero, spin until ``elements`` states of (``chunk``, ``head``) are stored."""
    if wait != 0:
        flag = ready_ptr + chunk * nheads + head
        while tl.atomic_add(flag, 0, sem="acquire", scope="gpu") < elements:
            pass
        tl.debug_barrier()  # no thread loads the states before the acquire above
