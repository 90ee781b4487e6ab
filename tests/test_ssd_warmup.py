"""Warmup registry over the whole SSD path (issue 6): every key a real ``ssd_prefill`` call launches is in the
startup warmup, for every registered kernel; removing a kernel's keys, or narrowing a class, makes the guard fire.

CPU: launch keys are compared against the warmed keys (nothing compiles). GPU: the same guard also watches real
compiles, after a warmup that compiled everything.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from harness.guards.recompile import RecompileError, guard_no_recompile
from harness.guards.specialization import (
    MissingSpecialization,
    assert_keys_warmed,
    kernel_name,
    recording_launches,
)
from harness.varlen import build_varlen_metadata
from harness.warmup import main, warmup_all
from kernels import (
    bmm_chunk,
    chunk_cumsum,
    chunk_cumsum_gather,
    chunk_scan,
    chunk_state,
    chunk_state_bmm,
    chunk_state_passing,
    gather,
    ssd,
)
from kernels import state_passing_batched as spb
from kernels import state_passing_indexed as spi
from kernels.warmup import ModelShape, int_values, plan, registered, representatives

# GPU: compile the fixtures' warmups in parallel processes (into the disk cache) before loading them here. Four: the
# three warmups here run at once in three xdist workers and share their compiles (harness.compile_claims), and each
# child imports torch, so more children cost more than they save on a busy host and fewer leave the fixture's warmup
# the longest item (the measurements: notes/gpu-runs.md).
WARMUP_JOBS = min(4, os.cpu_count() or 1)
# Under xdist the tests that share the module fixtures (hundreds of GPU compiles on a cold cache) are one work unit:
# the fixtures run in one worker, not in every worker that takes one of those tests. The other tests of the module
# spread: as one unit they would hold one worker longer than any other unit of the suite on a cold cache.
shares_full_warmup = pytest.mark.xdist_group("ssd_warmup")

SHAPE = ModelShape(nheads=2, headdim=4, dstate=8, ngroups=1, chunk_size=8)  # Q < 16: nchunks enters the classes
H, P, N, G, Q = SHAPE.nheads, SHAPE.headdim, SHAPE.dstate, SHAPE.ngroups, SHAPE.chunk_size
KERNELS = {
    "gather": gather._gather_initial_states_kernel,
    "state_passing_indexed": spi._state_passing_indexed_kernel,
    "chunk_cumsum": chunk_cumsum.chunk_cumsum_kernel,
    "chunk_cumsum_gather": chunk_cumsum_gather._chunk_cumsum_gather_kernel,
    "chunk_state": chunk_state.chunk_state_kernel,
    "bmm_chunk": bmm_chunk.bmm_chunk_kernel,
    "chunk_state_bmm": chunk_state_bmm._chunk_state_bmm_kernel,
    "chunk_scan": chunk_scan.chunk_scan_kernel,
    "state_passing_batched": spb._state_passing_batched_kernel,
    "chunk_state_passing": chunk_state_passing._chunk_state_passing_kernel,
}


def _call(device, *, io=torch.float32, state=torch.float32, contexts=(3,), tokens=(13,), D="none", z=False, bias=False,
          softplus=False, limit=False, mode="direct", path="snapshot", table=None, row_pad=0, offset=0, seed=0,
          unfused=False):
    """One ssd_prefill call on a padded/offset cache; ``table=(columns, column, rows_before)`` takes the index
    tensors as int64 block-table columns (strided, possibly unaligned views)."""
    g = torch.Generator().manual_seed(seed)
    meta = build_varlen_metadata(list(contexts), list(tokens), Q)
    T, batch = meta.total_tokens, len(contexts)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    slots, row = 4, H * P * N
    flat = r(offset + slots * (row + row_pad)).to(state).to(device)
    cache = flat.as_strided((slots, H, P, N), (row + row_pad, P * N, N, 1), offset)
    if table is None:
        init = torch.arange(batch, dtype=torch.int32, device=device)
        final = init.flip(0).clone()
    else:
        columns, column, rows_before = table
        bt = torch.zeros(rows_before + batch, columns, dtype=torch.int64, device=device)
        bt[rows_before:, column] = torch.arange(batch)
        bt[rows_before:, (column + 1) % columns] = torch.arange(batch).flip(0)
        init, final = bt[rows_before:, column], bt[rows_before:, (column + 1) % columns]
    kw = dict(
        chunk_size=Q, **meta.tensors(device), out=torch.empty(T, H, P, dtype=io, device=device),
        D={"none": None, "per_head": r(H), "per_channel": r(H, P)}[D], z=r(T, H, P).to(io) if z else None,
        dt_bias=r(H) if bias else None, dt_softplus=softplus, dt_limit=(0.01, 0.5) if limit else (0.0, math.inf),
        state_cache=cache, initial_state_indices=init, has_initial_states=torch.ones(batch, dtype=torch.bool),
        final_state_indices=final if mode == "direct" else None, return_intermediate_states=mode == "checkpoint",
        path=path, gather="fused", unfused=unfused)
    kw = {k: v.to(device) if isinstance(v, torch.Tensor) and v.device != cache.device else v for k, v in kw.items()}
    args = [t.to(io).to(device) for t in (r(T, H, P), r(T, H) * 0.3 + 0.5)]
    x, dt = args[0], args[1].float()
    A = (-torch.rand(H, generator=g) - 0.5).to(device)
    B, C = (r(T, G, N).to(io).to(device) for _ in range(2))
    return lambda: ssd.ssd_prefill(x, dt, A, B, C, **kw)


# Together these launch every registered kernel, both paths (the snapshot one with either states kernel), all three
# modes, every D kind, both nchunks parities (Q = 8: the (H, C, Q) strides are 16k or not), block-table columns and
# an unaligned padded cache.
CALLS = {
    "snapshot-direct-fp16-bf16state-Dchan-z-bias-softplus-limit-table": dict(
        io=torch.float16, state=torch.bfloat16, contexts=(3, 0), tokens=(13, 9), D="per_channel", z=True, bias=True,
        softplus=True, limit=True, table=(5, 1, 1), row_pad=3, offset=1),
    "indexed-direct-fp32-Dhead": dict(contexts=(5,), tokens=(19,), D="per_head", path="indexed"),
    # Few chunks: the fused kernel reads the initial state from the cache by slot, here an unaligned padded one.
    "indexed-direct-fp32-offset-cache": dict(contexts=(5,), tokens=(19,), path="indexed", row_pad=3, offset=1),
    # From kernels.plan.PAIR_FROM_CHUNKS chunks either path runs chunk state's kernel and a state passing kernel.
    "indexed-pair-direct-bf16": dict(io=torch.bfloat16, state=torch.bfloat16, contexts=(5,), tokens=(70,),
                                     path="indexed"),
    "snapshot-returned-bf16-fp16state": dict(io=torch.bfloat16, state=torch.float16, contexts=(0,), tokens=(8,)),
    "snapshot-checkpoint-fp32": dict(contexts=(2, 4), tokens=(7, 12), mode="checkpoint", softplus=True),
    # The snapshot path's pair: chunk state and the batched state passing, over one long sequence (the read-ahead
    # loop) and a batch of short ones (a chunk a step).
    "snapshot-pair-direct-bf16-long": dict(io=torch.bfloat16, state=torch.bfloat16, contexts=(0,), tokens=(70,)),
    "snapshot-pair-returned-fp32-batch": dict(contexts=(3, 0, 5), tokens=(30, 20, 25), mode="returned"),
}


def _request(io=torch.float32, state=torch.float32, D="none", z=False, bias=False, softplus=False, limit=False,
             **_layout):
    """The warmup request a server with this call's model options makes: its dtypes and D/z/dt options; every
    index, cache-layout, path and mode class stays in (what the corpus warmup does per option set)."""
    return (SHAPE, (io,), (state,), dict(d_kinds=(D,), z_options=(z,), dt_bias_options=(bias,),
                                         softplus_options=(softplus,), dt_limit_options=(limit,)))


@pytest.fixture(scope="module")
def full_warmup(device):
    # One request per model configuration the calls below use (plus the defaults): on the GPU each
    # specialization is a real compile, and every dtype x option product of the shape would be 808 of them.
    report = warmup_all(device, [_request(**c) for c in CALLS.values()] + [_request()], jobs=WARMUP_JOBS)
    print(report.summary())
    assert set(registered()) == set(KERNELS), registered()  # a new registration must be added to this test
    return report


@pytest.fixture(scope="module")
def launched(device):
    """The keys every CALLS entry launches, per kernel (recorded once; trial launches of autotuners included)."""
    seen = []
    with recording_launches(list(KERNELS.values())) as keys:
        for call in CALLS.values():
            _call(device, **call)()
        # Chunk state's and bmm's own kernels, where the shipped plan runs them in one: the unfused plan.
        _call(device, **CALLS["indexed-pair-direct-bf16"], unfused=True)()
    seen.extend(keys)
    return seen


@shares_full_warmup
@pytest.mark.parametrize("name", list(CALLS))
def test_real_call_compiles_nothing_after_the_warmup(name, full_warmup, device):
    with guard_no_recompile(list(KERNELS.values()), warmed=full_warmup.keys):
        _call(device, **CALLS[name])()


@shares_full_warmup
@pytest.mark.parametrize("registration", list(KERNELS))
def test_every_registered_kernel_is_launched_and_warmed(registration, full_warmup, launched, device):
    """Per kernel: the real calls launch it, all its keys are warmed; dropping its keys (negative control) fires
    and names it."""
    if registration == "chunk_state_bmm" and device == "cuda":
        pytest.skip("runs on the GPU only at shapes with both stages' configs checked in, not this one: "
                    "test_kernel_stages.py::test_the_warmup_holds_the_one_kernel_s_binaries covers it there")
    name = kernel_name(KERNELS[registration])
    mine = [k for k in launched if k.kernel == name]
    assert mine, f"no CALLS entry launches {name}"
    assert_keys_warmed(mine, full_warmup.keys)
    without = [k for k in full_warmup.keys if k.kernel != name]
    with pytest.raises(MissingSpecialization, match=f"kernel {name}: specialization not warmed up"):
        assert_keys_warmed(launched, without)


@shares_full_warmup
def test_the_state_passing_stage_is_warmed_too(full_warmup, device):
    """The provider's ``stages.state_passing`` is the fused kernel teacher-forced, with stand-in tokens: a
    ``state_passing_exact`` item under the recompile guard launches keys no ``ssd_prefill`` call does, and the
    warmup holds them. Negative control: without the teacher-forced registrations' own keys, the guard names the
    kernel."""
    from kernels.chunk_state_passing import state_passing

    g = torch.Generator().manual_seed(2)
    C = 3
    states = torch.randn(C, H, P, N, generator=g).to(device)
    dA = (-torch.rand(H, C, Q, generator=g)).cumsum(-1).to(device)
    i32 = dict(dtype=torch.int32, device=device)
    with recording_launches([chunk_state_passing._chunk_state_passing_kernel]) as keys:
        state_passing(states, dA, torch.tensor([0, 0, 1], **i32), initial_states=torch.zeros(2, H, P, N).to(device),
                      out_dtype=torch.float32, state_cache=torch.zeros(4, H, P, N).to(device),
                      final_state_indices=torch.tensor([1, 2], **i32), last_chunk_indices=torch.tensor([1, 2], **i32))
    assert keys, "the stage launched nothing"
    assert_keys_warmed(list(keys), full_warmup.keys)
    planned, _ = plan([_request()], ["chunk_state_passing"])
    by_calls = {(k.kernel, k.key) for p in planned if "teacher-forced" not in p.spec.why for k in p.keys}
    teacher_only = {(k.kernel, k.key) for p in planned if "teacher-forced" in p.spec.why for k in p.keys} - by_calls
    without = [k for k in full_warmup.keys if (k.kernel, k.key) not in teacher_only]
    with pytest.raises(MissingSpecialization, match="specialization not warmed up"):
        assert_keys_warmed(list(keys), without)


# The io-typed stages of a snapshot call: the ones whose operands are the call's x/B/C (what a dtype-narrow warmup
# misses).
DOT_STAGES = ("chunk_state_passing", "bmm_chunk", "chunk_scan")


def test_narrow_dtype_warmup_fires_on_the_dot_stages(device):
    """Negative control: warm fp32 io only, call with fp16 io: the io-typed stages would compile. Only those stages
    are warmed (the others' fp32 binaries would be cold GPU compiles, outside the fixtures' group, that show nothing
    here); the guard must name each of them (on the GPU it names every kernel that compiles in the block)."""
    narrow = warmup_all(device, [_request(io=torch.float32)], kernels=DOT_STAGES, jobs=WARMUP_JOBS)
    with pytest.raises(RecompileError) as err:
        with guard_no_recompile([KERNELS[name] for name in DOT_STAGES], warmed=narrow.keys):
            _call(device, io=torch.float16)()
    text = str(err.value)
    for name in DOT_STAGES:
        assert f"kernel {kernel_name(KERNELS[name])}: specialization not warmed up" in text, text
    assert "x_ptr: needed *fp16 aligned16, closest warmed *fp32 aligned16" in text, text


def test_per_head_d_warmup_covers_per_channel_calls(device):
    """chunk_scan does not specialize D's strides (kernels/chunk_scan.py), so a warmup without per-channel D must
    cover a per-channel call: the guard stays quiet. The decision is pinned: if the strides were specialized again,
    the narrow warmup would lack the call's key and this test fails naming stride_D_hdim."""
    shape, io, state, options = _request()
    # Every kernel is warmed, not chunk_scan alone: on the GPU the guard fails on any compile in the block, whichever
    # kernel it is (the interpreter compares chunk_scan's keys only).
    narrow = warmup_all(device, [(shape, io, state, {**options, "d_kinds": ("none", "per_head")})], jobs=WARMUP_JOBS)
    with guard_no_recompile([chunk_scan.chunk_scan_kernel], warmed=narrow.keys):
        _call(device, D="per_channel")()


@shares_full_warmup
def test_nchunks_parity_is_a_class_when_chunks_are_short(full_warmup, device):
    """Q = 8: the (H, C, Q) strides C*Q are a multiple of 16 only for even C, so odd and even nchunks launch
    different keys, and the warmup holds both."""
    assert representatives(lambda c: c * 8) == [1, 2]  # 8 (other), 16 (16k); C*Q is never 1
    assert representatives(lambda c: c * 1) == [1, 2, 16]  # Q = 1: =1, other, 16k
    assert representatives(lambda c: c * 256) == [1]
    odd = []
    with recording_launches([chunk_cumsum.chunk_cumsum_kernel]) as keys:
        _call(device, contexts=(0,), tokens=(24,))()  # 3 chunks
    odd = list(keys)
    with recording_launches([chunk_cumsum.chunk_cumsum_kernel]) as keys:
        _call(device, contexts=(0,), tokens=(16,))()  # 2 chunks
    assert {k.key for k in odd}.isdisjoint({k.key for k in keys}), "nchunks parity should change the key"
    assert_keys_warmed(odd + list(keys), full_warmup.keys)


def test_int_values_follow_the_kernels_flags():
    """The enumeration is pruned only where the kernel ignores the class (read from its decorator lists)."""
    k = chunk_state_passing._chunk_state_passing_kernel
    from kernels.specialization import gpu_view

    params = {p.name: p for p in gpu_view(k).params}
    values = (1, 16, 3)
    expected = values[:1] if params["nchunks"].do_not_specialize else values
    assert int_values(k, "nchunks", values) == expected
    assert int_values(k, "hdim", values) == values  # specialized everywhere


@pytest.mark.parametrize("registration", ["chunk_state_passing", "state_passing_batched", "state_passing_indexed",
                                          "gather"])
def test_the_state_kernels_have_one_binary_for_every_cache_layout(registration):
    """The state passing kernels touch the cache once or twice per program, outside their chunk loops: an aligned or
    offset cache, with rows padded to a multiple of 16 or not (the plan enumerates all four), is one specialization.
    So is the gather's: it runs where the rows are not all 16-byte aligned (the aligned ones gather inside the
    cumsum's kernel, which keeps the class) or in the unfused stage bench, and a copy's bits do not depend on its
    load width. The fused kernel also reads the initial state through its own pointer and row stride, the cache's
    on the indexed path (by slot), once per sequence: one specialization too."""
    planned, _ = plan([(SHAPE, (torch.bfloat16,), (torch.bfloat16,))], [registration])
    keys = [k for p in planned for k in p.keys]
    assert keys
    for key in keys:
        params = dict(key.params)
        assert params["cache_ptr"] == "*bf16 (alignment not specialized)", key.describe()
        assert params["stride_cache_slot"] == "i32 (not specialized)", key.describe()
        if registration == "chunk_state_passing":
            assert params["init_ptr"].endswith("(alignment not specialized)"), key.describe()
            assert params["stride_init_row"] == "i32 (not specialized)", key.describe()


@pytest.mark.parametrize("registration", ["chunk_cumsum", "chunk_cumsum_gather"])
def test_the_cumsum_kernels_have_one_binary_for_every_dt_option(registration):
    """dt_bias, softplus and the dt limit are run-time branches of the cumsum's tile: a model with every combination
    of them needs the binaries of a model with none."""
    def keys(**options):
        planned, _ = plan([(SHAPE, (torch.bfloat16,), (torch.bfloat16,), options)], [registration])
        return {(k.kernel, k.key) for p in planned for k in p.keys}

    every = keys()  # the request's defaults: each option off and on
    assert every and every == keys(dt_bias_options=(False,), softplus_options=(False,), dt_limit_options=(False,))


def test_main_prints_time_and_count(capsys):
    assert main(["--shape", "2,4,8,1,8", "--io", "float16", "--state", "float32", "--kernels", "chunk_cumsum",
                 "bmm_chunk"]) == 0
    out = capsys.readouterr().out
    assert "specializations from" in out and "s (" in out and "1 model shape(s)" in out, out
    with pytest.raises(SystemExit):
        main(["--shape", "2,4"])
    with pytest.raises(SystemExit):
        main(["--shape", "2,4,8,1,8", "--part", "2/2"])
    with pytest.raises(SystemExit):
        main(["--shape", "2,4,8,1,8", "--jobs", "0"])


def test_compile_order_rotates_per_worker_and_parts_cover_everything_once():
    from kernels.warmup import compile_order

    assert compile_order(5) == [0, 1, 2, 3, 4]
    assert compile_order(5, first=0.5) == [2, 3, 4, 0, 1]
    assert compile_order(0, first=0.5) == []
    # Four workers start a quarter of the list apart, each still warming every spec.
    starts = [compile_order(8, first=k / 4)[0] for k in range(4)]
    assert starts == [0, 2, 4, 6] and all(sorted(compile_order(8, first=k / 4)) == list(range(8)) for k in range(4))
    parts = [compile_order(7, part=(k, 3)) for k in range(3)]
    assert sorted(i for p in parts for i in p) == list(range(7))


def test_rotation_and_parts_do_not_change_the_warmed_keys():
    """``first``/``part`` change only what this process compiles and in which order; the keys the guard holds
    launches to stay the full set."""
    from kernels.warmup import warmup_all

    # Planning, not compiling: a compile strategy that compiles nothing (on the GPU the default one compiles).
    req = [(ModelShape(2, 4, 16, 1, 8), (torch.float16,), (torch.float32,))]

    def keys(**kw):
        return {(k.kernel, k.key) for k in warmup_all("cpu", req, compile=lambda planned, order: None, **kw).keys}

    full = keys()
    assert full and full == keys(first=0.6) == keys(part=(1, 3))


def test_parallel_warmup_names_a_failing_part():
    """``jobs``: a child that fails (here: a registration that does not exist) is reported with its part and its
    error, not swallowed; the parent then never claims the binaries are in the cache."""
    from harness.warmup import _compile_in_children

    with pytest.raises(RuntimeError,
                       match=r"parallel compile failed:\npart 0/2 \(exit 1\):(.|\n)*no registration named"):
        _compile_in_children([_request()], ["no_such_kernel"], jobs=2)


@pytest.mark.parametrize("cache,spawned_after", [
    ("warm", None),  # every spec loads from the disk cache: no child process
    ("cold-from-3", 3),  # the third spec compiles: children take over the rest, once
    ("unreadable", 1),  # no cache folder to look into: children at once, as before
])
def test_parallel_warmup_starts_children_only_at_the_first_compile(monkeypatch, cache, spawned_after):
    """``jobs``: the processes start at the first specialization the disk cache lacks; this process still loads
    every specialization (the GPU path, driven here with the compile itself stubbed out)."""
    import harness.warmup as w
    from kernels.warmup import plan as plan_of

    loaded, spawns = [], []
    entries = {"n": 0}

    def disk_entries():
        if cache == "unreadable":
            return None
        return entries["n"]

    def compile_one(spec):
        loaded.append(spec)
        if cache == "cold-from-3" and len(loaded) >= 3 and not spawns:
            entries["n"] += 1  # this one compiled: a new cache entry

    monkeypatch.setattr(w, "compile_spec", compile_one)
    monkeypatch.setattr(w, "_disk_cache_entries", disk_entries)
    monkeypatch.setattr(w, "_compile_in_children", lambda requests, names, jobs: spawns.append(len(loaded)) or 1.5)
    requests = [(ModelShape(2, 4, 16, 1, 8), (torch.float16,), (torch.float32,))]
    report = w.warmup_all("cuda", requests, jobs=4)
    plan, _ = plan_of(requests)
    assert len(loaded) == len(plan) and report.compiled == len(report.keys)
    assert spawns == ([] if spawned_after is None else [spawned_after])
    assert report.parallel_seconds == (0.0 if spawned_after is None else 1.5)
    assert w.warmup_all("cuda", requests, jobs=1) and spawns == ([] if spawned_after is None else [spawned_after])


def test_parallel_warmup_starts_no_children_under_the_interpreter(monkeypatch):
    """``jobs`` is for GPU compiles: on the CPU tier the children (which compile for the GPU) would fail on a torch
    without CUDA, and a fresh machine has no cache folder to look into, which counts as "compile now"."""
    import harness.warmup as w

    spawns = []
    monkeypatch.setattr(w, "_disk_cache_entries", lambda: None)
    monkeypatch.setattr(w, "_compile_in_children", lambda requests, names, jobs: spawns.append(jobs) or 1.5)
    requests = [(ModelShape(2, 4, 16, 1, 8), (torch.float16,), (torch.float32,))]
    report = w.warmup_all("cpu", requests, kernels=["gather"], jobs=4)
    assert spawns == [] and report.jobs == 1 and report.parallel_seconds == 0.0 and report.keys
