"""Per-chunk readiness (kernels/chunk_ready.py): the chunk cumsum zeroes the counts, chunk state adds exactly a head's
headdim x dstate states to each (chunk, head) under every tile it may run, tuning trials leave the counts as they
were, and the indexed state passing that waits on complete counts gives the bits of the one that waits for the whole
kernel. Whether it waits for the right chunks while chunk state still runs is the GPU's check
(tests/test_programmatic_launch.py, with poisoned chunk states and a control without counts)."""

from __future__ import annotations

import pytest
import torch

from harness.compare import assert_bits_equal
from kernels import chunk_state as chunk_state_module
from kernels.backend import forced_config
from kernels.chunk_cumsum import chunk_cumsum
from kernels.chunk_ready import check_ready_counts, ready_counts
from kernels.chunk_state import chunk_state
from kernels.state_passing_indexed import state_passing_indexed

H, P, N, Q = 3, 4, 16, 16


def incomplete(ready: torch.Tensor, expected: int) -> list[tuple[int, int, int]]:
    """(chunk, head, count) wherever the count is not ``expected``."""
    return [(c, h, int(ready[c, h])) for c, h in (ready != expected).nonzero().tolist()]


def _chunks(device: str, lengths: list[int]) -> torch.Tensor:
    bounds = torch.tensor([0, *lengths], dtype=torch.int64).cumsum(0)
    return bounds.to(torch.int32).to(device)


def test_the_cumsum_zeroes_the_counts(device):
    cu = _chunks(device, [Q, Q, 5])
    dt = torch.rand(2 * Q + 5, H, device=device)
    ready = ready_counts(3, H, torch.device(device))
    ready.fill_(7)  # what an earlier call left there
    chunk_cumsum(dt, -torch.ones(H, device=device), Q, cu, ready=ready)
    assert incomplete(ready, 0) == []


@pytest.mark.parametrize("config", chunk_state_module.CONFIGS, ids=lambda c: str(c.kwargs))
def test_chunk_state_counts_a_whole_head_per_chunk_whatever_its_tile(device, config):
    """Tiles wider than headdim or dstate, several tiles per head, a short last chunk: each (chunk, head) count ends
    at P * N, the number the state passing waits for. Negative control: counts nobody adds to are reported."""
    g = torch.Generator().manual_seed(0)
    lengths = [Q, Q, 7]
    cu = _chunks(device, lengths)
    T = sum(lengths)
    B = torch.randn(T, 1, N, generator=g).to(device)
    x = torch.randn(T, H, P, generator=g).to(device)
    dA_cumsum, dt_out = chunk_cumsum(torch.rand(T, H, generator=g).to(device), -torch.ones(H, device=device), Q, cu)
    ready = ready_counts(len(lengths), H, torch.device(device)).zero_()
    with forced_config(chunk_state_module.chunk_state_kernel, config):
        counted = chunk_state(B, x, dt_out, dA_cumsum, cu, ready=ready)
        plain = chunk_state(B, x, dt_out, dA_cumsum, cu)
    assert incomplete(ready, P * N) == []
    assert_bits_equal(counted, plain, what="chunk states", context="counting changes no state")
    untouched = ready_counts(len(lengths), H, torch.device(device)).zero_()
    assert len(incomplete(untouched, P * N)) == len(lengths) * H


def test_tuning_trials_leave_the_counts_as_they_were():
    """A trial launch stores the same tiles and counts them: the autotuner puts the counts back after each, so the
    launch that follows counts once (``restore_value``)."""
    assert chunk_state_module.chunk_state_kernel.restore_value == ["ready_ptr"]


@pytest.mark.parametrize("nchunks", [1, 4, 5, 9])
def test_the_state_passing_waiting_on_complete_counts_gives_the_plain_bits(device, nchunks):
    """1 chunk: the one-at-a-time loop only; 4, 5, 9: whole groups of read-ahead chunks and the ones after them."""
    g = torch.Generator().manual_seed(nchunks)
    states = torch.randn(nchunks, H, P, N, generator=g).to(device)
    dA_cumsum = -torch.rand(H, nchunks, Q, generator=g).cumsum(-1).to(device)
    slot = torch.tensor([2], dtype=torch.int64, device=device)
    has_init = torch.ones(1, dtype=torch.bool, device=device)
    results = []
    for ready in (None, torch.full((nchunks, H), P * N, dtype=torch.int32, device=device)):
        cache = torch.randn(4, H, P, N, generator=torch.Generator().manual_seed(1)).to(device)
        out = torch.empty(nchunks, H, P, N, device=device)
        state_passing_indexed(states, dA_cumsum, state_cache=cache, init_slot_index=slot, has_initial_state=has_init,
                              final_slot_index=torch.tensor([3], device=device), out=out, ready=ready)
        results.append((out, cache))
    assert_bits_equal(results[1][0], results[0][0], what="entering states", context=f"{nchunks} chunks")
    assert_bits_equal(results[1][1], results[0][1], what="state cache", context=f"{nchunks} chunks")


@pytest.mark.parametrize(("shape", "dtype", "match"), [
    ((3, 2), torch.int32, r"expected a contiguous \(3, 3\) int32 tensor, found \(3, 2\)"),
    ((3, 3), torch.int64, "found \\(3, 3\\) torch.int64"),
])
def test_a_wrong_count_buffer_is_refused(shape, dtype, match):
    with pytest.raises(AssertionError, match=match):
        check_ready_counts(torch.zeros(shape, dtype=dtype), 3, 3)
