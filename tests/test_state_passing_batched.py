"""The snapshot path's pair on calls of many chunks (``kernels.plan.states_pair``): chunk state, then the batched
state passing (``kernels.state_passing_batched``), must write the fused kernel's bits (``kernels.chunk_state_passing``)
in every final-state mode, dtype and loop shape, over masked initial states, crossed and negative slots; the
dispatch follows the chunk count only; and the comparison catches a batched kernel that walks the wrong chunks."""

from __future__ import annotations

import pytest
import torch

from harness.cases.builder import build_inputs
from harness.compare import Mismatch, assert_bits_equal
from kernels import plan, provider, ssd, state_passing_batched
from tests.support import CHUNK16_SHAPE, make_case

# A long new sequence, one continuing mid-chunk from a masked-off (NaN) slot, one continuing from the slot another
# sequence's final state goes to (crossed), and a padded sequence (negative final slot) of one chunk.
BATCH = [(0, 150, 1, False, 4), (20, 40, 2, True, 1), (9, 25, 4, True, 6), (5, 7, 3, True, -1)]
FUSED, PAIR = 1 << 30, 1


def snapshot_call(case, device, pair_from: int, monkeypatch) -> dict:
    """What one snapshot call writes and returns, with the pair from ``pair_from`` chunks."""
    monkeypatch.setattr(plan, "PAIR_FROM_CHUNKS", pair_from)
    inputs = build_inputs(case, device)
    ws: dict = {}
    result = provider.ssd_prefill(**inputs.kwargs(path="snapshot"), workspace_out=ws)
    written = {"out": inputs.out, "cache": inputs.state_cache, "workspace": ws["states"]}
    if result is not None:
        written["result"] = result
    return {"written": written, "pair": ws["chunk_states"] is not None}


def assert_same_writes(got: dict, expected: dict, what: str) -> None:
    assert got.keys() == expected.keys(), (sorted(got), sorted(expected))
    for name, tensor in expected.items():
        assert_bits_equal(got[name], tensor, what=f"{what}: {name}")


# Both loop shapes of the batched kernel: reading ahead from any chunk count, and never (a chunk a step).
LOOP_SHAPES = {"read-ahead": 0, "chunk-a-step": 1 << 30}


@pytest.mark.parametrize("mode", ["direct", "returned", "checkpoint"])
@pytest.mark.parametrize("io,state", [("bfloat16", "bfloat16"), ("float16", "float32"), ("float32", "float32")])
def test_the_pair_writes_the_fused_kernels_bits(io, state, mode, device, monkeypatch):
    """The fused kernel does not read ``READ_AHEAD_FROM`` (only the batched state passing does), so its call is
    made once and each loop shape's pair is compared with it."""
    batch = BATCH if mode == "direct" else [s[:4] + (5 + i,) for i, s in enumerate(BATCH)]  # slots unused there
    case = make_case(batch, io=io, state=state, mode=mode, slots=8, **CHUNK16_SHAPE)
    fused = snapshot_call(case, device, FUSED, monkeypatch)
    assert not fused["pair"]
    for loop, read_ahead_from in LOOP_SHAPES.items():
        monkeypatch.setattr(state_passing_batched, "READ_AHEAD_FROM", read_ahead_from)
        pair = snapshot_call(case, device, PAIR, monkeypatch)
        assert pair["pair"], loop
        assert_same_writes(pair["written"], fused["written"], f"pair ({loop}) vs fused kernel, {io}/{state} {mode}")


def test_the_dispatch_follows_the_chunk_count_only():
    assert [plan.states_pair(n) for n in (1, plan.PAIR_FROM_CHUNKS - 1, plan.PAIR_FROM_CHUNKS, 64)] == [
        False, False, True, True]
    from_ = state_passing_batched.READ_AHEAD_FROM
    assert state_passing_batched.read_ahead(from_ * 3, 3) and not state_passing_batched.read_ahead(from_ * 3 - 1, 3)


def test_the_shipped_threshold_runs_the_pair_on_a_call_of_that_many_chunks(device):
    """Without any override: a call of ``PAIR_FROM_CHUNKS`` chunks runs the pair, one chunk fewer the fused
    kernel (chunk 16: the sequence's tokens set its chunk count)."""
    ran = {}
    for n in (plan.PAIR_FROM_CHUNKS - 1, plan.PAIR_FROM_CHUNKS):
        case = make_case([(0, 16 * n, 1, False, 2)], io="float32", state="float32", **CHUNK16_SHAPE)
        inputs = build_inputs(case, device)
        ws: dict = {}
        provider.ssd_prefill(**inputs.kwargs(path="snapshot"), workspace_out=ws)
        assert ws["dA_cumsum"].shape[1] == n
        ran[n] = ws["chunk_states"] is not None
    assert ran == {plan.PAIR_FROM_CHUNKS - 1: False, plan.PAIR_FROM_CHUNKS: True}


def test_a_batched_kernel_walking_the_wrong_chunks_is_caught(device, monkeypatch):
    """Negative control: each sequence's last chunk passed one too early (its last chunk never stepped, the next
    sequence starting a chunk early) must differ from the fused kernel's bits."""
    case = make_case(BATCH, io="float32", state="float32", slots=8, **CHUNK16_SHAPE)
    fused = snapshot_call(case, device, FUSED, monkeypatch)
    real = ssd.state_passing_batched

    def early(states, dA_cumsum, last_chunk_indices, **kwargs):
        real(states, dA_cumsum, (last_chunk_indices - 1).clamp(min=0), **kwargs)

    monkeypatch.setattr(ssd, "state_passing_batched", early)
    pair = snapshot_call(case, device, PAIR, monkeypatch)
    with pytest.raises(Mismatch):
        assert_same_writes(pair["written"], fused["written"], "a batched kernel walking the wrong chunks")


def test_bad_arguments_are_refused_naming_the_argument(device):
    C, H, P, N, Q = 3, 2, 4, 16, 8
    states = torch.zeros(C, H, P, N, device=device)
    dA = torch.zeros(H, C, Q, device=device)
    last = torch.tensor([0, 2], dtype=torch.int32, device=device)
    init = torch.zeros(2, H, P, N, device=device)
    with pytest.raises(AssertionError, match="initial_states: expected \\(2, 2, 4, 16\\)"):
        state_passing_batched.state_passing_batched(states, dA, last, initial_states=init[:1],
                                                    out=torch.empty_like(states))
    with pytest.raises(AssertionError, match="out: must not overlap states"):
        state_passing_batched.state_passing_batched(states, dA, last, initial_states=init, out=states)
    with pytest.raises(AssertionError, match="final_state_indices: state_cache is needed"):
        state_passing_batched.state_passing_batched(states, dA, last, initial_states=init,
                                                    out=torch.empty_like(states), final_state_indices=last)
