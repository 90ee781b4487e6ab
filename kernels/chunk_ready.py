"""Per-chunk readiness between the indexed state passing and the chunk scan (the "chunks" launch order).

The chunk scan of chunk c needs only the state entering chunk c, which the state passing writes about a chunk's
step after it starts; with the grid-wide wait the whole scan waited for the whole serial walk over the chunks. Here
the state passing counts, per (chunk, head), the programs that have stored their slice of that chunk's entering
state (``signal_chunk_ready``), and each scan program spins until its (chunk, head) count is complete
(``wait_chunk_ready``) instead of waiting for the kernel. The scan is placed behind the state passing's early signal
(kernels/backend.py), which fires only once every program of the state passing has started: the programs a scan
program waits for are already running, so the spin cannot starve them. No arithmetic changes, only when a tile may
start: the bits are the grid-wide wait's.

The counts live in a (C, H) int32 buffer allocated per call; the chunk cumsum, the call's first kernel, zeroes it
after its own wait (so the previous call's scan has finished reading a buffer at the same address).
Release/acquire as in a split-K semaphore: a CTA barrier, then one gpu-scope release add; one gpu-scope acquire read
in a loop, then a CTA barrier before any thread loads the state.
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
def signal_chunk_ready(ready_ptr, chunk, head, nheads, signal):
    """After this program's stores of the state entering ``chunk`` (of ``head``): one more program done there."""
    if signal != 0:
        tl.debug_barrier()  # every thread's stores are performed before the one release below
        tl.atomic_add(ready_ptr + chunk * nheads + head, 1, sem="release", scope="gpu")


@triton.jit
def wait_chunk_ready(ready_ptr, chunk, head, nheads, count):
    """Spin until ``count`` programs have signalled (``chunk``, ``head``); ``count`` 0: no wait."""
    if count != 0:
        flag = ready_ptr + chunk * nheads + head
        while tl.atomic_add(flag, 0, sem="acquire", scope="gpu") < count:
            pass
        tl.debug_barrier()  # no thread loads the state before the acquire above
