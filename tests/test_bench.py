"""``python -m harness bench`` against a peer (harness.bench, harness.kernel_profile): the plumbing, on any device.

Timings need a GPU (notes/gpu-runs.md); everything around them is checked here with an injected timer on a fake
clock, fake providers and synthetic profiler events: calls alternate ours, peer, ours, peer round by round; both
providers get the same input tensors; the peer runs only its supported paths and only with ``path``; medians, bests
and ratios are computed from the rounds; kernel names map to stages (ours and vLLM's), unknown names stay
themselves; and on a machine without CUDA the command refuses with a message and a non-zero status.
"""

from __future__ import annotations

import contextlib
import json
import os
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from harness import bench, cli, kernel_profile
from harness.cuda_timing import HostTimeError, eager_host_us

# ---- fakes -----------------------------------------------------------------------------------------------------------


class FakeProvider:
    """Records every call's keywords (those ``FakeInputs`` gives, by name as a real provider takes them); ``gather`` is
    accepted only when ``extension`` is true (as by kernels:provider)."""

    def __init__(self, name, paths, extension):
        self.name, self.supported_paths, self.calls = name, frozenset(paths), []
        if extension:
            self.ssd_prefill = self._with_gather

    def ssd_prefill(self, *, x, case, path="auto"):
        self.calls.append({"x": x, "case": case, "path": path})

    def _with_gather(self, *, x, case, path="auto", gather="auto"):
        self.calls.append({"x": x, "case": case, "path": path, "gather": gather})


class FakeInputs:
    """What ``bench`` reads of the builder's inputs: ``kwargs(path=...)`` over one set of tensors."""

    def __init__(self, case):
        self.case, self.x = case, object()

    def kwargs(self, path=None):
        return {"x": self.x, "case": self.case.id, "path": path}


class FakeClock:
    """A timer on a clock that drifts by ``drift`` us per measurement. ``prepare`` makes one call (as a capture
    does); ``measure`` makes one call and returns the call's base time plus the drift so far."""

    def __init__(self, base_us: dict, drift: float = 0.0):
        self.base_us, self.drift, self.now, self.order = base_us, drift, 0.0, []

    def prepare(self, fn):
        fn()
        return fn

    def measure(self, fn):
        fn()
        label = self.label(fn)
        self.order.append(label)
        self.now += self.drift
        return self.base_us[label] + self.now

    def latency(self, fn):
        """A synchronized call: the host's launch latency (5 us here) on top of the device time."""
        return self.base_us[self.label(fn)] + self.now + 5.0

    def host(self, fn):
        """An eager call's host time: ten times the device time here, plus the drift so far."""
        fn()
        self.order.append(f"host {self.label(fn)}")
        return 10 * self.base_us[self.label(fn)] + self.now

    @staticmethod
    def label(fn) -> str:
        provider = fn.func.__self__
        return f"{provider.name} {fn.keywords.get('gather', fn.keywords['path'])}"


def ours():
    return FakeProvider("ours", {"snapshot", "indexed"}, extension=True)


def vllm_like():
    return FakeProvider("peer", {"snapshot"}, extension=False)


# ---- workloads and variants ------------------------------------------------------------------------------------------


def test_workloads_are_the_serving_shape_and_never_write_a_slot_they_read():
    assert list(bench.WORKLOADS) == ["short-continuation", "prefill-4256", "continue-600", "mixed-3"]
    for name in bench.WORKLOADS:
        case = bench.workload_case(name)
        assert (case.shape.nheads, case.shape.headdim, case.shape.dstate, case.shape.chunk_size) == (64, 64, 128, 256)
        assert case.cache.slots == 64 and str(case.dtype.io) == str(case.dtype.state) == "bfloat16"
        reads = {s.init_slot for s in case.sequences if s.has_state}
        writes = [s.final_slot for s in case.sequences]
        assert not reads & set(writes) and len(set(writes)) == len(writes), name
    mixed = bench.workload_case("mixed-3")
    assert [(s.context, s.tokens, s.has_state) for s in mixed.sequences] == [
        (4224, 32, True), (4224, 600, True), (0, 1600, False)]
    assert [(s.context, s.tokens) for s in bench.workload_case("continue-600").sequences] == [(4224, 600)]


def test_variants_follow_the_provider_and_the_case():
    short, mixed = bench.workload_case("short-continuation"), bench.workload_case("mixed-3")
    assert bench.default_variants(ours()) == ["snapshot-torch", "snapshot-fused", "indexed"]
    assert bench.default_variants(vllm_like()) == ["snapshot", "indexed"]  # no gather keyword: the plain paths
    runnable, skipped = bench.variants_for(ours(), ["snapshot-fused", "indexed"], mixed)
    assert [v for v, _ in runnable] == ["snapshot-fused"]
    assert len(skipped) == 1 and "bench-mixed-3 indexed" in skipped[0]
    runnable, skipped = bench.variants_for(vllm_like(), ["snapshot-fused", "indexed"], short)
    assert runnable == []
    assert "takes no gather keyword" in skipped[0] and "lacks the indexed path" in skipped[1]
    assert bench.counterpart("indexed", ["snapshot"]) == "snapshot"  # the peer's call where it lacks ours
    assert bench.counterpart("snapshot", ["indexed", "snapshot"]) == "snapshot"


# ---- whole calls, interleaved ----------------------------------------------------------------------------------------


def test_interleave_alternates_the_calls_round_by_round_and_keeps_every_round():
    a, b = ours(), vllm_like()
    entries = [bench.Entry("w", "ours", "snapshot-fused", {"path": "snapshot"}),
               bench.Entry("w", "peer", "snapshot", {"path": "snapshot"})]
    fns = [bench._call(a, FakeInputs(bench.workload_case("short-continuation")), bench.VARIANTS["snapshot-fused"]),
           bench._call(b, FakeInputs(bench.workload_case("short-continuation")), bench.PATH_VARIANTS["snapshot"])]
    clock = FakeClock({"ours fused": 10.0, "peer snapshot": 20.0}, drift=1.0)
    tunings = []

    @contextlib.contextmanager
    def fresh_tuning():
        tunings.append(("tuning", len(a.calls), len(b.calls)))
        yield
        tunings.append(("tuned", len(a.calls), len(b.calls)))

    bench.interleave(entries, fns, rounds=3, timer=clock, fresh_tuning=fresh_tuning)
    # Each call's eager host time right after its device times, in the same alternation.
    assert clock.order == ["ours fused", "host ours fused", "peer snapshot", "host peer snapshot"] * 3
    assert entries[0].samples == [11.0, 13.0, 15.0] and entries[1].samples == [22.0, 24.0, 26.0]
    assert entries[0].latency_samples == [16.0, 18.0, 20.0]  # measured right after each round's sample
    assert entries[0].host_samples == [101.0, 103.0, 105.0] and entries[1].host_samples == [202.0, 204.0, 206.0]
    assert (entries[0].median, entries[0].best) == (13.0, 11.0)
    assert (entries[0].host_median, entries[0].host_best) == (103.0, 101.0)
    # Each round prepares both calls afresh inside its own tuning block (one call each), then measures (two each:
    # the device time's and the eager host time's).
    assert tunings == [("tuning", 0, 0), ("tuned", 1, 1), ("tuning", 3, 3), ("tuned", 4, 4), ("tuning", 6, 6),
                       ("tuned", 7, 7)]
    assert len(a.calls) == 9 and len(b.calls) == 9


def test_a_call_whose_host_time_cannot_be_measured_keeps_its_device_times_and_says_why(capsys):
    class Waits(FakeClock):
        def host(self, fn):
            if self.label(fn).startswith("peer"):
                raise HostTimeError("a spin of 800000000 cycles ended before 25 eager calls were enqueued")
            return super().host(fn)

    inputs = FakeInputs(bench.workload_case("short-continuation"))
    entries = [bench.Entry("w", "ours", "indexed", {"path": "indexed"}),
               bench.Entry("w", "peer", "snapshot", {"path": "snapshot"})]
    fns = [bench._call(ours(), inputs, entries[0].call), bench._call(vllm_like(), inputs, entries[1].call)]
    clock = Waits({"ours indexed": 5.0, "peer snapshot": 6.0})
    bench.interleave(entries, fns, rounds=2, timer=clock)
    assert entries[1].samples == [6.0, 6.0] and entries[1].host_samples == []
    assert entries[1].host_error.startswith("HostTimeError: a spin of 800000000 cycles")
    assert clock.order.count("host peer snapshot") == 0  # not tried again once it failed
    assert entries[0].host_samples == [50.0, 50.0] and entries[0].host_error is None
    summary = bench.summarize(entries)
    assert summary["rows"][0]["host_ratio"] is None and summary["rows"][0]["ratio"] == pytest.approx(5.0 / 6.0)
    bench.print_table(summary)
    assert "  eager host time not measured: HostTimeError: a spin of 800000000" in capsys.readouterr().out


BENCHED: list[int] = []


def _counting_bench(kernel_call, quantiles=(0.5, 0.2, 0.8), **_):
    kernel_call()
    BENCHED.append(1)
    return [1.0] * len(quantiles) if quantiles else 1.0


@triton.autotune(configs=[triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})], key=["n"],
                 do_bench=_counting_bench)
@triton.jit
def _add_one_autotuned(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1.0, mask=offs < n)


def _launch_add_one(x):
    _add_one_autotuned[lambda meta: (triton.cdiv(16, meta["BLOCK"]),)](x, 16)


@pytest.fixture
def warm_disk_autotuning(device, monkeypatch, tmp_path):
    """``_add_one_autotuned`` with the disk cache of tuning results on (``TRITON_CACHE_AUTOTUNING=1``, which the GPU
    suite sets) in an empty cache folder, so its first tuning stores a result there and a later one is answered from
    it. On the GPU, Triton's own disk cache; under the interpreter, which never uses it (``Autotuner.__init__`` turns
    ``cache_results`` off there, and ``check_disk_cache`` needs a compiled kernel), a stand-in with its contract: a
    key stored answers without timing any config, a key not stored is timed and stored."""
    tuner = _add_one_autotuned
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(tuner, "cache", {})
    monkeypatch.setattr(tuner, "cache_results", True)
    if device == "cpu":
        stored = {}

        def check_disk_cache(tuning_key, configs, bench_fn):
            if tuning_key in stored:
                tuner.cache[tuning_key] = stored[tuning_key]
                return True
            bench_fn()
            stored[tuning_key] = tuner.cache[tuning_key]
            return False

        monkeypatch.setattr(tuner, "check_disk_cache", check_disk_cache, raising=False)
    return tuner


def test_tuned_afresh_tunes_every_autotuner_again_once_and_empties_the_providers_own_caches(device,
                                                                                            warm_disk_autotuning):
    """With the disk cache of tuning results warm (a result for the key stored, as an earlier process leaves it),
    a launch outside the block times nothing; inside, the autotuner times every config once, and the block reports
    them."""
    x = torch.zeros(16, device=device)
    BENCHED.clear()
    _launch_add_one(x)
    assert len(BENCHED) == 2  # both configs timed at the first launch, the result stored on disk
    warm_disk_autotuning.cache.clear()  # as a new process starts: only the disk remembers
    _launch_add_one(x)
    assert len(BENCHED) == 2  # answered from the disk cache: no timing
    own = {("some", "key"): "a config"}
    provider = SimpleNamespace(tuning_caches=lambda: [own])
    with bench.tuned_afresh([provider, ours()]) as timed:  # a provider without the hook has nothing to empty
        assert own == {}
        _launch_add_one(x)
        assert len(BENCHED) == 4  # tuned again at its first launch inside the block, the disk's result unread
        _launch_add_one(x)
        assert len(BENCHED) == 4  # and only once
    assert timed == {"_add_one_autotuned": [str(c) for c in warm_disk_autotuning.configs]}, timed
    _launch_add_one(x)
    assert len(BENCHED) == 4
    assert bool((x == 5 + 4).all()), x  # five launches, four timed trials: every one ran the kernel


def test_bench_reports_per_kernel_the_configs_timed_in_each_round():
    trials = [("w1", {"k": ["A", "B"], "peer_k": ["C"]}), ("w1", {"k": ["A", "B"]}), ("w2", {"k": ["B", "D"]})]
    by_kernel = bench.trials_by_kernel(trials)
    assert by_kernel == {"k": {"timed_per_round": [["w1", 2], ["w1", 2], ["w2", 2]], "configs": ["A", "B", "D"]},
                         "peer_k": {"timed_per_round": [["w1", 1]], "configs": ["C"]}}
    assert bench.trial_lines(by_kernel) == [
        "tuned afresh k: configs timed per round 2, 2, 2", "  timed k: A", "  timed k: B", "  timed k: D",
        "tuned afresh peer_k: configs timed per round 1", "  timed peer_k: C"]


def test_a_call_that_cannot_be_prepared_is_reported_and_the_others_still_run():
    class Failing(FakeClock):
        def prepare(self, fn):
            if self.label(fn).startswith("peer"):
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().prepare(fn)

    inputs = FakeInputs(bench.workload_case("short-continuation"))
    entries = [bench.Entry("w", "ours", "indexed", {"path": "indexed"}),
               bench.Entry("w", "peer", "snapshot", {"path": "snapshot"})]
    fns = [bench._call(ours(), inputs, e.call) if e.side == "ours" else bench._call(vllm_like(), inputs, e.call)
           for e in entries]
    bench.interleave(entries, fns, rounds=2, timer=Failing({"ours indexed": 5.0}))
    assert entries[0].samples == [5.0, 5.0] and entries[1].samples == []
    assert entries[1].error == "RuntimeError: operation not permitted when stream is capturing"
    summary = bench.summarize(entries)
    assert summary["rows"][0]["ratio"] is None and summary["rows"][1]["median_us"] is None


def test_bench_gives_both_providers_the_same_inputs_and_the_peer_its_paths_only():
    a, b = ours(), vllm_like()
    built = []

    def build(case, device):
        built.append((case.id, device))
        return FakeInputs(case)

    base = {"ours torch": 30.0, "ours fused": 24.0, "ours indexed": 20.0, "peer snapshot": 25.0}
    clock = FakeClock(base)
    entries, skipped = bench.bench(["short-continuation", "mixed-3"], bench.default_variants(a), a, b, rounds=2,
                                   timer=clock, build_inputs=build, device="cpu")
    assert built == [("bench-short-continuation", "cpu"), ("bench-mixed-3", "cpu")]  # one set of inputs each
    round_short = ["ours torch", "ours fused", "ours indexed", "peer snapshot"]
    assert [o for o in clock.order if not o.startswith("host ")] == (
        round_short * 2 + ["ours torch", "ours fused", "peer snapshot"] * 2)
    assert skipped == ["bench-mixed-3 indexed: " + bench.workload_case("mixed-3").indexed_eligible().reason]
    assert all("gather" not in call for call in b.calls) and {c["path"] for c in b.calls} == {"snapshot"}
    for workload in ("bench-short-continuation", "bench-mixed-3"):
        xs = {id(c["x"]) for c in a.calls + b.calls if c["case"] == workload}
        assert len(xs) == 1, workload  # the very same tensors for ours and the peer

    summary = bench.summarize(entries, skipped)
    rows = {(r["workload"], r["side"], r["variant"]): r for r in summary["rows"]}
    indexed = rows[("short-continuation", "ours", "indexed")]
    assert indexed["peer_variant"] == "snapshot" and indexed["ratio"] == pytest.approx(20.0 / 25.0)
    assert rows[("mixed-3", "ours", "snapshot-fused")]["best_ratio"] == pytest.approx(24.0 / 25.0)
    assert "ratio" not in rows[("mixed-3", "peer", "snapshot")]
    targets = summary["targets"]
    assert targets["short-continuation: indexed speedup vs torch.where (target >= 1.2)"] == pytest.approx(1.5)
    assert targets["short-continuation: our fastest (indexed) / the peer's, bests (target <= 0.9)"] == pytest.approx(
        20.0 / 25.0)
    # mixed-3 has no indexed variant: only our fastest call against the peer's, ratio of the bests
    assert [k for k in targets if k.startswith("mixed-3")] == [
        "mixed-3: our fastest (snapshot-fused) / the peer's, bests (target <= 0.9)",
        "mixed-3: our fastest (snapshot-fused) eager host time / the peer's, medians (target <= 0.5)"]
    assert targets["mixed-3: our fastest (snapshot-fused) / the peer's, bests (target <= 0.9)"] == pytest.approx(
        24.0 / 25.0)
    # The eager host time of the same call (ten times its device time on this clock), against the peer's: issue 54.
    assert indexed["host_ratio"] == pytest.approx(200.0 / 250.0) and indexed["host_median_us"] == 200.0
    assert targets["short-continuation: our fastest (indexed) eager host time / the peer's, medians (target <= 0.5)"] \
        == pytest.approx(200.0 / 250.0)


def test_ratios_are_of_medians_and_of_bests():
    e = bench.Entry("w", "ours", "snapshot-fused", {"path": "snapshot"}, samples=[10.0, 30.0, 12.0])
    p = bench.Entry("w", "peer", "snapshot", {"path": "snapshot"}, samples=[20.0, 8.0, 16.0])
    row = bench.summarize([e, p])["rows"][0]
    assert (row["median_us"], row["best_us"]) == (12.0, 10.0)
    assert row["ratio"] == pytest.approx(12.0 / 16.0) and row["best_ratio"] == pytest.approx(10.0 / 8.0)


def test_the_table_has_peer_columns_only_with_a_peer(capsys):
    e = bench.Entry("short-continuation", "ours", "indexed", {"path": "indexed"}, samples=[20.0],
                    host_samples=[90.0, 100.0, 80.0])
    p = bench.Entry("short-continuation", "peer", "snapshot", {"path": "snapshot"}, samples=[25.0],
                    host_samples=[200.0])
    bench.print_table(bench.summarize([e, p], ["bench-mixed-3 indexed: one sequence only"]))
    out = capsys.readouterr().out
    assert "ratio: ours / the peer's variant named" in out and "host ratio: of the host medians" in out
    assert "host us" in out.splitlines()[1] and "host ratio" in out.splitlines()[1]
    row = ("short-continuation   ours  indexed               20.0     20.0         -     90.0  snapshot    0.800x"
           "     0.800x     0.450x")
    assert row in out
    assert "short-continuation   peer  snapshot              25.0     25.0         -    200.0\n" in out
    assert ("short-continuation: our fastest (indexed) eager host time / the peer's, medians (target <= 0.5): "
            "0.4500") in out
    assert "skipped: bench-mixed-3 indexed: one sequence only" in out
    bench.print_table(bench.summarize([e]))
    out = capsys.readouterr().out
    assert "ratio" not in out
    assert "short-continuation   ours  indexed               20.0     20.0         -     90.0\n" in out


def test_the_eager_host_time_is_the_median_batch_each_behind_a_spin_that_outlasted_it():
    batches = []
    results = iter([None, 30.0, None, 10.0, 20.0])  # None: the spin ended before the batch was enqueued

    def batch(fn, calls, spin_cycles):
        batches.append((calls, spin_cycles))
        return next(results)

    from harness.cuda_timing import SPIN_CYCLES, SPIN_GROWTH

    untimed = []
    assert eager_host_us(lambda: untimed.append(len(batches)), calls=7, batches=3, batch=batch) == 20.0
    assert untimed == [0]  # one call before the first batch, outside every batch
    # A spin that ended early is lengthened for every batch after it and the batch is repeated.
    assert batches == [(7, SPIN_CYCLES), (7, SPIN_CYCLES * SPIN_GROWTH), (7, SPIN_CYCLES * SPIN_GROWTH),
                       (7, SPIN_CYCLES * SPIN_GROWTH ** 2), (7, SPIN_CYCLES * SPIN_GROWTH ** 2)]


def test_a_call_that_waits_for_the_device_gets_no_host_time():
    from harness.cuda_timing import SPIN_TRIES

    tries = []

    def batch(fn, calls, spin_cycles):
        tries.append(spin_cycles)
        return None

    with pytest.raises(HostTimeError, match="waits for the device"):
        eager_host_us(object, batch=batch)
    assert len(tries) == SPIN_TRIES and tries == sorted(tries) and len(set(tries)) == SPIN_TRIES


def test_on_the_gpu_a_call_that_enqueues_has_a_host_time_and_one_that_synchronizes_has_none(device):
    if device != "cuda":
        pytest.skip("the host time is measured behind a spin kernel on the GPU; its logic is tested above with fakes")
    x = torch.zeros(1 << 16, device="cuda")
    assert 0.0 < eager_host_us(lambda: x.add_(1.0)) < 1e5
    with pytest.raises(HostTimeError, match="waits for the device"):
        eager_host_us(lambda: x.sum().item())


# ---- stages by profiling ---------------------------------------------------------------------------------------------


def kernel(name: str, us: float, start: float = 0.0) -> FunctionEvent:
    return FunctionEvent(id=0, name=name, thread=0, start_us=start, end_us=start + us, device_type=DeviceType.CUDA)


def in_sequence(calls: list[tuple[str, float]]) -> list[FunctionEvent]:
    """Kernels (name, us) one after the other on the device, with no gap."""
    events, start = [], 0.0
    for name, us in calls:
        events.append(kernel(name, us, start))
        start += us
    return events


def host(name: str, us: float) -> FunctionEvent:
    return FunctionEvent(id=0, name=name, thread=0, start_us=0, end_us=us, device_type=DeviceType.CPU)


@pytest.mark.parametrize("name,stage", [
    ("_chunk_cumsum_kernel", "chunk_cumsum"), ("_chunk_cumsum_fwd_kernel", "chunk_cumsum"),
    ("_chunk_state_kernel", "chunk_state"), ("_chunk_state_fwd_kernel", "chunk_state"),
    ("_chunk_state_bmm_kernel", "chunk_state_bmm"), ("_chunk_cumsum_gather_kernel", "chunk_cumsum_gather"),
    ("_chunk_state_passing_kernel", "chunk_state_passing"), ("_state_passing_kernel", "state_passing"),
    ("_state_passing_batched_kernel", "state_passing"),
    ("_state_passing_indexed_kernel", "gather_state_passing"),
    ("_state_passing_fwd_kernel", "state_passing"), ("_bmm_chunk_kernel", "bmm_chunk"),
    ("_bmm_chunk_fwd_kernel", "bmm_chunk"), ("_chunk_scan_kernel", "chunk_scan"),
    ("_chunk_scan_fwd_kernel", "chunk_scan"), ("_gather_initial_states_kernel", "gather"),
    ("_chunk_scan_fwd_kernel_0d1d2d3d", "chunk_scan"),  # an older Triton's specialization suffix
    ("Memset (Device)", "Memset (Device)"),
    ("void at::native::index_elementwise_kernel<128, 4>", "void at::native::index_elementwise_kernel<128, 4>"),
    ("_chunk_scan_bwd_kernel", "_chunk_scan_bwd_kernel"),  # not a stage of the forward call
])
def test_kernel_names_map_to_stages(name, stage):
    assert kernel_profile.stage_of(name) == stage


def test_kernel_times_group_device_events_by_name_and_leave_host_events_and_annotations_out():
    annotation = FunctionEvent(id=0, name="ssd call", thread=0, start_us=0, end_us=120.0, device_type=DeviceType.CUDA,
                               is_user_annotation=True)
    events = [kernel("_chunk_scan_kernel", 90.0), kernel("_chunk_scan_kernel", 10.0, start=100),
              kernel("_gather_initial_states_kernel", 3.0, start=95), host("cudaGraphLaunch", 50.0),
              host("aten::where", 7.0), annotation]
    assert kernel_profile.kernel_times(events) == {"_chunk_scan_kernel": {"us": 100.0, "count": 2},
                                                   "_gather_initial_states_kernel": {"us": 3.0, "count": 1}}


def test_an_activity_that_overlaps_the_one_before_adds_only_the_time_after_it():
    """Programmatic dependent launch: chunk_state starts at 8 while cumsum runs to 10 and waits for it; it adds
    10..30 (20 us), not its 22 us, and the busy time stays the span (no idle, nothing counted twice). A kernel
    wholly inside another's time adds nothing."""
    events = [kernel("_chunk_cumsum_kernel", 10.0), kernel("_chunk_state_kernel", 22.0, start=8.0),
              kernel("Memset (Device)", 5.0, start=12.0), kernel("_chunk_scan_kernel", 10.0, start=31.0)]
    times = kernel_profile.kernel_times(events)
    assert {name: t["us"] for name, t in times.items()} == {
        "_chunk_cumsum_kernel": 10.0, "_chunk_state_kernel": 20.0, "Memset (Device)": 0.0, "_chunk_scan_kernel": 10.0}
    summary = kernel_profile.summarize_calls([kernel_profile.call_profile(events)])
    assert summary["span_us"] == 41.0 and summary["total_us"] == 40.0 and summary["idle_us"] == 1.0
    assert summary["timeline"][1] == ("_chunk_state_kernel", 8.0, 22.0)  # the timeline keeps what was measured


def test_profile_rounds_alternate_and_stages_are_medians_over_the_rounds():
    seen = []
    per_call = {"ours": [[kernel("_chunk_scan_kernel", 10.0)], [kernel("_chunk_scan_kernel", 14.0)],
                         [kernel("_chunk_scan_kernel", 12.0, start=5.0), kernel("Memset (Device)", 1.0, start=20.0)]],
                "peer": [[kernel("_chunk_scan_fwd_kernel", 20.0)]] * 3}

    def profile(run):
        label = run()
        seen.append(label)
        return per_call[label][sum(1 for s in seen if s == label) - 1]

    calls = kernel_profile.profile_rounds({"ours": lambda: "ours", "peer": lambda: "peer"}, 3, profile)
    assert seen == ["ours", "peer"] * 3
    ours, peer = (kernel_profile.summarize_calls(calls[k]) for k in ("ours", "peer"))
    assert ours["stages"] == {"chunk_scan": 12.0, "Memset (Device)": 0.0}  # absent from two rounds of three
    assert ours["total_us"] == 13.0 and ours["kernels"]["_chunk_scan_kernel"]["stage"] == "chunk_scan"
    rows = kernel_profile.compare(ours, peer)
    # spans 10, 14 and 16 (5 to 21): the third call idled 3 us between its two activities
    assert [(r["stage"], r["ours_us"], r["peer_us"]) for r in rows] == [
        ("chunk_scan", 12.0, 20.0), ("Memset (Device)", 0.0, None), ("total", 13.0, 20.0),
        ("idle between kernels", 0.0, 0.0), ("span", 14.0, 20.0)]
    assert rows[0]["ratio"] == pytest.approx(0.6) and rows[1]["ratio"] is None
    assert ours["timeline"] == [("_chunk_scan_kernel", 0.0, 10.0)]  # the first round's


def test_a_call_profile_measures_the_idle_time_between_device_activities():
    events = [kernel("_chunk_scan_kernel", 90.0, start=112.0), kernel("_chunk_cumsum_kernel", 2.0, start=100.0),
              host("cudaGraphLaunch", 50.0)]
    call = kernel_profile.call_profile(events)
    assert call["span_us"] == 102.0 and call["kernels"]["_chunk_scan_kernel"] == {"us": 90.0, "count": 1}
    assert call["timeline"] == [("_chunk_cumsum_kernel", 0.0, 2.0), ("_chunk_scan_kernel", 12.0, 90.0)]
    summary = kernel_profile.summarize_calls([call])
    assert summary["idle_us"] == 10.0
    assert kernel_profile.timeline_line(summary) == "chunk_cumsum 0.0+2.0  chunk_scan 12.0+90.0"
    assert kernel_profile.call_profile([host("cudaGraphLaunch", 5.0)]) == {"kernels": {}, "span_us": 0.0,
                                                                           "timeline": []}


OURS_CALL = [("_chunk_cumsum_kernel", 10.0), ("_bmm_chunk_kernel", 11.0), ("_gather_initial_states_kernel", 3.0),
             ("_chunk_state_passing_kernel", 62.0), ("_chunk_scan_kernel", 98.0)]
VLLM_CALL = [("_gather_initial_states_kernel", 3.0), ("_chunk_cumsum_fwd_kernel", 11.0),
             ("_chunk_state_fwd_kernel", 40.0), ("_state_passing_fwd_kernel", 25.0), ("_bmm_chunk_fwd_kernel", 12.0),
             ("_chunk_scan_fwd_kernel", 100.0)]


def test_peer_stage_comparison_profiles_graph_replays_of_both(capsys):
    a, b = ours(), vllm_like()

    class Graph:
        def __init__(self, fn):
            self.fn = fn

        def replay(self):
            return FakeClock.label(self.fn)

    def profile(run):
        label = run()
        if label.startswith("peer"):
            return in_sequence(VLLM_CALL)
        return in_sequence(OURS_CALL) + [host("cudaGraphLaunch", 5.0)]

    report = bench.bench_peer_stages(["short-continuation"], ["snapshot-fused", "indexed"], a, b, rounds=3,
                                     capture=Graph, profile=profile, build_inputs=lambda c, d: FakeInputs(c),
                                     device="cpu")
    assert [(t["variant"], t["peer_variant"], t["ours_source"], t["peer_source"]) for t in report["tables"]] == [
        ("snapshot-fused", "snapshot", "graph", "graph"), ("indexed", "snapshot", "graph", "graph")]
    rows = {r["stage"]: r for r in report["tables"][0]["rows"]}
    assert list(rows) == ["gather", "chunk_cumsum", "chunk_state", "chunk_state_passing", "state_passing",
                          "bmm_chunk", "chunk_scan", "chunk_state + state_passing", "gather + chunk_cumsum",
                          "states + bmm_chunk", "total", "idle between kernels", "span"]
    assert (rows["chunk_scan"]["ours_us"], rows["chunk_scan"]["peer_us"]) == (98.0, 100.0)
    # our fused kernel against the peer's two stages it does the work of
    assert (rows["chunk_state_passing"]["ours_us"], rows["chunk_state_passing"]["peer_us"]) == (62.0, None)
    assert (rows["chunk_state"]["ours_us"], rows["chunk_state"]["peer_us"]) == (None, 40.0)
    pair = rows["chunk_state + state_passing"]
    assert (pair["ours_us"], pair["peer_us"]) == (62.0, 65.0) and pair["ratio"] == pytest.approx(62.0 / 65.0)
    assert rows["total"]["ours_us"] == 184.0 and rows["total"]["ratio"] == pytest.approx(184.0 / 191.0)
    report["peer_name"] = "peer"
    kernel_profile.print_comparison(report)
    out = capsys.readouterr().out
    assert "== short-continuation: ours snapshot-fused vs peer snapshot" in out
    assert "chunk_scan                        98.0     100.0   0.98x" in out
    assert "above the peer's: none" in out
    sums = {r["stage"]: (r["ours_us"], r["peer_us"]) for r in report["tables"][0]["rows"]}
    assert sums["gather + chunk_cumsum"] == (13.0, 14.0) and sums["states + bmm_chunk"] == (73.0, 77.0)


def test_a_kernel_slowed_by_one_beside_it_reads_above_the_peer_while_its_group_does_not(capsys):
    """Ours runs the gather beside the cumsum: the cumsum, sharing the GPU, takes 12 us against the peer's 11 alone,
    and the gather adds only the 0.5 us it runs past the cumsum's end. The cumsum's row is above the peer's and is
    reported so; the group's row (12.5 against the peer's 3 + 11) is not."""
    ours_events = [kernel("_chunk_cumsum_kernel", 12.0), kernel("_gather_initial_states_kernel", 11.5, start=1.0),
                   kernel("_chunk_scan_kernel", 50.0, start=12.5)]
    peer_events = in_sequence([("_gather_initial_states_kernel", 3.0), ("_chunk_cumsum_fwd_kernel", 11.0),
                               ("_chunk_scan_fwd_kernel", 60.0)])
    ours, peer = (kernel_profile.summarize_calls([kernel_profile.call_profile(e)]) for e in (ours_events, peer_events))
    rows = kernel_profile.compare(ours, peer)
    by_stage = {r["stage"]: (r["ours_us"], r["peer_us"]) for r in rows}
    assert by_stage["chunk_cumsum"] == (12.0, 11.0) and by_stage["gather"] == (0.5, 3.0)
    assert by_stage["gather + chunk_cumsum"] == (12.5, 14.0) and "states + bmm_chunk" not in by_stage
    assert [r["stage"] for r in kernel_profile.rows_above(rows)] == ["chunk_cumsum"]
    table = {"workload": "w", "variant": "v", "peer_variant": "snapshot", "ours_source": "graph",
             "peer_source": "graph", "rounds": 1, "rows": rows, "ours": ours, "peer": peer}
    kernel_profile.print_comparison({"tables": [table], "peer_name": "peer"})
    assert "above the peer's: chunk_cumsum (+1.00 us)" in capsys.readouterr().out


def test_the_indexed_state_passing_is_compared_with_the_gather_and_the_state_passing_it_does_the_work_of():
    """The indexed kernel reads each initial state out of the cache by slot and stores its copy, the gather's work:
    it is a stage of its own, beside a row of the peer's gather and state passing summed, and in the group of the
    states with the peer's state passing alone (a group that charges ours the gather's read: it can only read
    above, never hide a row). A row of ours above that sum is still named."""
    ours_events = in_sequence([("_chunk_cumsum_kernel", 2.0), ("_chunk_state_kernel", 3.0),
                               ("_state_passing_indexed_kernel", 2.5), ("_chunk_scan_kernel", 4.0)])
    peer_events = in_sequence([("_gather_initial_states_kernel", 1.5), ("_chunk_cumsum_fwd_kernel", 2.0),
                               ("_chunk_state_fwd_kernel", 3.0), ("_state_passing_fwd_kernel", 2.3),
                               ("_chunk_scan_fwd_kernel", 6.0)])
    ours, peer = (kernel_profile.summarize_calls([kernel_profile.call_profile(e)]) for e in (ours_events, peer_events))
    rows = kernel_profile.compare(ours, peer)
    by_stage = {r["stage"]: (r["ours_us"], r["peer_us"]) for r in rows}
    assert by_stage["gather_state_passing"] == (2.5, None)
    assert by_stage["state_passing"][0] is None and by_stage["state_passing"][1] == pytest.approx(2.3)
    assert by_stage["gather + state_passing"] == pytest.approx((2.5, 3.8))
    assert by_stage["states + bmm_chunk"] == pytest.approx((5.5, 5.3))
    assert [r["stage"] for r in kernel_profile.rows_above(rows)] == ["states + bmm_chunk"]
    slow = in_sequence([("_chunk_cumsum_kernel", 2.0), ("_state_passing_indexed_kernel", 4.0)])
    rows = kernel_profile.compare(kernel_profile.summarize_calls([kernel_profile.call_profile(slow)]), peer)
    assert "gather + state_passing" in [r["stage"] for r in kernel_profile.rows_above(rows)]


def test_chunk_state_and_bmm_in_one_kernel_are_compared_with_the_two_stages_they_do_the_work_of():
    """Ours runs chunk state's and bmm's programs in one kernel: a stage of its own, beside a row of the peer's chunk
    state and bmm summed, and in the states' group. A kernel slower than that sum is named."""
    peer_events = in_sequence([("_chunk_cumsum_fwd_kernel", 2.0), ("_chunk_state_fwd_kernel", 3.0),
                               ("_state_passing_fwd_kernel", 2.0), ("_bmm_chunk_fwd_kernel", 2.4),
                               ("_chunk_scan_fwd_kernel", 6.0)])
    peer = kernel_profile.summarize_calls([kernel_profile.call_profile(peer_events)])
    for one_kernel_us, above in ((5.0, []), (5.6, ["chunk_state + bmm_chunk", "states + bmm_chunk"])):
        ours_events = in_sequence([("_chunk_cumsum_kernel", 2.0), ("_chunk_state_bmm_kernel", one_kernel_us),
                                   ("_state_passing_batched_kernel", 2.0), ("_chunk_scan_kernel", 4.0)])
        rows = kernel_profile.compare(kernel_profile.summarize_calls([kernel_profile.call_profile(ours_events)]),
                                      peer)
        by_stage = {r["stage"]: (r["ours_us"], r["peer_us"]) for r in rows}
        assert by_stage["chunk_state_bmm"] == (one_kernel_us, None)
        assert by_stage["chunk_state"] == (None, 3.0) and by_stage["bmm_chunk"][0] is None
        assert by_stage["chunk_state + bmm_chunk"] == pytest.approx((one_kernel_us, 5.4))
        assert by_stage["states + bmm_chunk"] == pytest.approx((one_kernel_us + 2.0, 7.4))
        assert [r["stage"] for r in kernel_profile.rows_above(rows)] == above


def test_the_cumsum_and_the_gather_in_one_kernel_are_compared_with_the_two_stages_they_do_the_work_of():
    """Ours runs the cumsum's and the gather's programs in one kernel: a stage of its own, beside a row of the
    peer's cumsum and gather summed, and in their side-by-side group. A kernel slower than that sum is named."""
    peer_events = in_sequence([("_gather_initial_states_kernel", 1.5), ("_chunk_cumsum_fwd_kernel", 2.0),
                               ("_chunk_state_fwd_kernel", 3.0), ("_chunk_scan_fwd_kernel", 6.0)])
    peer = kernel_profile.summarize_calls([kernel_profile.call_profile(peer_events)])
    for one_kernel_us, above in ((3.0, []), (3.6, ["chunk_cumsum + gather", "gather + chunk_cumsum"])):
        ours_events = in_sequence([("_chunk_cumsum_gather_kernel", one_kernel_us), ("_chunk_state_kernel", 2.5),
                                   ("_chunk_scan_kernel", 5.5)])
        rows = kernel_profile.compare(kernel_profile.summarize_calls([kernel_profile.call_profile(ours_events)]),
                                      peer)
        by_stage = {r["stage"]: (r["ours_us"], r["peer_us"]) for r in rows}
        assert by_stage["chunk_cumsum_gather"] == (one_kernel_us, None)
        assert by_stage["chunk_cumsum"] == (None, 2.0) and by_stage["gather"] == (None, 1.5)
        assert by_stage["chunk_cumsum + gather"] == pytest.approx((one_kernel_us, 3.5))
        assert by_stage["gather + chunk_cumsum"] == pytest.approx((one_kernel_us, 3.5))
        assert [r["stage"] for r in kernel_profile.rows_above(rows)] == above


def test_a_call_whose_graph_cannot_be_profiled_is_profiled_eagerly():
    a, b = ours(), vllm_like()

    def capture(fn):
        if fn.func.__self__ is b:
            raise RuntimeError("capture refused")
        return SimpleNamespace(replay=lambda: "graph")

    def profile(run):
        return [kernel("_chunk_scan_kernel", 1.0)] if run() == "graph" else [kernel("_chunk_scan_fwd_kernel", 2.0)]

    report = bench.bench_peer_stages(["prefill-4256"], ["snapshot-fused"], a, b, rounds=1, capture=capture,
                                     profile=profile, build_inputs=lambda c, d: FakeInputs(c), device="cpu")
    table = report["tables"][0]
    assert (table["ours_source"], table["peer_source"]) == ("graph", "eager")
    assert any("peer snapshot: graph capture failed (RuntimeError: capture refused)" in s for s in report["skipped"])

    silent = bench.bench_peer_stages(["prefill-4256"], ["snapshot-fused"], a, b, rounds=1,
                                     capture=lambda fn: SimpleNamespace(replay=lambda: None),
                                     profile=lambda run: [] if run() is None else [kernel("k", 1.0)],
                                     build_inputs=lambda c, d: FakeInputs(c), device="cpu")
    assert silent["tables"][0]["ours_source"] == "eager"
    assert any("saw no device activity" in s for s in silent["skipped"])


# ---- stages alone, against a peer ------------------------------------------------------------------------------------


class StagedProvider(FakeProvider):
    """A fake provider with the ``stage_launches`` hook: per path the stages it launches and, per round, each
    stage's time (us) for the fake timer. Every launch of a closure is recorded."""

    def __init__(self, name, paths, extension, stage_us):
        super().__init__(name, paths, extension)
        self.stage_us, self.launched = stage_us, []

    def stage_launches(self, *, x, case, path, gather=None):
        if path not in self.stage_us:
            raise NotImplementedError(f"no stage launches on the {path} path")
        return {stage: (lambda stage=stage: self.launched.append((path, stage)) or (self.name, path, stage))
                for stage in self.stage_us[path]}


def round_timer(providers):
    """``timer(fn, reps)``: the stage's time in the round this is (a stage is timed once a round)."""
    timed: dict = {}

    def timer(fn, reps):
        name, path, stage = fn()
        n = timed[(name, path, stage)] = timed.get((name, path, stage), -1) + 1
        return providers[name].stage_us[path][stage][n]
    return timer


def test_stages_alone_compare_each_stage_with_the_fused_pair_summed_and_no_side_by_side_groups(capsys):
    a = StagedProvider("ours", {"snapshot", "indexed"}, True, {
        "snapshot": {"gather": [1.0, 1.0, 1.0], "chunk_cumsum": [2.0, 9.0, 3.0], "bmm_chunk": [4.0, 4.0, 4.0],
                     "chunk_state_passing": [30.0, 31.0, 29.0], "chunk_scan": [50.0, 50.0, 50.0]},
        "indexed": {"chunk_cumsum": [2.0, 2.0, 2.0], "bmm_chunk": [4.0, 4.0, 4.0], "chunk_state": [20.0, 20.0, 20.0],
                    "gather_state_passing": [9.0, 9.0, 9.0], "chunk_scan": [50.0, 50.0, 50.0]}})
    b = StagedProvider("peer", {"snapshot"}, False, {
        "snapshot": {"gather": [2.0, 2.0, 2.0], "chunk_cumsum": [2.5, 2.5, 2.5], "chunk_state": [21.0, 21.0, 21.0],
                     "state_passing": [10.0, 10.0, 10.0], "bmm_chunk": [3.0, 3.0, 3.0],
                     "chunk_scan": [60.0, 60.0, 60.0]}})
    report = bench.bench_stages_alone(["short-continuation"], ["snapshot-fused", "indexed"], a, b, rounds=3, reps=7,
                                      timings={"back to back": (round_timer({"ours": a, "peer": b}), "20 a graph")},
                                      build_inputs=lambda c, d: FakeInputs(c), device="cpu")
    assert [(t["variant"], t["peer_variant"]) for t in report["tables"]] == [
        ("snapshot-fused", "snapshot"), ("indexed", "snapshot")]
    rows = {r["stage"]: (r["ours_us"], r["peer_us"]) for r in report["tables"][0]["rows"]}
    assert list(rows) == ["gather", "chunk_cumsum", "chunk_state", "chunk_state_passing", "state_passing",
                          "bmm_chunk", "chunk_scan", "chunk_state + state_passing", "sum of stages"]
    assert rows["chunk_cumsum"] == (3.0, 2.5)  # the median of the rounds: 2, 9, 3
    assert rows["chunk_state + state_passing"] == (30.0, 31.0) and rows["sum of stages"] == (88.0, 98.5)
    indexed = {r["stage"]: (r["ours_us"], r["peer_us"]) for r in report["tables"][1]["rows"]}
    # the indexed state passing against the peer's gather and state passing, whose work it does
    assert indexed["gather_state_passing"] == (9.0, None) and indexed["gather"] == (None, 2.0)
    assert indexed["state_passing"] == (None, 10.0) and indexed["gather + state_passing"] == (9.0, 12.0)
    # Each round launches every stage once before timing it (its tuning), ours then the peer's.
    assert a.launched.count(("snapshot", "chunk_scan")) == 6 and b.launched.count(("snapshot", "gather")) == 6
    bench.print_stages_alone(report)
    out = capsys.readouterr().out
    assert "(each stage alone, back to back: 20 a graph; us per launch, median of 3 rounds)" in out
    assert "above the peer's: chunk_cumsum (+0.50 us), bmm_chunk (+1.00 us)" in out


def test_stages_alone_time_each_way_into_a_table_of_its_own(capsys):
    """Each way of timing a stage alone (``timings``) gets its own table and its own line of rows above the
    peer's: a stage above back to back (warm L2) and below after a flush is shown as both, never merged."""
    a = StagedProvider("ours", {"snapshot", "indexed"}, True, {
        "indexed": {"chunk_cumsum": [2.0, 2.0], "state_passing": [9.0, 9.0]}})
    b = StagedProvider("peer", {"snapshot"}, False, {
        "snapshot": {"chunk_cumsum": [2.5, 2.5], "state_passing": [7.0, 7.0]}})
    flushed = {("ours", "indexed", "chunk_cumsum"): 3.0, ("ours", "indexed", "state_passing"): 14.0,
               ("peer", "snapshot", "chunk_cumsum"): 3.5, ("peer", "snapshot", "state_passing"): 15.0}
    timings = {"back to back": (round_timer({"ours": a, "peer": b}), "each after the one before"),
               "after an L2 flush": (lambda fn, reps: flushed[fn()], "each after a flush")}
    report = bench.bench_stages_alone(["short-continuation"], ["indexed"], a, b, rounds=2, reps=1, timings=timings,
                                      build_inputs=lambda c, d: FakeInputs(c), device="cpu")
    tables = {t["timing"]: {r["stage"]: (r["ours_us"], r["peer_us"]) for r in t["rows"]} for t in report["tables"]}
    assert list(tables) == ["back to back", "after an L2 flush"]
    assert tables["back to back"]["state_passing"] == (9.0, 7.0)
    assert tables["after an L2 flush"]["state_passing"] == (14.0, 15.0)
    assert tables["after an L2 flush"]["sum of stages"] == (17.0, 18.5)
    bench.print_stages_alone(report)
    out = capsys.readouterr().out
    assert "(each stage alone, after an L2 flush: each after a flush; us per launch, median of 2 rounds)" in out
    assert out.count("above the peer's: state_passing (+2.00 us)") == 1 and out.count("above the peer's: none") == 1


def test_stages_alone_without_the_hook_or_with_a_refusal_say_so_and_give_no_table():
    a = StagedProvider("ours", {"snapshot", "indexed"}, True, {"snapshot": {"chunk_scan": [1.0]}})
    hookless = vllm_like()
    report = bench.bench_stages_alone(["prefill-4256"], ["snapshot-fused"], a, hookless, rounds=1, reps=1,
                                      timings={"back to back": (round_timer({"ours": a}), "")},
                                      build_inputs=lambda c, d: FakeInputs(c),
                                      device="cpu")
    assert report["tables"] == [] and report["skipped"] == [
        "provider 'peer' has no stage_launches hook (docs/provider.md#optional-hooks): its stages are not timed alone"]
    refusing = StagedProvider("peer", {"snapshot"}, False, {})
    report = bench.bench_stages_alone(["prefill-4256"], ["snapshot-fused"], a, refusing, rounds=1, reps=1,
                                      timings={"back to back": (round_timer({"ours": a}), "")},
                                      build_inputs=lambda c, d: FakeInputs(c),
                                      device="cpu")
    assert report["tables"] == []
    assert report["skipped"] == ["prefill-4256 peer snapshot: no stage launches: no stage launches on the snapshot "
                                 "path"]


# ---- the command -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["bench"], ["bench", "--peer", "peers.vllm_ssd:provider", "--rounds", "3"],
    ["bench", "--stages", "--peer", "peers.vllm_ssd:provider", "--workload", "mixed-3"],
])
def test_without_cuda_bench_refuses_with_a_message(argv, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "bench: needs a CUDA device" in err and "nothing was timed" in err


@pytest.mark.parametrize("peer,message", [
    ("peers.vllm_ssd", "expected module:attr"),
    ("no_such_module_here:provider", "cannot import 'no_such_module_here'"),
])
def test_an_unusable_peer_spec_is_refused_before_anything_runs(peer, message, capsys):
    assert cli.main(["bench", "--peer", peer]) == 2
    assert message in capsys.readouterr().err


def test_rounds_must_be_positive(capsys):
    assert cli.main(["bench", "--rounds", "0"]) == 2
    assert "--rounds and --reps must be at least 1" in capsys.readouterr().err


def test_main_times_ours_against_the_peer_and_fails_when_nothing_was_timed(monkeypatch, capsys):
    """The command's wiring with the timing replaced: providers loaded by spec, the peer passed on, the exit
    status from what was measured."""
    from harness.backend import AUTOTUNE_CACHE_ENV
    from kernels.environment import AUTOTUNE_BUDGET_ENV

    monkeypatch.setenv(AUTOTUNE_CACHE_ENV, "1")
    monkeypatch.setenv(AUTOTUNE_BUDGET_ENV, "25,100")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "_meta", lambda args, peer: {"peer": args.peer})
    seen = {}
    ours_entry = {"samples": [], "error": "RuntimeError: capture refused"}

    from kernels import direct_launch

    launcher = direct_launch.TritonPath()
    launcher.direct, launcher.through_triton = 40, 5  # launches before the bench: not this run's
    monkeypatch.setattr(direct_launch, "LAUNCHES", launcher)

    def fake_bench(workloads, variants, provider, peer, rounds, timer, configs, trials):
        # The bench tunes for itself: no cached tuning results, the kernels' full budget.
        assert os.environ[AUTOTUNE_CACHE_ENV] == "0" and AUTOTUNE_BUDGET_ENV not in os.environ
        seen.update(workloads=workloads, variants=variants, peer=peer.name, rounds=rounds, reps=timer.reps)
        launcher.direct += 12
        launcher.through_triton += 3
        configs["_bmm_chunk_kernel"] = {"(256, 128)": ["BLOCK_SIZE_M: 64", "BLOCK_SIZE_M: 32"]}
        trials.append(("prefill-4256", {"_bmm_chunk_kernel": ["BLOCK_SIZE_M: 64", "BLOCK_SIZE_M: 32"]}))
        return [bench.Entry("prefill-4256", "ours", "indexed", {"path": "indexed"}, **ours_entry),
                bench.Entry("prefill-4256", "peer", "snapshot", {"path": "snapshot"}, samples=peer_samples)], []

    monkeypatch.setattr(bench, "bench", fake_bench)
    peer_samples = [1.0]
    assert bench.main(["--peer", "reference:provider", "--rounds", "3", "--reps", "7"]) == 1  # one call failed
    assert seen == {"workloads": list(bench.WORKLOADS), "variants": list(bench.VARIANTS), "peer": "reference",
                    "rounds": 3, "reps": 7}
    out = capsys.readouterr().out
    assert "graph capture failed: RuntimeError: capture refused" in out
    # Every config a key ran in the process, one line each (two processes' lines are what configs-diff compares).
    assert ("config _bmm_chunk_kernel (256, 128): BLOCK_SIZE_M: 64\n"
            "config _bmm_chunk_kernel (256, 128): BLOCK_SIZE_M: 32\n") in out
    # Whether our kernels took the direct launch path in this run (kernels.direct_launch), counted over the run only.
    assert ("our kernels' launches in this run: 12 direct, 3 through Triton's path (TritonPath); whole calls "
            "replayed: 0") in out
    # What tuning afresh timed: the trials per round, then each config timed.
    assert ("tuned afresh _bmm_chunk_kernel: configs timed per round 2\n"
            "  timed _bmm_chunk_kernel: BLOCK_SIZE_M: 64\n  timed _bmm_chunk_kernel: BLOCK_SIZE_M: 32\n") in out
    ours_entry.update(samples=[2.0], error=None)
    assert bench.main(["--peer", "reference:provider", "--workload", "prefill-4256"]) == 0
    assert "2.000x" in capsys.readouterr().out
    ours_entry.update(samples=[], error="RuntimeError: capture refused")
    peer_samples = []
    assert bench.main(["--peer", "reference:provider"]) == 2  # nothing was timed
    # ... and gives both settings back: a test run's later items keep the run's own.
    assert os.environ[AUTOTUNE_CACHE_ENV] == "1" and os.environ[AUTOTUNE_BUDGET_ENV] == "25,100"


def test_main_stages_against_a_peer_prints_the_profiled_and_the_alone_tables_and_writes_both(monkeypatch, capsys,
                                                                                                tmp_path):
    """``--stages --peer``: the profiled comparison and then each stage alone, with the same workloads, variants
    and rounds, both in the JSON; the exit status follows the profiled tables (the alone table needs a hook the
    peer may lack, and says so)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "_meta", lambda args, peer: {"peer": args.peer})
    calls = []
    row = {"stage": "chunk_scan", "ours_us": 1.0, "peer_us": 2.0, "ratio": 0.5}

    def fake_profiled(workloads, variants, provider, peer, rounds):
        calls.append(("profiled", workloads, variants, rounds))
        return {"peer_name": "reference", "tables": [], "skipped": []}

    def fake_alone(workloads, variants, provider, peer, rounds, reps, timings):
        calls.append(("alone", workloads, variants, rounds, reps, list(timings)))
        return {"peer_name": "reference", "rounds": rounds, "skipped": ["no hook"],
                "tables": [{"workload": workloads[0], "variant": variants[0], "peer_variant": "snapshot",
                            "timing": "back to back", "timing_note": "20 a graph", "rows": [row], "ours": {},
                            "peer": {}}]}

    monkeypatch.setattr(bench, "bench_peer_stages", fake_profiled)
    monkeypatch.setattr(bench, "bench_stages_alone", fake_alone)
    out_json = tmp_path / "stages.json"
    argv = ["--stages", "--peer", "reference:provider", "--workload", "mixed-3", "--rounds", "2", "--reps", "9",
            "--json", str(out_json)]
    assert bench.main(argv) == 2  # no profiled table: nothing was compared
    assert calls == [("profiled", ["mixed-3"], ["snapshot-fused"], 2),
                     ("alone", ["mixed-3"], ["snapshot-fused"], 2, 9, ["back-to-back", "after-L2-flush"])]
    out = capsys.readouterr().out
    assert "== mixed-3: ours snapshot-fused vs reference snapshot (each stage alone, back to back: 20 a graph" in out
    assert "skipped (stages alone): no hook" in out
    written = json.loads(out_json.read_text())
    assert written["alone"]["tables"][0]["rows"] == [row] and written["meta"] == {"peer": "reference:provider"}
    calls.clear()
    assert bench.main(argv + ["--alone-timing", "after-L2-flush"]) == 2
    assert calls[1][-1] == ["after-L2-flush"]  # only the way asked for


def test_main_stages_alone_times_one_way_and_refuses_two(monkeypatch, capsys):
    """``--stages`` without a peer times every stage and candidate config the one way ``--alone-timing`` names
    (default back to back) and says which in each heading; two ways are refused before anything runs."""
    from harness import stage_bench

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(bench, "_meta", lambda args, peer: {})
    asked = []

    def fake_bench_stages(provider, cases, variant, call, reps, timing):
        asked.append(timing)
        return {w: {"variant": variant, "timing": timing, "whole_call_graph_us": 1.0, "rows": []} for w in cases}

    monkeypatch.setattr(stage_bench, "bench_stages", fake_bench_stages)
    assert bench.main(["--stages", "--alone-timing", "after-L2-flush"]) == 0
    assert bench.main(["--stages"]) == 0
    assert asked == ["after-L2-flush", "back-to-back"]
    out = capsys.readouterr().out
    assert "== prefill-4256 (snapshot-fused, stages after-L2-flush): whole call 1.0 us" in out
    assert bench.main(["--stages", "--alone-timing", "back-to-back", "--alone-timing", "after-L2-flush"]) == 2
    assert asked == ["after-L2-flush", "back-to-back"]
    assert "give --alone-timing once" in capsys.readouterr().err


def test_time_stage_times_every_row_with_the_timer_given(monkeypatch):
    """``stage_bench.time_stage(..., timer)``: the tuner's pick, each forced config and the re-reading all come from
    the one timer (a flushed sweep is flushed throughout)."""
    from harness import stage_bench

    monkeypatch.setattr(stage_bench, "time_graph", lambda *a, **k: pytest.fail("the back-to-back timer was used"))
    seen = []
    rows = stage_bench.time_stage("gather", lambda: torch.zeros(2), None, [], reps=3,
                                  timer=lambda fn, reps: seen.append(reps) or 4.0)
    assert [r.graph_us for r in rows] == [4.0, 4.0] and seen == [3, 3]


# ---- the real providers ----------------------------------------------------------------------------------------------


def test_ours_and_vllms_adapter_take_the_calls_the_bench_makes(device, monkeypatch):
    """Through the bench's own plumbing, on small workloads of the same structure: ours in every variant and vLLM's
    adapter on its snapshot path get the same tensors, and their outputs agree (the adapter is given no ``gather``)."""
    from harness.checks.providers import ProviderError, load_provider
    from kernels import provider
    from tests.support import CHUNK16_SHAPE, make_case

    try:
        peer = load_provider("peers.vllm_ssd:provider")
    except ProviderError as exc:
        pytest.skip(f"vLLM's SSD ops are not available (python scripts/assemble_vllm_ops.py): {exc}")
    small = {"short-continuation": [(40, 8, 3, True, 5)],
             "mixed-3": [(40, 8, 3, True, 6), (40, 12, 4, True, 7), (0, 20, 5, False, 8)]}
    monkeypatch.setattr(bench, "workload_case", lambda name: make_case(small[name], slots=10, **CHUNK16_SHAPE,
                                                                       case_id=f"bench-{name}"))
    outputs = {}

    class OneCall:  # each call once (under the interpreter a call takes seconds)
        def prepare(self, fn):
            return fn

        def measure(self, fn):
            fn()
            owner = "peer" if getattr(fn.func, "__self__", None) is peer else "ours"
            outputs[(owner, fn.keywords["cu_seqlens"].numel() - 1, fn.keywords.get("gather", fn.keywords["path"]))] \
                = fn.keywords["out"].clone()
            return 1.0

        def latency(self, fn):
            return 1.0

        def host(self, fn):
            return 1.0

    entries, skipped = bench.bench(list(small), bench.default_variants(provider), provider, peer, rounds=1,
                                   timer=OneCall(), device=device)
    assert [(e.workload, e.side, e.variant, e.error) for e in entries] == [
        ("short-continuation", "ours", "snapshot-torch", None), ("short-continuation", "ours", "snapshot-fused", None),
        ("short-continuation", "ours", "indexed", None), ("short-continuation", "peer", "snapshot", None),
        ("mixed-3", "ours", "snapshot-torch", None), ("mixed-3", "ours", "snapshot-fused", None),
        ("mixed-3", "peer", "snapshot", None)]
    assert len(skipped) == 1 and skipped[0].startswith("bench-mixed-3 indexed:")
    for batch in (1, 3):
        theirs = outputs[("peer", batch, "snapshot")]
        for variant in ("torch", "fused") + (("indexed",) if batch == 1 else ()):
            torch.testing.assert_close(outputs[("ours", batch, variant)], theirs, rtol=1e-3, atol=1e-3)


def test_the_configs_our_kernels_run_are_recorded_per_tuning_key(device):
    """What two bench runs compare to show they ran the same binaries: each autotuned kernel's config per key."""
    from harness.cases.builder import build_inputs
    from kernels import bmm_chunk
    from tests.support import CHUNK16_SHAPE, make_case

    kw = build_inputs(make_case([(0, 20, 1, False, 2)], slots=3, **CHUNK16_SHAPE), device).kwargs(path="snapshot")
    bmm_chunk.bmm_chunk(kw["C"], kw["B"], 16, kw["cu_chunk_seqlens"])
    configs = bench.chosen_configs()["_bmm_chunk_kernel"]
    assert configs and all(key.startswith("(") and "BLOCK_SIZE_M" in config for key, config in configs.items())
    # The bench's log keeps every config a key ran over the rounds, once each.
    log = {"_bmm_chunk_kernel": {"(made-up key)": ["an earlier config"]}}
    bench.record_configs(log)
    bench.record_configs(log)
    assert log["_bmm_chunk_kernel"] == {"(made-up key)": ["an earlier config"],
                                        **{key: [config] for key, config in configs.items()}}
