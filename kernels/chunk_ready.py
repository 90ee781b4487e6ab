"""Per-chunk readiness between chunk state and the indexed state passing (launch order "stream", kernels/ssd.py).

The state passing's step for chunk c needs only chunk c's states, and chunk state computes them chunk by chunk (its
programs take their tiles chunk-major). With the grid-wide wait the whole serial walk over the chunks waited for the
whole chunk state kernel. Here chunk state counts, per (chunk, head), the state elements it has stored
(``signal_states_stored``: each program adds its tile's element count), and the state passing, launched early, spins
before it reads a chunk's row until that chunk's count for its head is the whole head, headdim x dstate
(``wait_states_stored``). The count is in elements, not programs, so it does not depend on chunk state's tile. No
arithmetic changes, only when a step may read: the bits are the grid-wide wait's.

The state passing's programs are placed only once every program of the kernel before it has started
(kernels/backend.py), and that kernel's own programs were placed only once every chunk state program had started: the
programs a spinning one waits for are already running, so the spin cannot starve them.

The counts live in a (C, H) int32 buffer allocated per call; the chunk cumsum, the call's first kernel, zeroes it
after its own wait (so the previous call's state passing has finished reading a buffer at the same address).
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
def signal_states_stored(ready_ptr, chunk, head, nheads, elements, signal):
    """After this program's stores of ``elements`` states of (``chunk``, ``head``): that many more are stored."""
    if signal != 0:
        tl.debug_barrier()  # every thread's stores are performed before the one release below
        tl.atomic_add(ready_ptr + chunk * nheads + head, elements, sem="release", scope="gpu")


@triton.jit
def wait_states_stored(ready_ptr, chunk, head, nheads, elements, wait):
    """Where ``wait`` is nonzero, spin until ``elements`` states of (``chunk``, ``head``) are stored."""
    if wait != 0:
        flag = ready_ptr + chunk * nheads + head
        while tl.atomic_add(flag, 0, sem="acquire", scope="gpu") < elements:
            pass
        tl.debug_barrier()  # no thread loads the states before the acquire above
