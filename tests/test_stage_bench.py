"""``python -m harness bench --stages`` (harness.stage_bench): the stage closures it times reproduce the real call's
intermediates bit for bit (so the figures are of the work a call does), every candidate config is timed once, and a
config with non-finite output is never reported as the best. Timings themselves need the GPU (notes/gpu-runs.md)."""

from __future__ import annotations

import math

import pytest
import torch
import triton

from harness import stage_bench
from harness.cases.builder import build_inputs
from harness.compare import assert_bits_equal
from kernels import provider
from tests.support import CHUNK16_SHAPE, make_case

TWO = [(40, 70, 1, True, 4), (0, 33, 2, False, 6)]


ALIGNED = dict(row_pad=0, offset=0)  # cache rows 16-byte aligned: the gather runs in the cumsum's kernel


@pytest.mark.parametrize("path,extra,sequences,pair,layout", [
    ("snapshot", {"gather": "torch"}, TWO, False, {}),
    ("snapshot", {"gather": "fused"}, TWO, False, {}),
    ("snapshot", {"gather": "fused"}, TWO, False, ALIGNED),
    ("snapshot", {"gather": "fused"}, TWO, True, {}),
    ("indexed", {}, [(40, 150, 1, True, 4)], False, {}),
    ("indexed", {}, [(40, 150, 1, True, 4)], True, {}),
    ("indexed", {"unfused": True}, [(40, 150, 1, True, 4)], True, {}),
    ("snapshot", {"gather": "fused", "unfused": True}, TWO, False, ALIGNED),
], ids=["snapshot-torch", "snapshot-fused", "snapshot-fused-aligned", "snapshot-pair", "indexed", "indexed-pair",
        "indexed-pair-unfused", "snapshot-fused-aligned-unfused"])
def test_stage_closures_reproduce_the_call(path, extra, sequences, pair, layout, device, monkeypatch):
    from kernels import plan

    # The states as they run on calls of few chunks (one kernel) or of many (chunk state's kernel, then state passing).
    monkeypatch.setattr(plan, "PAIR_FROM_CHUNKS", 1 if pair else 1 << 30)
    case = make_case(sequences, io="bfloat16", state="bfloat16", **CHUNK16_SHAPE, **layout)
    inputs = build_inputs(case, device)
    expected_inputs = inputs.clone()
    workspace: dict = {}
    provider.ssd_prefill(**expected_inputs.kwargs(path=path), **extra, workspace_out=workspace)

    calls = stage_bench.stage_calls(provider, inputs, path, **extra)
    # Calls of few chunks run one states kernel (the indexed path's reading the initial state by slot), calls of
    # many chunk state's kernel apart from the state passing (the indexed path's doing the gather's copy). Where chunk
    # state runs apart, bmm's programs run in its kernel wherever both stages' configs are fixed (under the
    # interpreter always, on the GPU not at this shape) unless the plan is unfused. With the fused gather and aligned
    # cache rows the copy runs in the cumsum's kernel, again unless unfused.
    unfused = extra.get("unfused", False)
    one_kernel = pair and device == "cpu" and not unfused
    assert (workspace["chunk_state_bmm"] is not None) is one_kernel
    assert workspace["cumsum_gather"] is (bool(layout) and not unfused)
    states = ["chunk_state_bmm"] if one_kernel else ["bmm_chunk", "chunk_state"] if pair else ["bmm_chunk"]
    if path == "indexed":
        passing = "gather_state_passing" if pair else "chunk_state_passing"
    else:
        passing = "state_passing" if pair else "chunk_state_passing"
    gather = "gather" if "gather" in extra and not workspace["cumsum_gather"] else None
    cumsum = "chunk_cumsum_gather" if workspace["cumsum_gather"] else "chunk_cumsum"
    assert set(calls) == {cumsum, "chunk_scan", *states, passing} | ({gather} if gather else set()), (
        sorted(calls))
    assert_bits_equal(calls[cumsum][0](), workspace["dA_cumsum"], what=f"{cumsum} closure: dA_cumsum")
    for name in {"chunk_state", "chunk_state_bmm"} & set(states):
        assert_bits_equal(calls[name][0](), workspace["chunk_states"], what=f"{name} closure")
    if gather:  # the copy the call made, by the same function
        assert_bits_equal(calls[gather][0](), workspace["initial_states"], what=f"{gather} closure")
    assert_bits_equal(calls[passing][0](), workspace["states"], what=f"{passing} closure: workspace")
    inputs.out.fill_(math.nan)  # the scan closure must write every output element itself
    assert_bits_equal(calls["chunk_scan"][0](), expected_inputs.out, what="chunk_scan closure: out")


class FakeTuner:
    """The attributes of a triton Autotuner that forced_config and time_stage use."""

    def __init__(self, configs):
        self.configs, self.cache, self.best_config = list(configs), {}, configs[0]


def test_time_stage_times_each_config_once_and_never_picks_a_non_finite_one(monkeypatch):
    shipped = [triton.Config({"BLOCK_SIZE": 64}, num_warps=4), triton.Config({"BLOCK_SIZE": 128}, num_warps=4)]
    broken = triton.Config({"BLOCK_SIZE": 256}, num_warps=2)  # "miscompiles": writes NaN, and is the fastest
    tuner = FakeTuner(shipped)
    monkeypatch.setitem(stage_bench.EXTRA_CANDIDATES, "fake", [shipped[1], broken])  # a duplicate is timed once
    times = {"BS=64 s3 w4": 5.0, "BS=128 s3 w4": 4.0, "BS=256 s3 w2": 1.0}

    def fn():
        forced = tuner.configs[0] if len(tuner.configs) == 1 else None
        return torch.tensor([math.nan if forced is broken else 1.0])

    def fake_time_graph(call, reps, calls):
        assert calls == stage_bench.STAGE_CALLS  # a graph of one short launch reads the floor between graphs
        call()
        forced = tuner.configs[0] if len(tuner.configs) == 1 else None
        return times[stage_bench.describe(forced)] if forced is not None else 4.5

    monkeypatch.setattr(stage_bench, "time_graph", fake_time_graph)
    rows = stage_bench.time_stage("fake", fn, tuner, shipped, reps=3)

    # The tuner's own pick is read first and again last: two readings of one binary show the noise.
    assert [r.config for r in rows] == ["auto", "BS=64 s3 w4", "BS=128 s3 w4", "BS=256 s3 w2", "auto again"]
    assert [r.shipped for r in rows] == [True, True, True, False, True]
    assert [r.finite for r in rows] == [True, True, True, False, True]
    assert rows[0].chosen == rows[-1].chosen == "BS=64 s3 w4" and rows[0].graph_us == rows[-1].graph_us == 4.5
    assert tuner.configs == shipped  # forced configs restored
    best = stage_bench.best_rows([vars(r) for r in rows])
    assert best["fake"]["config"] == "BS=128 s3 w4"  # not the faster NaN-writing config


def test_untuned_stage_is_timed_as_fixed(monkeypatch):
    monkeypatch.setattr(stage_bench, "time_graph", lambda call, reps, calls: 2.0)
    rows = stage_bench.time_stage("gather", lambda: torch.zeros(2), None, [], reps=3)
    assert [(r.config, r.graph_us, r.finite, r.chosen) for r in rows] == [("fixed", 2.0, True, None),
                                                                            ("fixed again", 2.0, True, None)]


def test_the_proposal_is_the_config_with_the_least_summed_time_over_every_workload(capsys):
    def row(stage, config, us, finite=True):
        return {"stage": stage, "config": config, "graph_us": us, "finite": finite, "shipped": True, "chosen": None}

    report = {
        "short": {"variant": "v", "whole_call_graph_us": 20.0, "rows": [
            row("scan", "auto", 5.0), row("scan", "A", 4.0), row("scan", "B", 6.0), row("scan", "C", 1.0),
            row("scan", "auto again", 0.5), row("gather", "fixed", 1.0), row("gather", "fixed again", 1.3)]},
        "long": {"variant": "v", "whole_call_graph_us": 200.0, "rows": [
            row("scan", "auto", 100.0), row("scan", "A", 110.0), row("scan", "B", 90.0),
            row("scan", "C", 50.0, finite=False),  # C writes NaN on the long call: never proposed
            row("scan", "auto again", 60.0), row("gather", "fixed", 1.5)]},
    }
    proposal = stage_bench.propose(report)
    # A's 4 + 110 is more; the re-reading of the tuner's pick is no forced config, however fast it read
    assert proposal == {"scan": {"config": "B", "us": [6.0, 90.0], "sum_us": 96.0}}
    stage_bench.print_stage_report(report)
    out = capsys.readouterr().out
    assert "scan                   B" in out
    assert "gather                           1.0       1.3       1.0  fixed" in out  # both readings side by side
    assert "scan                             5.0       0.5       1.0  C" in out  # the best is a config
    assert "gather                           1.5         -" in out  # no re-reading here (an older report's row)


def test_a_graph_holds_as_many_launches_as_asked_and_time_is_per_launch(device):
    """``cuda_timing.time_graph(..., calls=N)``: the captured graph runs the call N times per replay (a stage alone
    in its graph would read the floor between queued graphs), and the figure is per call. Counted by a call that
    adds one to a device counter: the replays' total tells how many launches each replay held."""
    if device != "cuda":
        pytest.skip("needs a CUDA device: CUDA graphs exist only there")
    from harness.cuda_timing import QUEUED, time_graph

    counter = torch.zeros((), dtype=torch.int64, device="cuda")
    reps, calls, warmup = 2 * QUEUED, 7, 3
    us = time_graph(lambda: counter.add_(1), reps, warmup=warmup, calls=calls)
    torch.cuda.synchronize()
    eager = 3  # capture_graph's calls outside the graph
    assert int(counter) == eager + (warmup + reps) * calls
    assert math.isfinite(us) and us > 0


def test_time_after_is_the_pair_graph_less_the_before_graph_the_median_of_three_per_call(monkeypatch):
    """``cuda_timing.time_after``: one graph of (before, fn) pairs and one of ``before`` alone, read in turn three
    times; the median difference per call (one reading far off moves nothing)."""
    from harness import cuda_timing

    trace = []
    graphs = {}

    def fake_capture(fn, warmup=10, calls=1):
        trace.clear()
        fn()
        graphs[tuple(trace)] = calls
        return tuple(trace)

    readings = {("before", "fn"): iter([50.0, 80.0, 52.0]), ("before",): iter([20.0, 20.0, 21.0])}
    monkeypatch.setattr(cuda_timing, "capture_graph", fake_capture)
    monkeypatch.setattr(cuda_timing, "median_replay_us", lambda graph, reps: next(readings[graph]))
    us = cuda_timing.time_after(lambda: trace.append("before"), lambda: trace.append("fn"), reps=40, calls=10)
    assert graphs == {("before", "fn"): 10, ("before",): 10}
    assert us == pytest.approx(3.1)  # differences 30, 60, 31: the median, per call


def test_a_flushed_timing_launches_each_call_after_a_read_of_twice_l2(device):
    """``stage_bench.time_one_stage_flushed``: the stage runs ``FLUSHED_CALLS`` times per replay of its graph, and
    the flush reads a buffer of twice the device's L2. Counted by a call that adds one to a device counter."""
    if device != "cuda":
        pytest.skip("needs a CUDA device: CUDA graphs and an L2 to flush exist only there")
    from harness.cuda_timing import QUEUED

    counter = torch.zeros((), dtype=torch.int64, device="cuda")
    reps = 10 * QUEUED  # a fifth of them per reading, three readings
    us = stage_bench.time_one_stage_flushed(lambda: counter.add_(1), reps)
    torch.cuda.synchronize()
    warmup, eager = 10, 3  # capture_graph's replays before timing and its calls outside the graph
    assert int(counter) == (eager + (warmup + 3 * 2 * QUEUED) * stage_bench.FLUSHED_CALLS)
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    assert stage_bench.l2_flush().__self__.numel() * 4 == 2 * l2
    assert math.isfinite(us)
