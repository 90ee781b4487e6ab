"""Programmatic dependent launch (kernels/backend.py): every stage kernel waits for the kernel before it as its first
statement, the launch option and the kernel's switch always travel together, and on the GPU a call replayed in a CUDA
graph (where the launches overlap) gives the eager call's bits, replay after replay.

A kernel launched with ``launch_pdl`` that read or wrote before its wait would race with the kernel before it: that
is what the source check below pins (with a negative control), and what the GPU replays would show as differing
bits."""

from __future__ import annotations

import ast
import inspect
import math
import textwrap

import pytest
import torch

from harness.compare import assert_bits_equal
from kernels import backend, ssd
from kernels.specialization import base_jit_function, kernel_name
from kernels.warmup import ModelShape, plan, watched_kernels


def _is_call(stmt, name: str, args: list[str]) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and getattr(stmt.value.func, "id", None) == name
            and [getattr(a, "id", None) for a in stmt.value.args] == args)


def statements_before_the_wait(fn) -> list[str]:
    """The statements of a ``@triton.jit`` function's body that come before ``wait_for_previous_kernel(USE_PDL)``
    (its docstring aside), or ``["no wait"]`` when the body never calls it at its top level. A kernel that may run
    beside the one before it (kernels/backend.py: bmm) opens with ``wait_unless_overlapping(overlaps_previous,
    USE_PDL)`` instead and must then close with ``wait_at_end_if_overlapping(overlaps_previous, USE_PDL)`` (else
    ``["no closing wait"]``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    for i, stmt in enumerate(body):
        if _is_call(stmt, "wait_for_previous_kernel", ["USE_PDL"]):
            return [ast.unparse(s) for s in body[:i]]
        if _is_call(stmt, "wait_unless_overlapping", ["overlaps_previous", "USE_PDL"]):
            if not _is_call(body[-1], "wait_at_end_if_overlapping", ["overlaps_previous", "USE_PDL"]):
                return ["no closing wait"]
            return [ast.unparse(s) for s in body[:i]]
    return ["no wait"]


@pytest.mark.parametrize("kernel", watched_kernels(), ids=kernel_name)
def test_every_stage_kernel_waits_before_anything_else(kernel):
    fn = base_jit_function(kernel).fn
    assert "USE_PDL" in inspect.signature(fn).parameters
    assert statements_before_the_wait(fn) == [], f"{kernel_name(kernel)} does something before its wait"


def _short_name(kernel) -> str:
    return kernel_name(kernel).rsplit(".", 1)[-1]


def test_which_kernels_signal_early_and_which_may_overlap():
    """The early signal comes right after the (opening) wait, under ``signal_next``, in the kernels an overlapping
    one may follow; only bmm, the gather and the chunk state kernel take ``overlaps_previous`` (each may follow a
    kernel that writes nothing it reads: ``READS_FROM`` below)."""
    signalling, overlapping = [], []
    for kernel in watched_kernels():
        fn = base_jit_function(kernel).fn
        params = inspect.signature(fn).parameters
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
        signals = [i for i, stmt in enumerate(body) if _is_call(stmt, "let_next_kernel_start", ["signal_next",
                                                                                                 "USE_PDL"])]
        if "signal_next" in params or signals:
            waits = [i for i, stmt in enumerate(body) if _is_call(stmt, "wait_for_previous_kernel", ["USE_PDL"])
                     or _is_call(stmt, "wait_unless_overlapping", ["overlaps_previous", "USE_PDL"])]
            assert signals and signals[0] == waits[0] + 1, f"{kernel_name(kernel)}: the signal must follow the wait"
            signalling.append(_short_name(kernel))
        if "overlaps_previous" in params:
            overlapping.append(_short_name(kernel))
    assert sorted(signalling) == ["_bmm_chunk_kernel", "_chunk_cumsum_kernel", "_chunk_state_passing_kernel"]
    assert sorted(overlapping) == ["_bmm_chunk_kernel", "_chunk_state_kernel", "_gather_initial_states_kernel"]


LAUNCHERS = ("chunk_cumsum", "chunk_cumsum_gather", "bmm_chunk", "chunk_state", "chunk_state_bmm",
             "chunk_state_passing", "gather_initial_states", "gather_initial_states_torch", "state_passing_indexed",
             "state_passing_batched", "chunk_scan")


def recorded_launches(monkeypatch, device, path: str, tamper=None, **extra) -> tuple[list[tuple[str, bool, bool]],
                                                                                      object]:
    """((launcher, signal_next, overlaps_previous) of each stage launch, the plan) of one ``ssd_prefill`` call on
    ``path``: the short bench workload at an interpreter-sized shape (one sequence over two chunks, from an initial
    state). ``path`` "snapshot-pair" / "indexed-pair": the path as it runs on calls of many chunks (chunk state's
    kernel, then a state passing kernel). ``tamper`` {launcher: wrap}: how ``ssd_prefill`` calls that launcher is
    changed before it is recorded. ``extra``: further ``ssd_prefill`` keywords."""
    import dataclasses

    from harness.bench import workload_case
    from harness.cases.builder import build_inputs
    from harness.cases.model import SequenceSpec, Shape
    from kernels import plan, provider

    case = dataclasses.replace(workload_case("short-continuation"), shape=Shape(2, 4, 16, 1, 16),
                               sequences=(SequenceSpec(16, 20, 3, True, 5),))
    launches = []

    def recording(name, fn):
        def wrapper(*args, **kwargs):
            launches.append((name, kwargs.get("signal_next", False), kwargs.get("overlaps_previous", False)))
            return fn(*args, **kwargs)
        return wrapper

    if path.endswith("-pair"):
        monkeypatch.setattr(plan, "PAIR_FROM_CHUNKS", 1)
        path = path.removesuffix("-pair")
    for name in LAUNCHERS:
        monkeypatch.setattr(ssd, name, recording(name, getattr(ssd, name)))
    for name, wrap in (tamper or {}).items():
        monkeypatch.setattr(ssd, name, wrap(getattr(ssd, name)))
    if path == "snapshot":
        extra.setdefault("gather", "fused")  # the copy that can overlap, on any device
    ws: dict = {}
    provider.ssd_prefill(**build_inputs(case, device).kwargs(path=path), **extra, workspace_out=ws)
    return launches, ws["plan"]


# The launchers whose outputs each launcher reads, within one ``ssd_prefill`` call (a launcher absent reads none).
CUMSUM = {"chunk_cumsum", "chunk_cumsum_gather"}
READS_FROM = {
    "chunk_state": CUMSUM,
    "chunk_state_passing": {*CUMSUM, "gather_initial_states", "gather_initial_states_torch"},
    "chunk_state_bmm": CUMSUM,
    "state_passing_indexed": {*CUMSUM, "chunk_state", "chunk_state_bmm"},
    "state_passing_batched": {*CUMSUM, "chunk_state", "chunk_state_bmm", "gather_initial_states",
                              "gather_initial_states_torch"},
    "chunk_scan": {*CUMSUM, "bmm_chunk", "chunk_state_bmm", "chunk_state_passing", "state_passing_indexed",
                   "state_passing_batched", "gather_initial_states", "gather_initial_states_torch"},
}


def misplaced_overlaps(launches: list[tuple[str, bool, bool]]) -> list[str]:
    """The overlapping launches that do not come right after a launch that signalled, or that read what it
    writes."""
    return [name for i, (name, _, overlaps) in enumerate(launches)
            if overlaps and not (i > 0 and launches[i - 1][1]
                                 and launches[i - 1][0] not in READS_FROM.get(name, set()))]


@pytest.mark.parametrize("launcher", ["bmm_chunk"])
def test_a_launch_that_would_overlap_and_signal_is_refused(launcher, device):
    """``check_overlap_flags`` in the launcher that takes both flags: an overlapping kernel waits at its end, so an
    early signal from it would let the next kernel start before the kernel it overlaps is done. Either flag alone,
    or neither, launches."""
    from kernels.bmm_chunk import bmm_chunk
    from kernels.chunk_cumsum import chunk_cumsum
    from kernels.chunk_state import chunk_state

    T, H, P, G, N, Q = 8, 2, 16, 1, 16, 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, H, P, generator=g).to(device=device, dtype=torch.float16)
    B = torch.randn(T, G, N, generator=g).to(device=device, dtype=torch.float16)
    cu = torch.tensor([0, T], dtype=torch.int32, device=device)
    dA_cumsum, dt_out = chunk_cumsum(torch.rand(T, H, device=device), -torch.rand(H, device=device), Q, cu)

    def launch(**flags):
        if device == "cuda":  # nothing before it signalled: let the inputs be complete before an overlapping launch
            torch.cuda.synchronize()
        if launcher == "bmm_chunk":
            return bmm_chunk(B, B, Q, cu, **flags)
        return chunk_state(B, x, dt_out, dA_cumsum, cu, **flags)

    with pytest.raises(AssertionError, match="cannot also signal the next one early"):
        launch(signal_next=True, overlaps_previous=True)
    for flags in ({}, {"signal_next": True}, {"overlaps_previous": True}):
        launch(**flags)
    if launcher == "bmm_chunk":
        launch_state = lambda: chunk_state(B, x, dt_out, dA_cumsum, cu, overlaps_previous=True)  # noqa: E731
        if device == "cuda":
            torch.cuda.synchronize()
        launch_state()  # chunk state only overlaps: it takes no early signal


def test_the_launch_check_sees_an_overlap_on_what_the_kernel_before_writes():
    """Negative control of the data-flow half: the chunk state kernel beside the cumsum, whose output it reads."""
    assert misplaced_overlaps([("chunk_cumsum", True, False), ("chunk_state", False, True)]) == ["chunk_state"]
    assert misplaced_overlaps([("bmm_chunk", True, False), ("chunk_state", False, True)]) == []


# Every plan the shipped rule makes on this call's shape, and the unfused one: (path, ssd_prefill keywords, what the
# test forces). "no-one-kernel": chunk state's and bmm's configs cannot share a kernel (the GPU at this shape; under
# the interpreter they always can).
PLANS = {
    "snapshot-aligned": ("snapshot", {}, set()),
    "snapshot-unaligned": ("snapshot", {}, {"unaligned"}),
    "snapshot-torch": ("snapshot", {"gather": "torch"}, set()),
    "snapshot-pair": ("snapshot-pair", {}, set()),
    "snapshot-pair-unaligned-no-one-kernel": ("snapshot-pair", {}, {"unaligned", "no-one-kernel"}),
    "indexed": ("indexed", {}, set()),
    "indexed-pair": ("indexed-pair", {}, set()),
    "indexed-pair-no-one-kernel": ("indexed-pair", {}, {"no-one-kernel"}),
    "snapshot-unfused": ("snapshot", {"unfused": True}, set()),
    "indexed-pair-unfused": ("indexed-pair", {"unfused": True}, set()),
}


def forced(monkeypatch, forces: set) -> None:
    if "unaligned" in forces:
        monkeypatch.setattr(ssd, "cumsum_gather_fuses", lambda cache: False)
    if "no-one-kernel" in forces:
        monkeypatch.setattr(ssd, "chunk_state_bmm_config", lambda *shape: None)


@pytest.mark.parametrize("name", list(PLANS))
def test_ssd_prefill_launches_its_plan_and_overlaps_only_after_a_signal(monkeypatch, device, name):
    """The call launches exactly the plan's kernels, in its order. What makes a late wait safe is the overlapping
    kernel's place: right after a kernel that waited for everything before it, then signalled, and writes nothing
    the overlapping one reads. Every plan launches an overlapping kernel (bmm, the gather, chunk state) only there,
    bmm once (alone or in chunk state's kernel), and the unfused plan nothing beside anything."""
    path, extra, forces = PLANS[name]
    forced(monkeypatch, forces)
    launches, p = recorded_launches(monkeypatch, device, path, **extra)
    names = [n for n, _, _ in launches if n != "gather_initial_states_torch"]
    assert tuple(names) == p.kernels, (names, p)
    bmm = [i for i, n in enumerate(names) if n in ("bmm_chunk", "chunk_state_bmm")]
    assert len(bmm) == 1 and bmm[0] < names.index("chunk_scan"), names
    assert misplaced_overlaps(launches) == [], launches
    expected = {"gather_initial_states": p.gather == "beside_cumsum", "bmm_chunk": p.bmm == "after_states",
                "chunk_state": p.bmm == "before_chunk_state"}
    assert {n for n, _, overlaps in launches if overlaps} == {k for k, v in expected.items() if v}, (launches, p)
    if extra.get("unfused"):
        assert not any(signal or overlaps for _, signal, overlaps in launches), launches


def test_the_shipped_plan_on_the_interpreter_runs_the_fewest_kernels(monkeypatch, device):
    """Under the interpreter both stages' configs are always fixed: wherever chunk state runs as a kernel of its own,
    bmm's programs run in it; on calls of few chunks both paths run the fused states kernel with bmm beside it."""
    if device != "cpu":
        pytest.skip("on the GPU, chunk state's and bmm's configs share a kernel only at checked-in shapes")
    expected = {
        "snapshot": ("chunk_cumsum_gather", "chunk_state_passing", "bmm_chunk", "chunk_scan"),
        "snapshot-pair": ("chunk_cumsum_gather", "chunk_state_bmm", "state_passing_batched", "chunk_scan"),
        "indexed": ("chunk_cumsum", "chunk_state_passing", "bmm_chunk", "chunk_scan"),
        "indexed-pair": ("chunk_cumsum", "chunk_state_bmm", "state_passing_indexed", "chunk_scan"),
    }
    for path, kernels in expected.items():
        with monkeypatch.context() as m:
            launches, _ = recorded_launches(m, device, path)
        assert tuple(n for n, _, _ in launches) == kernels, (path, launches)


def test_chunk_cumsum_gather_needs_aligned_rows(device):
    from kernels import chunk_cumsum_gather

    base = torch.zeros(8 * 16 + 1, device=device)
    assert chunk_cumsum_gather.fuses(base[:128].view(8, 1, 4, 4))
    assert not chunk_cumsum_gather.fuses(base[1:].view(8, 1, 4, 4))  # misaligned by 4 bytes
    assert not chunk_cumsum_gather.fuses(base[:120].view(8, 1, 3, 5))  # rows of 15 elements


@pytest.mark.parametrize(("name", "kernel_before", "overlapping"), [
    ("snapshot-aligned", "chunk_state_passing", "bmm_chunk"),
    ("indexed", "chunk_state_passing", "bmm_chunk"),
    ("snapshot-unaligned", "chunk_cumsum", "gather_initial_states"),
    ("indexed-pair-no-one-kernel", "bmm_chunk", "chunk_state"),
    ("snapshot-pair-unaligned-no-one-kernel", "bmm_chunk", "chunk_state"),
])
def test_the_launch_check_sees_an_overlapping_kernel_after_one_that_did_not_signal(monkeypatch, device, name,
                                                                                    kernel_before, overlapping):
    """Negative control: ``ssd_prefill`` launching the kernel another runs beside without its early signal."""
    def silent(launcher):
        def launch(*args, signal_next=False, **kwargs):
            return launcher(*args, **kwargs)
        return launch

    path, extra, forces = PLANS[name]
    forced(monkeypatch, forces)
    launches, _ = recorded_launches(monkeypatch, device, path, tamper={kernel_before: silent}, **extra)
    assert misplaced_overlaps(launches) == [overlapping], launches


def _late_wait(x_ptr, USE_PDL):
    """A kernel body that loads before it waits: what the check above must refuse."""
    v = x_ptr + 1
    backend.wait_for_previous_kernel(USE_PDL)  # an attribute call, not the bare name either
    return v


def _waits_first(x_ptr, USE_PDL):
    wait_for_previous_kernel(USE_PDL)  # noqa: F821 (parsed, never run)
    return x_ptr


def _overlapping(x_ptr, overlaps_previous, USE_PDL):
    wait_unless_overlapping(overlaps_previous, USE_PDL)  # noqa: F821 (parsed, never run)
    tl.store(x_ptr, 1)  # noqa: F821
    wait_at_end_if_overlapping(overlaps_previous, USE_PDL)  # noqa: F821


def _overlapping_without_closing_wait(x_ptr, overlaps_previous, USE_PDL):
    wait_unless_overlapping(overlaps_previous, USE_PDL)  # noqa: F821 (parsed, never run)
    tl.store(x_ptr, 1)  # noqa: F821


def test_the_source_check_sees_a_late_or_missing_wait():
    assert statements_before_the_wait(_late_wait) == ["no wait"]
    assert statements_before_the_wait(_waits_first) == []
    assert statements_before_the_wait(_overlapping) == []
    assert statements_before_the_wait(_overlapping_without_closing_wait) == ["no closing wait"]

    def loads_then_waits(x_ptr, USE_PDL):
        v = x_ptr + 1
        wait_for_previous_kernel(USE_PDL)  # noqa: F821
        return v

    assert statements_before_the_wait(loads_then_waits) == ["v = x_ptr + 1"]


def test_every_planned_launch_carries_the_switch_and_the_option_together():
    """The warmup registry's specs come from the launchers' own ``launch_arguments``: each carries ``USE_PDL`` and
    ``launch_pdl``, equal to this process's setting (so warmed keys match real launches)."""
    planned, _ = plan([(ModelShape(2, 4, 16, 1, 8), (torch.float16,), (torch.float32,))])
    assert planned
    for p in planned:
        args = p.spec.arguments
        assert args["USE_PDL"] is args["launch_pdl"] is backend.programmatic_launch(), kernel_name(p.spec.kernel)


@pytest.mark.parametrize(("raw", "on"), [(None, True), ("", True), ("1", True), ("0", False)])
def test_the_environment_switch(raw, on):
    assert backend.pdl_setting(raw) is on


def test_a_bad_environment_value_is_refused_naming_the_variable():
    with pytest.raises(ValueError, match=r"SSD_PDL='yes': expected '0' \(off\) or '1'"):
        backend.pdl_setting("yes")


def test_the_interpreter_never_launches_programmatically(device):
    if device != "cpu":
        pytest.skip("the GPU's setting depends on its compute capability (the next test covers it)")
    assert backend.programmatic_launch() is False


def test_hopper_launches_programmatically(device):
    if device != "cuda":
        pytest.skip("needs a CUDA device: programmatic dependent launch is a GPU launch attribute")
    capability = torch.cuda.get_device_capability()
    assert backend.programmatic_launch() is (capability[0] >= 9)


REPLAYS = 50


@pytest.mark.parametrize(("workload", "variant"), [
    ("short-continuation", "indexed"), ("short-continuation", "snapshot-fused"), ("mixed-3", "snapshot-fused"),
    ("continue-600", "indexed"), ("prefill-4256", "indexed"), ("mixed-3", "snapshot-torch"),
])
def test_graph_replays_give_the_eager_calls_bits(device, workload, variant):
    """In a graph replay the launches overlap as far as programmatic launch lets them: a stage that read ahead of
    its wait would see its input half written in some replays. Every replay's output and final states must equal
    the eager call's, bit for bit, under the shipped plan (the workloads reach its plans: few and many chunks, both
    paths)."""
    if device != "cuda":
        pytest.skip("needs a CUDA device: CUDA graphs and programmatic launch exist only there")
    from harness.bench import VARIANTS, _call, workload_case
    from harness.cases.builder import build_inputs
    from harness.cuda_timing import capture_graph
    from kernels import provider

    inputs = build_inputs(workload_case(workload), device)
    call = _call(provider, inputs, VARIANTS[variant])  # poisons out with NaN once, here
    final_slots = inputs.final_state_indices.long()
    call()
    torch.cuda.synchronize()
    out, cache = inputs.out.clone(), inputs.state_cache.clone()
    graph = capture_graph(call, warmup=1)
    for replay in range(REPLAYS):
        # What the call writes is poisoned before each replay (no final slot is an initial slot of the call).
        inputs.out.fill_(math.nan)
        inputs.state_cache[final_slots] = math.nan
        graph.replay()
        torch.cuda.synchronize()
        context = f"{workload} {variant}, graph replay {replay} of {REPLAYS} against the eager call"
        assert_bits_equal(inputs.out, out, what="out", context=context)
        assert_bits_equal(inputs.state_cache, cache, what="state_cache", context=context)
