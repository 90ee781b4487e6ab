"""Whole-call replay (``kernels.call_replay``): what a recording holds, what makes a call run as written, and that a
replay hands every binary what the call as written would.

Under the interpreter there is no binary (every launch takes Triton's path, so nothing is ever replayed): the logic is
tested with a fake runtime whose bindings are real ``Binding``s of fake binaries that record their launches. On the
GPU, the last test replays real ``ssd_prefill`` calls and compares their bits with Triton's path's.
"""

from __future__ import annotations

import pytest
import torch

from kernels import call_replay as cr
from kernels import direct_launch as dl


class FakeBinary:
    """A compiled kernel whose launcher records its arguments."""

    function = packed_metadata = None

    def __init__(self, name: str, runs: list):
        self.name, self.runs = name, runs

    def run(self, grid_0, grid_1, grid_2, stream, function, metadata, launch_metadata, enter, exit, *arguments):
        self.runs.append((self.name, (grid_0, grid_1, grid_2), stream, arguments))


class FakeKernel:
    """A stage kernel: its parameters in order, and Triton's path (``kernel[grid](**arguments)``) as a launch of
    its fake binary with the tensors' addresses."""

    def __init__(self, name: str, params: tuple[str, ...], runs: list):
        self.params, self.binary = params, FakeBinary(name, runs)

    def __getitem__(self, grid):
        def run(**arguments):
            values = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in (arguments[p] for p in self.params)]
            self.binary.run(*dl.launch_grid(grid, arguments), 7, None, None, None, None, None, *values)
            return self.binary
        return run


class FakeRuntime:
    """``TritonRuntime``'s methods over fake kernels: every binding is current unless ``stale``; ``watched`` sends
    every launch through Triton's path. A bound launch is ``TritonRuntime``'s own."""

    def __init__(self):
        self.watched, self.stale = False, set()

    def unwatched(self):
        return not self.watched

    def device(self):
        return 0

    def stream(self, device):
        return 7

    def bind(self, kernel, arguments, result, device):
        names = tuple(n for n, v in arguments.items() if isinstance(v, torch.Tensor))
        return dl.Binding(kernel.binary, None, None, None, None, None, device, kernel.params, {}, "", names)

    def current(self, binding):
        return binding.binary.name not in self.stale

    launch = dl.TritonRuntime.launch
    run_bound = dl.TritonRuntime.run_bound


RUNS: list = []
SCALE = FakeKernel("scale", ("x", "out", "n", "BLOCK"), RUNS)
SLOTS = FakeKernel("slots", ("slots", "mask", "ws", "n"), RUNS)


def fake_call(x, slots, *, out, n: int, mask=None, returns=False):
    """A call of two launches: an allocation, a view of an input and one of an allocation, a grid from the
    arguments."""
    ws = torch.empty((n, 2), dtype=torch.float32)
    mask = mask if mask is not None else ws.view(torch.uint8)
    dl.launch(SCALE, lambda meta: (meta["n"] // meta["BLOCK"],), dict(x=x, out=out[1:], n=n, BLOCK=4))
    dl.launch(SLOTS, (1,), dict(slots=slots, mask=mask, ws=ws[1:], n=n))
    return ws if returns else None


@pytest.fixture
def replays(monkeypatch):
    """A fresh launch cache over the fake runtime and fresh recordings; returns (replays, runtime, cache)."""
    RUNS.clear()
    runtime = FakeRuntime()
    cache = dl.LaunchCache(runtime)
    monkeypatch.setattr(dl, "LAUNCHES", cache)
    replays = cr.CallReplays()
    monkeypatch.setattr(cr, "REPLAYS", replays)
    return replays, runtime, cache


def inputs(n: int = 8, slots_dtype=torch.int32):
    return torch.randn(n), torch.arange(n, dtype=slots_dtype), torch.empty(n + 1)


def as_written(fn, *args, **kwargs):
    """The launches of one call as written (nothing recorded, nothing replayed)."""
    start = len(RUNS)
    cr.CallReplays(limit=0).call(fn, args, kwargs)
    return RUNS[start:]


def launches_of(replays, fn, *args, **kwargs):
    start = len(RUNS)
    result = replays.call(fn, args, kwargs)
    return RUNS[start:], result


def test_a_signatures_third_call_is_replayed_with_its_own_addresses(replays):
    replays, runtime, cache = replays
    for call in range(4):
        x, slots, out = inputs()
        got, _ = launches_of(replays, fake_call, x, slots, out=out, n=8)
        # Compare with the call as written on the same tensors, addresses and all: the allocation's address is the
        # only one that may differ (a fresh ``torch.empty``), so it is compared as the view's offset from it.
        want = as_written(fake_call, x, slots, out=out, n=8)
        assert [g[:3] for g in got] == [w[:3] for w in want] == [("scale", (2, 1, 1), 7), ("slots", (1, 1, 1), 7)]
        assert got[0][3] == want[0][3] == (x.data_ptr(), out.data_ptr() + 4, 8, 4)
        assert got[1][3][0] == slots.data_ptr() and got[1][3][3] == 8
        assert got[1][3][2] - got[1][3][1] == want[1][3][2] - want[1][3][1] == 8  # ws[1:] is 8 bytes into ws
        assert replays.replays == max(0, call - 1), call  # 1st: through Triton; 2nd: recorded; then replayed
    # The first call's two launches took Triton's path; every other launch, replayed or not, was direct.
    assert cache.through_triton == 2 and cache.direct == 2 * 7


def test_a_replay_returns_a_fresh_allocation_of_the_recorded_layout(replays):
    replays, _, _ = replays
    results = [launches_of(replays, fake_call, *inputs()[:2], out=inputs()[2], n=8, returns=True)[1]
               for _ in range(4)]
    assert replays.replays == 2
    assert all(r.shape == (8, 2) and r.stride() == (2, 1) and r.dtype == torch.float32 for r in results)
    assert len({r.data_ptr() for r in results}) == 4


def test_a_call_that_computes_with_torch_is_never_replayed(replays):
    replays, _, _ = replays

    def converts(x, slots, *, out, n):
        return fake_call(x, slots.to(torch.int32), out=out, n=n)

    for _ in range(4):
        x, slots, out = inputs(slots_dtype=torch.int64)
        got, _ = launches_of(replays, converts, x, slots, out=out, n=8)
        assert len(got) == 2
    assert replays.replays == 0
    assert "TensorBase.to" in next(iter(replays.refusals.values()))


def test_a_call_that_indexes_by_a_tensor_is_never_replayed(replays):
    """``x[index]`` with a tensor or a list index is a copy, not a view: its values are the call's work."""
    replays, _, _ = replays

    def picks(x, slots, index, *, out, n):
        return fake_call(x[index], slots[[0] * n], out=out, n=n)

    for _ in range(4):
        x, slots, out = inputs()
        got, _ = launches_of(replays, picks, x, slots, torch.randperm(8), out=out, n=8)
        assert len(got) == 2
    assert replays.replays == 0
    assert "__getitem__" in next(iter(replays.refusals.values()))


def test_a_launch_of_a_tensor_from_outside_the_call_is_never_replayed(replays):
    replays, _, _ = replays
    kept = torch.zeros(8, dtype=torch.uint8)

    def reads_a_global(x, slots, *, out, n):
        return fake_call(x, slots, out=out, n=n, mask=kept)

    for _ in range(4):
        launches_of(replays, reads_a_global, *inputs()[:2], out=inputs()[2], n=8)
    assert replays.replays == 0
    assert "neither an input, an allocation nor a view of one" in next(iter(replays.refusals.values()))


def test_a_watched_stale_or_reassigned_call_runs_as_written(replays, monkeypatch):
    replays, runtime, cache = replays

    def call():
        return launches_of(replays, fake_call, *inputs()[:2], out=inputs()[2], n=8)

    for _ in range(3):
        call()
    assert replays.replays == 1
    runtime.watched = True  # a guard: every launch through Triton's path, nothing replayed
    through = cache.through_triton
    call()
    assert replays.replays == 1 and cache.through_triton == through + 2
    runtime.watched = False
    call()
    assert replays.replays == 2
    runtime.stale.add("slots")  # Triton would launch something else: the call as written, recorded again
    call()
    assert replays.replays == 2
    runtime.stale.clear()
    call()
    assert replays.replays == 3
    # A module of kernels assigned to (a test's monkeypatch of a stage or a setting): every recording ends.
    from kernels import plan

    monkeypatch.setattr(plan, "PAIR_FROM_CHUNKS", plan.PAIR_FROM_CHUNKS + 1)
    call()  # as written, recorded again
    assert replays.replays == 3
    call()
    assert replays.replays == 4


def test_a_call_with_an_argument_no_signature_holds_runs_as_written(replays):
    """A dict (``ssd_prefill``'s ``workspace_out``, which the call fills) has no signature: never recorded."""
    replays, _, _ = replays

    def fills(x, slots, *, out, n, workspace_out):
        workspace_out["called"] = workspace_out.get("called", 0) + 1
        return fake_call(x, slots, out=out, n=n)

    seen: dict = {}
    for _ in range(4):
        got, _ = launches_of(replays, fills, *inputs()[:2], out=inputs()[2], n=8, workspace_out=seen)
        assert len(got) == 2
    assert seen["called"] == 4 and replays.replays == 0 and not replays.recordings


def test_the_signature_holds_shapes_strides_alignment_identity_and_values():
    x = torch.zeros(16)
    base = cr.call_signature(0, (x, x[:8]), {"n": 8})
    assert cr.call_signature(0, (torch.zeros(16), torch.zeros(8)), {"n": 8}) == base
    assert cr.call_signature(0, (torch.zeros(17), torch.zeros(8)), {"n": 8}) != base  # shape
    assert cr.call_signature(0, (torch.zeros(32)[::2], torch.zeros(8)), {"n": 8}) != base  # strides
    assert cr.call_signature(0, (torch.zeros(17)[1:], torch.zeros(8)), {"n": 8}) != base  # alignment
    assert cr.call_signature(0, (x, torch.zeros(8, dtype=torch.float64)), {"n": 8}) != base  # dtype
    assert cr.call_signature(0, (x, x[:8]), {"n": 9}) != base  # a value
    assert cr.call_signature(0, (x, x[:8]), {"n": 8.0}) != base  # a type
    assert cr.call_signature(1, (x, x[:8]), {"n": 8}) != base  # the device
    y = torch.zeros(16)
    assert cr.call_signature(0, (x, x), {"n": 8}) != cr.call_signature(0, (x, y), {"n": 8})  # identity


def test_one_tensor_passed_twice_is_not_replayed_for_two_tensors(replays):
    """A recording where one object was two arguments reads one address for both: a call with two distinct
    tensors has another signature, so each gets its own address."""
    replays, _, _ = replays
    for _ in range(3):
        x, _, out = inputs()
        launches_of(replays, fake_call, x, x, out=out, n=8)
    assert replays.replays == 1
    x, _, out = inputs()
    slots = torch.randn(8)  # x's layout, another object
    got, _ = launches_of(replays, fake_call, x, slots, out=out, n=8)
    assert replays.replays == 1 and got[1][3][0] == slots.data_ptr() != x.data_ptr()


def test_at_most_limit_signatures_are_kept_least_recently_called_out(replays):
    replays = cr.CallReplays(limit=2)  # the fixture's launch cache, these recordings
    for n in (8, 12, 8, 16):
        for _ in range(2):
            launches_of(replays, fake_call, *inputs(n)[:2], out=inputs(n)[2], n=n)
    assert [sig[-1][-1] for sig in replays.recordings] == [(int, 8), (int, 16)]


def test_ssd_prefill_is_replayed_and_gives_the_bits_of_tritons_path(device, monkeypatch):
    from harness.cases.builder import build_inputs
    from harness.triton_autotuner import launches_reported
    from harness.triton_launches import listening
    from kernels import provider
    from tests.support import direct_launch_cases

    one, batch = direct_launch_cases(device, "a replay launches compiled binaries: under the interpreter every "
                                             "launch takes Triton's path, so nothing is replayed (the tests above "
                                             "check the logic with fakes)")
    monkeypatch.setattr(cr, "REPLAYS", cr.CallReplays())

    def call(case, path, final_state=None):
        kw = build_inputs(case, device).kwargs(path=path, final_state=final_state)
        result = provider.ssd_prefill(**kw)
        return kw["out"].clone(), kw["state_cache"].clone(), result

    for case, path, final_state in ((one, "indexed", None), (one, "snapshot", None), (batch, "snapshot", None),
                                    (batch, "snapshot", "checkpoint")):
        monkeypatch.setattr(dl, "LAUNCHES", dl.TritonPath())
        expected = call(case, path, final_state)
        monkeypatch.setattr(dl, "LAUNCHES", dl.LaunchCache(dl.TritonRuntime()))
        before = cr.REPLAYS.replays
        got = [call(case, path, final_state) for _ in range(4)]
        assert cr.REPLAYS.replays == before + 2, (case.id, path, cr.REPLAYS.refusals)
        # The recompile guard's and the warmup recording's watcher (``JITFunction.run``), then the autotune guard's
        # (``Autotuner.run``; the chunk scan is autotuned): each sees the call's launches, none is replayed.
        seen: list = []
        with listening(lambda fn, args, kwargs, warmup, seen=seen: seen.append(fn)):
            got.append(call(case, path, final_state))
        assert cr.REPLAYS.replays == before + 2 and seen, "a watched call was replayed around the watcher"
        tuned: list = []
        with launches_reported(tuned.append):
            got.append(call(case, path, final_state))
        assert cr.REPLAYS.replays == before + 2 and tuned, "a call was replayed around the autotune guard"
        got.append(call(case, path, final_state))
        assert cr.REPLAYS.replays == before + 3, "unwatched again: replayed"
        for outputs in got:
            for a, b in zip(outputs, expected, strict=True):
                if a is None:
                    assert b is None
                    continue
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (case.id, path, final_state)


def test_real_calls_replay_what_they_would_launch_on_every_path():
    """``ssd_prefill`` on the GPU's code paths with fake binaries (``tests/replay_equivalence.py``, in a process of its
    own): on both paths, the fused and the paired states, aligned and offset caches, block-table index views, the
    checkpoint mode, fp32 odd shapes and the unfused plan, the replayed call's launches are the call's as written;
    a call with torch work (the torch gather, the returned mode's identity slots, int64 slots' copy) is never
    replayed."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(root)}

    def equivalence(*flags):
        proc = subprocess.run([sys.executable, "-m", "tests.replay_equivalence", *flags], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    results = equivalence()
    assert len(results) == 12 and sum(r["replayed"] for r in results.values()) == 9, results
    assert {name: r["differences"] for name, r in results.items() if r["differences"]} == {}
    # The negative control: a replay that gives every allocation's launches one allocation's address is caught on
    # every call that allocates more than one tensor and is replayed.
    broken = equivalence("--misplace-allocations")
    caught = {name for name, r in broken.items() if r["replayed"] and r["differences"]}
    assert caught == {name for name, r in results.items() if r["replayed"]}, broken
