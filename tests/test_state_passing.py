"""State passing: the snapshot path's kernel (chunk state and state passing fused, teacher-forced:
``kernels.chunk_state_passing.state_passing``) vs the PyTorch reference on the same chunk states and dA_cumsum
(under this backend's arithmetic profile), and the indexed kernel vs the snapshot one, bit for bit."""

from __future__ import annotations

import pytest
import torch

from harness.compare import Mismatch, assert_bits_equal, assert_storage_equal, storage_bytes
from harness.varlen import build_varlen_metadata
from kernels import state_passing as sp_module
from kernels.chunk_state_passing import state_passing
from kernels.state_passing_indexed import state_passing_indexed
from reference import chunked
from reference import snapshot as torch_snapshot
from tests.support import STATE_DTYPES, H, N, index_view, paged_cache

Q = 64
SLOTS = 8


def teacher_inputs(contexts, tokens, headdim, device, seed=0):
    """Synthetic chunk states (C,H,P,N) fp32 and dA_cumsum (H,C,Q) fp32 (decays between ~0.1 and 1 per chunk,
    positions past a chunk's end carry dt = 0 as chunk_cumsum's output does), plus the varlen metadata."""
    meta = build_varlen_metadata(contexts, tokens, Q)
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(meta.nchunks, H, headdim, N, generator=g)
    dt = torch.rand(H, meta.nchunks, Q, generator=g) * 0.05
    for c, length in enumerate(meta.chunk_lengths()):
        dt[:, c, length:] = 0.0
    A = -torch.exp(torch.rand(H, generator=g))
    dA_cumsum = torch.cumsum(dt * A[:, None, None], dim=-1)
    return meta, states.to(device), dA_cumsum.to(device)


def run_snapshot_kernel(states, dA_cumsum, meta, *, initial_states, out_dtype, cache=None, final_idx=None,
                        index_dtype=torch.int32):
    t = meta.tensors(states.device.type, index_dtype)
    return state_passing(
        states, dA_cumsum, t["seq_idx"], initial_states=initial_states, out_dtype=out_dtype, state_cache=cache,
        final_state_indices=final_idx, last_chunk_indices=t["last_chunk_indices"] if cache is not None else None,
    )


THREE_SEQUENCES = ([0, 70, 5], [100, 40, 130])  # partial first chunks, one single-chunk sequence


@pytest.mark.parametrize("out_dtype", STATE_DTYPES, ids=str)
@pytest.mark.parametrize("with_initial", (True, False), ids=("init", "zero-init"))
@pytest.mark.parametrize("headdim", (5, 19))
def test_snapshot_kernel_matches_reference(out_dtype, with_initial, headdim, device, profile):
    meta, states, dA_cumsum = teacher_inputs(*THREE_SEQUENCES, headdim, device)
    g = torch.Generator().manual_seed(1)
    initial = torch.randn(meta.batch, H, headdim, N, generator=g).to(out_dtype).to(device) if with_initial else None
    base_k, cache_k = paged_cache(SLOTS, out_dtype, device, headdim=headdim, blank_slots=(1, 6))
    base_r, cache_r = paged_cache(SLOTS, out_dtype, device, headdim=headdim, blank_slots=(1, 6))
    finals = [6, -1, 1]  # shuffled slots into NaN rows, one padded sequence
    final_idx = index_view(finals, torch.int64, "block_table", device, column=2)

    got = run_snapshot_kernel(states, dA_cumsum, meta, initial_states=initial, out_dtype=out_dtype, cache=cache_k,
                              final_idx=final_idx, index_dtype=torch.int64)
    t = meta.tensors(device)
    want = chunked.state_passing(
        states, dA_cumsum, t["seq_idx"], initial_states=initial, out_dtype=out_dtype, state_cache=cache_r,
        final_state_indices=final_idx, last_chunk_indices=t["last_chunk_indices"], profile=profile,
    )
    assert_bits_equal(got, want.exiting, what=f"exiting states ({profile} profile)")
    assert_storage_equal(base_k, storage_bytes(base_r), what="cache storage after final-state writeback")


def test_reference_comparison_can_fail(device, profile):
    """Negative control: the same comparison against the other backend's profile (different exp and multiply-add
    rounding) is reported as a mismatch."""
    other = "cuda" if profile == "interpreter" else "interpreter"
    meta, states, dA_cumsum = teacher_inputs(*THREE_SEQUENCES, 19, device)
    got = run_snapshot_kernel(states, dA_cumsum, meta, initial_states=None, out_dtype=torch.float32)
    t = meta.tensors(device)
    want = chunked.state_passing(states.cpu(), dA_cumsum.cpu(), t["seq_idx"].cpu(), out_dtype=torch.float32,
                                 profile=other)
    with pytest.raises(Mismatch, match="differ in bits"):
        assert_bits_equal(got, want.exiting.to(device), what=f"exiting states vs the {other} profile")


def test_profile_argument_must_match_the_backend(device, profile):
    meta, states, dA_cumsum = teacher_inputs([0], [10], 5, device)
    other = "cuda" if profile == "interpreter" else "interpreter"
    with pytest.raises(ValueError, match="profile"):
        state_passing(states, dA_cumsum, meta.tensors(device)["seq_idx"], out_dtype=torch.float32, profile=other)


# ---- indexed vs snapshot kernels -------------------------------------------------------------------------------

INDEXED_CASES = {
    # name: (init slot, has initial state, final slot)
    "distinct-slots": (3, True, 5),
    "in-place": (4, True, 4),
    "masked-nan-slot": (1, False, 5),  # slot 1 holds NaN and must not leak
    "masked-in-place-nan": (1, False, 1),
    "negative-final": (3, True, -1),
}


PAST_LAST_ROW = 3.0


def run_indexed_and_snapshot(dtype, init_slot, has_init, final_slot, device, *, index_dtype=torch.int32,
                             layout="contiguous", contexts=(70,), tokens=(150,), headdim=5,
                             indexed=state_passing_indexed):
    """One sequence through both kernels on two identical caches.

    Returns (entering workspace, snapshot exiting states, snapshot initial state, indexed cache base, snapshot
    cache base)."""
    meta, states, dA_cumsum = teacher_inputs(list(contexts), list(tokens), headdim, device, seed=3)
    init_idx = index_view([init_slot], index_dtype, layout, device, column=1)
    final_idx = index_view([final_slot], index_dtype, layout, device, column=2)
    has = index_view([has_init], torch.bool, layout, device, column=3)

    base_s, cache_s = paged_cache(SLOTS, dtype, device, headdim=headdim, blank_slots=(1,))
    initial = torch_snapshot.gather_initial_states(cache_s, init_idx, has)
    exiting = run_snapshot_kernel(states, dA_cumsum, meta, initial_states=initial, out_dtype=dtype, cache=cache_s,
                                  final_idx=final_idx, index_dtype=index_dtype)

    base_i, cache_i = paged_cache(SLOTS, dtype, device, headdim=headdim, blank_slots=(1,))
    # The workspace with one more row after it: the last chunk's exiting state goes to the final slot only, so a
    # store past the last chunk shows there.
    rows = torch.full((meta.nchunks + 1, H, headdim, N), PAST_LAST_ROW, dtype=dtype, device=device)
    workspace = rows[:-1]
    indexed(states, dA_cumsum, state_cache=cache_i, init_slot_index=init_idx, has_initial_state=has,
            final_slot_index=final_idx, out=workspace)
    assert_bits_equal(rows[-1], torch.full_like(rows[-1], PAST_LAST_ROW), what="the row after the workspace")
    return workspace, exiting, initial, base_i, base_s


def assert_indexed_equals_snapshot(workspace, exiting, initial, base_i, base_s):
    """Entering state c equals the snapshot's exiting state c-1 (the initial state first); whole cache storage
    equal byte for byte."""
    shifted = torch.cat([initial, exiting[:-1]], dim=0)
    assert_bits_equal(workspace, shifted, what="indexed entering states vs snapshot exiting states shifted by one")
    assert_storage_equal(base_i, storage_bytes(base_s), what="cache storage, indexed vs snapshot")


@pytest.mark.parametrize("dtype", STATE_DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(INDEXED_CASES))
def test_indexed_kernel_equals_snapshot_kernel(dtype, case, device):
    assert_indexed_equals_snapshot(*run_indexed_and_snapshot(dtype, *INDEXED_CASES[case], device))


@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
def test_indexed_kernel_with_block_table_columns(index_dtype, device):
    assert_indexed_equals_snapshot(*run_indexed_and_snapshot(
        torch.bfloat16, 4, True, 4, device, index_dtype=index_dtype, layout="block_table"))


def test_indexed_kernel_single_chunk(device):
    assert_indexed_equals_snapshot(*run_indexed_and_snapshot(torch.float16, 3, True, 2, device, contexts=(0,),
                                                             tokens=(9,)))


# Chunk counts 1-9 (8 twice; last chunk full or partial): no, one and two whole groups of READ_AHEAD chunks, each
# followed by 0, 1, 2 and 3 chunks one at a time (kernels.state_passing.grouped_chunks).
GROUP_AND_TAIL_TOKENS = (Q - 3, 2 * Q, 3 * Q - 1, 4 * Q, 4 * Q + 1, 6 * Q, 7 * Q - 2, 7 * Q + 5, 8 * Q, 8 * Q + 5)


@pytest.mark.parametrize("tokens", GROUP_AND_TAIL_TOKENS, ids=lambda t: f"{t}tokens")
def test_indexed_kernel_across_read_ahead_groups(tokens, device):
    """The indexed kernel reads ``READ_AHEAD`` (4) chunks at once in whole groups, then the 0-3 left one at a time:
    every chunk's entering state, the last exiting state in the final slot only (nothing stored past the last
    chunk)."""
    assert sp_module.READ_AHEAD == 4
    assert_indexed_equals_snapshot(*run_indexed_and_snapshot(torch.bfloat16, 3, True, 5, device, contexts=(0,),
                                                             tokens=(tokens,)))


def assert_snapshot_kernel_writes_back_as_the_reference(meta, states, dA_cumsum, initial, finals, slots, device,
                                                        profile):
    """The snapshot kernel against the chunked reference, both writing back into their own paged cache of ``slots``
    rows (slot 0 blank) at ``finals`` (negative: a padded sequence): the exiting states and the whole cache storage,
    bit for bit."""
    base_k, cache_k = paged_cache(slots, torch.float32, device, headdim=3, blank_slots=(0,))
    base_r, cache_r = paged_cache(slots, torch.float32, device, headdim=3, blank_slots=(0,))
    final_idx = torch.tensor(finals, dtype=torch.int64, device=device)
    got = run_snapshot_kernel(states, dA_cumsum, meta, initial_states=initial, out_dtype=torch.float32, cache=cache_k,
                              final_idx=final_idx, index_dtype=torch.int64)
    t = meta.tensors(device)
    want = chunked.state_passing(
        states, dA_cumsum, t["seq_idx"], initial_states=initial, out_dtype=torch.float32, state_cache=cache_r,
        final_state_indices=final_idx, last_chunk_indices=t["last_chunk_indices"], profile=profile)
    assert_bits_equal(got, want.exiting, what=f"exiting states ({profile} profile)")
    assert_storage_equal(base_k, storage_bytes(base_r), what="cache storage after final-state writeback")


def tail_layouts():
    """(chunk count, chunks per sequence): for 1-9 chunks, every chunk its own sequence, one sequence, and runs of two
    and of three chunks, so that sequences start and end at every position of a group and of the chunks after the
    whole groups, and run from a group into them."""
    layouts = []
    for n in range(1, 10):
        for lengths in ([1] * n, [n], [2] * (n // 2) + [n % 2], [3] * (n // 3) + [n % 3]):
            lengths = [k for k in lengths if k]
            if (n, lengths) not in layouts:
                layouts.append((n, lengths))
    return layouts


@pytest.mark.parametrize(("nchunks", "lengths"), tail_layouts(), ids=lambda v: "-".join(map(str, v))
                         if isinstance(v, list) else f"{v}chunks")
def test_snapshot_kernel_restarts_and_writes_back_in_groups_and_after_them(nchunks, lengths, device, profile):
    """Sequence starts (a restart from the initial state) and ends (the final-state writeback, or none for a
    negative slot) in the whole groups of four chunks and in the 0-3 chunks after them, against the reference."""
    meta, states, dA_cumsum = teacher_inputs([0] * len(lengths), [k * Q for k in lengths], 3, device, seed=nchunks)
    assert meta.nchunks == nchunks
    initial = torch.randn(meta.batch, H, 3, N, generator=torch.Generator().manual_seed(7)).to(device)
    slots = 12
    finals = [-1 if b == 1 else (5 * b + 3) % slots for b in range(meta.batch)]  # distinct slots, one padded
    assert_snapshot_kernel_writes_back_as_the_reference(meta, states, dA_cumsum, initial, finals, slots, device,
                                                        profile)


def test_snapshot_kernel_restarts_and_writes_back_at_every_position_of_a_read_ahead_group(device, profile):
    """Sequences of 1, 2, 3, 4 and 5 chunks one after another: a sequence starts, and ends with its final-state
    writeback, at each of the four positions of a group of chunks read together, and across groups."""
    meta, states, dA_cumsum = teacher_inputs([0] * 5, [Q, 2 * Q, 3 * Q, 4 * Q, 5 * Q], 3, device, seed=5)
    assert meta.nchunks == 15
    initial = torch.randn(meta.batch, H, 3, N, generator=torch.Generator().manual_seed(2)).to(device)
    assert_snapshot_kernel_writes_back_as_the_reference(meta, states, dA_cumsum, initial, [2, 7, -1, 0, 4], SLOTS,
                                                        device, profile)


def test_the_indexed_kernel_refuses_a_workspace_over_its_chunk_states(device):
    """It reads chunks ahead of its stores, so an ``out`` that overlaps ``states`` would read what it wrote."""
    meta, states, dA_cumsum = teacher_inputs([0], [3 * Q], 4, device)
    _, cache = paged_cache(SLOTS, torch.float32, device, headdim=4)
    one = torch.zeros(1, dtype=torch.int64, device=device)
    with pytest.raises(AssertionError, match="out: must not overlap states"):
        state_passing_indexed(states, dA_cumsum, state_cache=cache, init_slot_index=one,
                              has_initial_state=one.bool(), final_slot_index=one, out=states)


def test_memory_overlaps_spans_views():
    base = torch.zeros(4, 8)
    assert sp_module.memory_overlaps(base[0], base[0, 7:])
    assert not sp_module.memory_overlaps(base[0], base[1])
    assert sp_module.memory_overlaps(base[:, 0], base[1])  # a strided column spans the rows between
    assert not sp_module.memory_overlaps(base[0], torch.zeros(8))
    assert not sp_module.memory_overlaps(base[:0], base)


def test_indexed_comparison_catches_a_leaked_masked_slot(device):
    """Negative control: an indexed kernel that ignores the mask reads the NaN slot; the comparison reports it."""

    def ignores_mask(*args, has_initial_state, **kwargs):
        return state_passing_indexed(*args, has_initial_state=torch.ones_like(has_initial_state), **kwargs)

    result = run_indexed_and_snapshot(torch.float32, *INDEXED_CASES["masked-nan-slot"], device, indexed=ignores_mask)
    with pytest.raises(Mismatch, match="entering states"):
        assert_indexed_equals_snapshot(*result)


def test_indexed_comparison_catches_a_wrong_final_slot(device):
    """Negative control: writing the final state one slot off changes the cache storage; the comparison reports it."""

    def off_by_one(*args, final_slot_index, **kwargs):
        return state_passing_indexed(*args, final_slot_index=final_slot_index + 1, **kwargs)

    result = run_indexed_and_snapshot(torch.float16, *INDEXED_CASES["distinct-slots"], device, indexed=off_by_one)
    with pytest.raises(Mismatch, match="cache storage"):
        assert_indexed_equals_snapshot(*result)
