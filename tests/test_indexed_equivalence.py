"""Indexed path vs snapshot path through ``ssd_prefill``, bit for bit (docs/exactness.md): output, whole cache storage,
and the indexed path's entering-state workspace vs the snapshot path's exiting states shifted by one chunk.
Plus the dispatch rules: explicit ``indexed`` on an ineligible call raises ValueError naming the reason, and ``auto``
on an ineligible call is the snapshot path."""

from __future__ import annotations

import pytest
import torch

from harness.cases.builder import build_inputs
from harness.cases.model import IndicesSpec
from harness.compare import Mismatch, assert_bits_equal, storage_bytes
from kernels import plan
from kernels import ssd as ssd_module
from kernels.interface import CallShape, choose_path
from kernels.ssd import ssd_prefill
from tests.support import make_case


def run(inputs, *, path, **extra):
    """One call; returns (returned, workspace dict)."""
    workspace: dict = {}
    returned = ssd_prefill(**inputs.kwargs(path=path), workspace_out=workspace, **extra)
    return returned, workspace


def run_both(case, device, path_a="snapshot", path_b="indexed", extra_a=None, extra_b=None):
    """The same case through two paths on identical copies of the inputs."""
    a = build_inputs(case, device)
    b = a.clone()
    ra, wa = run(a, path=path_a, **(extra_a or {}))
    rb, wb = run(b, path=path_b, **(extra_b or {}))
    return (a, ra, wa), (b, rb, wb)


def assert_same_results(first, second, label):
    """out, every byte of the cache storage, and the returned tensor (if any) bit for bit."""
    (a, ra, _), (b, rb, _) = first, second
    assert_bits_equal(b.out, a.out, what=f"out, {label}")
    assert_bits_equal(storage_bytes(b.cache_base), storage_bytes(a.cache_base), what=f"cache storage bytes, {label}")
    assert (ra is None) == (rb is None), f"{label}: one path returned a tensor, the other None"
    if ra is not None:
        assert_bits_equal(rb, ra, what=f"returned states, {label}")


def assert_indexed_equals_snapshot(snapshot, indexed):
    assert snapshot[2]["path"] == "snapshot" and indexed[2]["path"] == "indexed"
    assert_same_results(snapshot, indexed, "indexed vs snapshot")
    ws_s, ws_i = snapshot[2], indexed[2]
    shifted = torch.cat([ws_s["initial_states"], ws_s["states"][:-1]], dim=0)
    assert_bits_equal(ws_i["states"], shifted,
                      what="indexed entering-state workspace vs snapshot exiting states shifted by one chunk")


BLOCK_TABLE = dict(layout="block_table", columns=5, init_column=1, final_column=2, rows_before=3)
EQUIVALENCE_CASES = {
    # name: (sequence (context, tokens, init_slot, has_state, final_slot), io, state, indices)
    "distinct-fp32": ((70, 150, 2, True, 5), "float32", "float32", IndicesSpec()),
    "distinct-bf16-state-fp32": ((70, 150, 2, True, 5), "bfloat16", "float32", IndicesSpec()),
    "in-place-bf16": ((64, 130, 4, True, 4), "bfloat16", "bfloat16", IndicesSpec()),
    "in-place-fp16": ((3, 100, 4, True, 4), "float16", "float16", IndicesSpec(dtype="int64")),
    "masked-nan-slot": ((70, 90, 1, False, 5), "bfloat16", "bfloat16", IndicesSpec()),
    "masked-nan-in-place": ((70, 90, 1, False, 1), "float16", "float16", IndicesSpec()),
    "negative-final-slot": ((70, 90, 2, True, -1), "bfloat16", "float16", IndicesSpec()),
    "single-chunk": ((128, 40, 2, True, 6), "float32", "bfloat16", IndicesSpec()),
    "block-table-int32": ((70, 150, 2, True, 5), "bfloat16", "bfloat16", IndicesSpec(dtype="int32", **BLOCK_TABLE)),
    "block-table-int64": ((70, 150, 3, True, 3), "float16", "float16", IndicesSpec(dtype="int64", **BLOCK_TABLE)),
    "block-table-same-column": ((70, 100, 3, True, 3), "bfloat16", "float32",
                                IndicesSpec(dtype="int32", layout="block_table", columns=3, init_column=0,
                                            final_column=0, rows_before=2)),
}


# Either states plan on every case: one kernel computing and passing the states (a call of few chunks), or chunk
# state's kernel then the state passing kernel (a call of ``kernels.plan.PAIR_FROM_CHUNKS`` chunks and more).
STATES_FROM = {"fused": 1 << 30, "pair": 1}


@pytest.fixture(params=sorted(STATES_FROM))
def states(request, monkeypatch) -> str:
    monkeypatch.setattr(plan, "PAIR_FROM_CHUNKS", STATES_FROM[request.param])
    return request.param


@pytest.mark.parametrize("name", sorted(EQUIVALENCE_CASES))
def test_indexed_path_equals_snapshot_path(name, states, device):
    seq, io, state, indices = EQUIVALENCE_CASES[name]
    case = make_case([seq], io=io, state=state, indices=indices, case_id=name)
    snapshot, indexed = run_both(case, device)
    assert indexed[2]["plan"].states == snapshot[2]["plan"].states == states
    assert (indexed[2]["chunk_states"] is None) is (states == "fused")  # the fused kernel keeps them on chip
    assert_indexed_equals_snapshot(snapshot, indexed)


@pytest.mark.parametrize("gather", ("fused", "torch"))
def test_indexed_equals_snapshot_with_either_gather(gather, device):
    case = make_case([(70, 90, 3, True, 3)], io="bfloat16", state="bfloat16")
    assert_indexed_equals_snapshot(*run_both(case, device, extra_a={"gather": gather}))


# ---- negative controls -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("states", ["pair"], indirect=True)
def test_comparison_catches_an_indexed_kernel_that_reads_a_masked_slot(monkeypatch, states, device):
    real = ssd_module.state_passing_indexed

    def ignores_mask(*args, has_initial_state, **kwargs):
        return real(*args, has_initial_state=torch.ones_like(has_initial_state), **kwargs)

    monkeypatch.setattr(ssd_module, "state_passing_indexed", ignores_mask)
    case = make_case([EQUIVALENCE_CASES["masked-nan-slot"][0]], io="bfloat16", state="bfloat16")
    with pytest.raises(Mismatch, match="out, indexed vs snapshot"):
        assert_indexed_equals_snapshot(*run_both(case, device))


@pytest.mark.parametrize("states", ["fused"], indirect=True)
def test_comparison_catches_a_fused_kernel_that_reads_a_masked_slot(monkeypatch, states, device):
    """The fused kernel reading the initial state by slot with the mask ignored."""
    real = ssd_module.chunk_state_passing

    def ignores_mask(*args, has_initial_states=None, **kwargs):
        if kwargs.get("initial_state_indices") is not None:
            has_initial_states = torch.ones_like(has_initial_states)
        return real(*args, has_initial_states=has_initial_states, **kwargs)

    monkeypatch.setattr(ssd_module, "chunk_state_passing", ignores_mask)
    case = make_case([EQUIVALENCE_CASES["masked-nan-slot"][0]], io="bfloat16", state="bfloat16")
    with pytest.raises(Mismatch, match="out, indexed vs snapshot"):
        assert_indexed_equals_snapshot(*run_both(case, device))


def test_comparison_catches_a_chunk_scan_reading_entering_states_as_exiting(monkeypatch, device):
    real = ssd_module.chunk_scan

    def misreads(*args, states_are_entering=False, **kwargs):
        return real(*args, states_are_entering=False, **kwargs)

    monkeypatch.setattr(ssd_module, "chunk_scan", misreads)
    case = make_case([(70, 150, 2, True, 5)], io="float32", state="float32")
    with pytest.raises(Mismatch, match="out, indexed vs snapshot"):
        assert_indexed_equals_snapshot(*run_both(case, device))


# ---- dispatch ----------------------------------------------------------------------------------------------------

INELIGIBLE = {
    # name: (sequences, mode, extra kwargs, words the ValueError must contain)
    "two-sequences": ([(0, 50, 2, True, 5), (70, 40, 5, True, 2)], "direct", {}, "exactly one sequence"),
    "returned": ([(70, 50, 2, True, 5)], "returned", {}, "direct final-state writeback"),
    "checkpoint": ([(70, 50, 2, True, 5)], "checkpoint", {}, "intermediate states"),
    "workspace-dtype": ([(70, 50, 2, True, 5)], "direct", {"state_dtype": torch.float32}, "workspace dtype"),
}


@pytest.mark.parametrize("name", sorted(INELIGIBLE))
def test_explicit_indexed_on_ineligible_call_raises(name, device):
    seqs, mode, extra, reason = INELIGIBLE[name]
    inputs = build_inputs(make_case(seqs, mode=mode, io="bfloat16", state="bfloat16"), device)
    before = storage_bytes(inputs.cache_base)
    with pytest.raises(ValueError, match=reason):
        ssd_prefill(**inputs.kwargs(path="indexed"), **extra)
    assert_bits_equal(storage_bytes(inputs.cache_base), before, what="cache storage after a refused call")


AUTO_FALLBACKS = {
    "crossed-slots": ([(0, 60, 2, True, 5), (130, 70, 5, True, 2)], "direct"),
    "shared-init-slot": ([(0, 60, 3, True, 1), (70, 50, 3, True, 6)], "direct"),
    "checkpoint": ([(70, 100, 2, True, 2)], "checkpoint"),
    "returned": ([(70, 100, 2, True, 2)], "returned"),
}


@pytest.mark.parametrize("name", sorted(AUTO_FALLBACKS))
def test_auto_on_ineligible_call_is_the_snapshot_path(name, device):
    seqs, mode = AUTO_FALLBACKS[name]
    case = make_case(seqs, mode=mode, io="bfloat16", state="float16")
    first, second = run_both(case, device, path_a="auto", path_b="snapshot")
    assert first[2]["path"] == "snapshot"
    assert_same_results(second, first, "auto vs snapshot")
    # The other gather too: the fused Triton gather and the torch.where snapshot give the same call bits.
    other = "torch" if first[2]["gather"] == "fused" else "fused"
    auto, explicit = run_both(case, device, path_a="auto", path_b="snapshot", extra_b={"gather": other})
    assert_same_results(auto, explicit, f"auto ({auto[2]['gather']} gather) vs snapshot ({other} gather)")


def _call_shape(**overrides):
    fields = dict(batch=1, direct=True, intermediate=False, cache_dtype=torch.bfloat16, state_dtype=torch.bfloat16,
                  on_cuda=True)
    fields.update(overrides)
    return CallShape(**fields)


def test_auto_takes_indexed_only_on_cuda_when_eligible():
    assert choose_path("auto", _call_shape()) == "indexed"
    assert choose_path("auto", _call_shape(on_cuda=False)) == "snapshot"
    assert choose_path("indexed", _call_shape(on_cuda=False)) == "indexed"  # explicit: allowed on the interpreter
    assert choose_path("snapshot", _call_shape()) == "snapshot"
    for ineligible in (dict(batch=2), dict(direct=False), dict(intermediate=True), dict(state_dtype=torch.float32)):
        assert choose_path("auto", _call_shape(**ineligible)) == "snapshot", ineligible
        with pytest.raises(ValueError, match="path='indexed'"):
            choose_path("indexed", _call_shape(**ineligible))


@pytest.mark.gpu(reason="auto takes the indexed path only on CUDA")
@pytest.mark.parametrize("io,state", [("bfloat16", "bfloat16"), ("float16", "float16"), ("bfloat16", "float32")])
@pytest.mark.parametrize("seq", [(4224, 32, 3, True, 3), (4224, 600, 3, False, 5), (0, 1600, 2, True, -1)],
                         ids=("short-in-place", "masked", "negative-final"))
def test_auto_on_eligible_call_takes_indexed_on_cuda(io, state, seq, device):
    case = make_case([seq], io=io, state=state, headdim=64, nheads=8, dstate=128, chunk_size=256, ngroups=2,
                     slots=12, row_pad=64, offset=8, indices=IndicesSpec(dtype="int32", **BLOCK_TABLE))
    auto, snapshot = run_both(case, device, path_a="auto", path_b="snapshot")
    assert auto[2]["path"] == "indexed"
    assert_indexed_equals_snapshot(snapshot, auto)


@pytest.mark.parametrize("name", ["single-chunk", "distinct-bf16-state-fp32", "masked-nan-slot"])
def test_both_paths_launch_one_chunk_scan_binary(name, device):
    """The indexed path equals the snapshot path only if chunk scan's arithmetic is the same code: two binaries
    compiled with different path constexprs may give different fp32 (tf32) dot bits for equal operands (the H200
    did: notes/gpu-runs.md). Both paths must therefore launch chunk scan with one specialization key (computed as the
    GPU would, on any backend), the path being a runtime argument."""
    from harness.guards.specialization import recording_launches
    from kernels.chunk_scan import chunk_scan_kernel

    seq, io, state, indices = EQUIVALENCE_CASES[name]
    case = make_case([seq], io=io, state=state, indices=indices, case_id=name)
    keys = {}
    for path in ("snapshot", "indexed"):
        inputs = build_inputs(case, device)
        with recording_launches([chunk_scan_kernel]) as seen:
            ssd_prefill(**inputs.kwargs(path=path))
        assert seen, f"{path}: chunk scan was not launched"
        keys[path] = seen[-1]  # the chosen config's launch (earlier ones, if any, are autotuning trials)
    assert keys["snapshot"].key == keys["indexed"].key, (
        f"chunk scan specializations differ between paths:\n  snapshot {keys['snapshot'].describe()}\n"
        f"  indexed  {keys['indexed'].describe()}")
