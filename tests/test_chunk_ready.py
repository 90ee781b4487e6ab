"""Per-chunk readiness (kernels/chunk_ready.py): the chunk cumsum zeroes the counts, the indexed state passing adds
exactly its programs to each (chunk, head) once that chunk's entering state is stored, and the chunk scan accepts
counts only for entering states. Whether a scan that waits per chunk gives the bits of one that waits for the whole
kernel is the order lab's check on every workload (tests/test_order_lab.py on any device; on the GPU, where the
kernels overlap, also the graph replays of tests/test_programmatic_launch.py)."""

from __future__ import annotations

import pytest
import torch

from kernels.chunk_cumsum import chunk_cumsum
from kernels.chunk_ready import ready_counts
from kernels.chunk_scan import chunk_scan
from kernels.state_passing_indexed import programs_per_head, state_passing_indexed

H, P, N, Q = 3, 4, 16, 16


def incomplete_rows(ready: torch.Tensor, expected: int) -> list[tuple[int, int, int]]:
    """(chunk, head, count) wherever the count is not ``expected``."""
    return [(c, h, int(ready[c, h])) for c, h in (ready != expected).nonzero().tolist()]


def test_the_cumsum_zeroes_the_counts(device):
    nchunks = 3
    cu = torch.tensor([0, Q, 2 * Q, 2 * Q + 5], dtype=torch.int32, device=device)
    dt = torch.rand(2 * Q + 5, H, device=device)
    ready = ready_counts(nchunks, H, torch.device(device))
    ready.fill_(7)  # what an earlier call left there
    chunk_cumsum(dt, -torch.ones(H, device=device), Q, cu, ready=ready)
    assert incomplete_rows(ready, 0) == []


@pytest.mark.parametrize("nchunks", [1, 4, 5, 9])
def test_the_indexed_state_passing_counts_each_entering_state_once_per_program(device, nchunks):
    """1 chunk: only the initial state's row; 4, 5, 9: whole groups of read-ahead chunks and the ones after them
    (the last chunk's exiting state goes to the cache, not to a row the scan reads, and is not counted)."""
    g = torch.Generator().manual_seed(nchunks)
    states = torch.randn(nchunks, H, P, N, generator=g).to(device)
    dA_cumsum = -torch.rand(H, nchunks, Q, generator=g).cumsum(-1).to(device)
    cache = torch.randn(4, H, P, N, generator=g).to(device)
    slot = torch.tensor([2], dtype=torch.int64, device=device)
    out = torch.empty(nchunks, H, P, N, device=device)
    ready = ready_counts(nchunks, H, torch.device(device)).zero_()
    state_passing_indexed(states, dA_cumsum, state_cache=cache, init_slot_index=slot,
                          has_initial_state=torch.ones(1, dtype=torch.bool, device=device), final_slot_index=slot,
                          out=out, ready=ready)
    assert incomplete_rows(ready, programs_per_head(P, N)) == []
    # Negative control: a buffer the kernel was not given stays as it was, and the check reports every row.
    untouched = ready_counts(nchunks, H, torch.device(device)).zero_()
    assert len(incomplete_rows(untouched, programs_per_head(P, N))) == nchunks * H


def test_the_chunk_scan_takes_counts_only_for_entering_states(device):
    """Exiting states (the snapshot path) are stored by another kernel that counts nothing: a scan waiting on them
    would spin forever, so the launcher refuses the combination before any launch."""
    nchunks, G = 2, 1
    x = torch.zeros(2 * Q, H, P, device=device)
    fp32 = torch.zeros(H, nchunks, Q, device=device)
    cu = torch.tensor([0, Q, 2 * Q], dtype=torch.int32, device=device)
    seq_idx = torch.zeros(nchunks, dtype=torch.int32, device=device)
    args = (torch.zeros(nchunks, G, Q, Q, device=device), x, fp32, fp32, torch.zeros(2 * Q, G, N, device=device),
            torch.zeros(nchunks, H, P, N, device=device), cu, seq_idx)
    ready = ready_counts(nchunks, H, torch.device(device)).zero_()
    with pytest.raises(AssertionError, match="entering states only"):
        chunk_scan(*args, out=torch.empty_like(x), ready=ready, ready_count=1)
    with pytest.raises(AssertionError, match="come together"):
        chunk_scan(*args, out=torch.empty_like(x), states_are_entering=True, ready=ready)
