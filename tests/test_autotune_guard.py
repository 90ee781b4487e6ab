"""Destructive-autotuning guard: flags in-place / aliased autotuned kernels, passes safe ones (issue 4)."""

from __future__ import annotations

import contextlib
import functools

import pytest
import torch
import triton
import triton.language as tl

from harness.guards.autotune import (
    DestructiveAutotuning,
    FakeBench,
    NothingTuned,
    StorageSnapshot,
    check_autotune_safe,
    fresh_autotune_state,
)
from harness.guards.specialization import kernel_name
from harness.varlen import build_varlen_metadata
from kernels import bmm_chunk, chunk_cumsum, chunk_scan, ssd
from kernels import state_passing_indexed as spi

TWO_CONFIGS = [triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})]


@triton.autotune(configs=TWO_CONFIGS, key=["n"])
@triton.jit
def _inplace_increment(x_ptr, n, BLOCK: tl.constexpr):
    """x += 1: every trial launch adds one more (docs/exactness.md: thousands of launches on the GPU)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=m) + 1, mask=m)


@triton.autotune(configs=TWO_CONFIGS, key=["n"])
@triton.jit
def _scaled_copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2 * x: reads only x, so trials are harmless."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2, mask=m)


@triton.autotune(configs=TWO_CONFIGS, key=["n"])
@triton.jit
def _read_slot_write_slot(cache_ptr, src_idx_ptr, dst_idx_ptr, row, BLOCK: tl.constexpr, n: tl.constexpr = 8):
    """cache[dst] = cache[src] + 1: harmless unless src == dst (the aliased initial/final slot of issue 4)."""
    offs = tl.arange(0, BLOCK)
    src = tl.load(src_idx_ptr).to(tl.int64)
    dst = tl.load(dst_idx_ptr).to(tl.int64)
    for start in range(0, n, BLOCK):
        m = start + offs < row
        v = tl.load(cache_ptr + src * row + start + offs, mask=m)
        tl.store(cache_ptr + dst * row + start + offs, v + 1, mask=m)


def _grid(n):
    return lambda meta: (triton.cdiv(n, meta["BLOCK"]),)


def increment(x):
    _inplace_increment[_grid(x.numel())](x, x.numel())


def scaled_copy(x, y):
    _scaled_copy[_grid(x.numel())](x, y, x.numel())


def slot_update(cache, src, dst):
    _read_slot_write_slot[(1,)](cache, src, dst, cache.shape[1])


def test_inplace_increment_is_flagged_and_names_kernel_and_config(device):
    x = torch.zeros(10, device=device)
    with pytest.raises(DestructiveAutotuning) as err:
        check_autotune_safe(increment, args=(x,))
    text, report = str(err.value), err.value.report
    (choices,) = report.chosen.values()
    chosen = choices[0].split(": ", 1)[1]  # "BLOCK: 4, num_warps: ..." (the GPU benchmarker picks either config)
    assert "_inplace_increment" in text and chosen in text, text
    assert chosen.startswith(("BLOCK: 4,", "BLOCK: 8,")), chosen
    assert "storage of arg0" in text, text
    assert report.configs_benchmarked == len(TWO_CONFIGS), report
    assert f"{report.trials} trial launches" in text, text
    # every trial launch adds one, then the chosen config once: the count is exact on both backends
    assert torch.equal(x, torch.full_like(x, report.trials + 1.0)), (x, report.trials)
    # the FakeBench stand-in on every backend: one launch per config, the first config wins
    assert report.trials == len(TWO_CONFIGS) and chosen.startswith("BLOCK: 4,"), report


def test_fake_bench_repeats_trials_like_the_gpu_benchmarker(device):
    x = torch.zeros(6, device=device)
    bench = FakeBench(reps=5)
    with pytest.raises(DestructiveAutotuning, match=r"10 trial launches"):
        check_autotune_safe(increment, args=(x,), do_bench=bench)
    assert torch.equal(x, torch.full_like(x, 11.0)), x


def test_trials_are_counted_through_any_benchmarker(device):
    """The GPU failure mode: a benchmarker with no counter of its own (Triton's do_bench) still gets every trial
    launch counted, because the guard wraps whatever benchmarker the tuner uses."""
    def plain_bench(kernel_call, quantiles=None, **_):  # no .calls attribute, like triton.testing.do_bench
        for _ in range(3):
            kernel_call()
        return [1.0, 1.0, 1.0] if quantiles else 1.0

    x = torch.zeros(5, device=device)
    with pytest.raises(DestructiveAutotuning, match=r"6 trial launches over 2 config benchmarks") as err:
        check_autotune_safe(increment, args=(x,), do_bench=plain_bench)
    assert err.value.report.trials == 6
    assert torch.equal(x, torch.full_like(x, 7.0)), x


def test_read_only_kernel_passes_and_reports_choice(device):
    x = torch.arange(12, dtype=torch.float32, device=device)
    y = torch.full_like(x, float("nan"))
    report = check_autotune_safe(scaled_copy, args=(x, y))
    assert torch.equal(y, 2 * x)
    assert report.configs_benchmarked == len(TWO_CONFIGS) and report.storages == 2, report
    (choices,) = report.chosen.values()
    assert len(choices) == 1 and "BLOCK: " in choices[0], report.chosen
    assert report.trials == len(TWO_CONFIGS) and "BLOCK: 4," in choices[0], report


def test_aliased_slots_are_flagged_distinct_slots_pass(device):
    cache = torch.arange(24, dtype=torch.float32, device=device).reshape(3, 8)
    distinct = (torch.tensor([0], device=device), torch.tensor([2], device=device))
    check_autotune_safe(functools.partial(slot_update, cache, *distinct))
    same = (torch.tensor([1], device=device), torch.tensor([1], device=device))
    with pytest.raises(DestructiveAutotuning, match="_read_slot_write_slot"):
        check_autotune_safe(functools.partial(slot_update, cache, *same))


def test_aliases_share_one_snapshot_and_restore_together(device):
    base = torch.arange(16, dtype=torch.float32, device=device)
    view = base[4:8]
    other = torch.zeros(2, device=device)
    snap = StorageSnapshot.take([("base", base), ("view", view), ("other", other)])
    assert len(snap.tensors) == 2 and snap.names == ["base = view", "other"], snap.names
    base.fill_(-1.0)
    other.fill_(7.0)
    snap.restore()
    assert torch.equal(view, torch.tensor([4.0, 5.0, 6.0, 7.0], device=device)), view
    assert torch.equal(base[:4], torch.arange(4, dtype=torch.float32, device=device)), base
    assert torch.equal(other, torch.zeros(2, device=device)), other


def test_fresh_state_retunes_a_tuned_key_and_restores_the_cache(device):
    """A key tuned before the state is tuned again inside it (the autotuner is found at its launch, not from a
    list), and the cache, the disk-cache switch and the benchmarker are as before afterwards."""
    from triton import knobs

    x = torch.zeros(4, device=device)
    scaled_copy(x, torch.empty_like(x))  # tunes this key outside any guard
    before, disk, bench = dict(_scaled_copy.cache), knobs.autotuning.cache, _scaled_copy.__dict__.get("do_bench")
    assert len(before) >= 1
    with fresh_autotune_state(FakeBench()) as state:
        assert state.tuners == [] and knobs.autotuning.cache is False
        scaled_copy(x, torch.empty_like(x))
        assert state.tuners == [_scaled_copy] and len(_scaled_copy.cache) == 1
        assert _scaled_copy.cache_results is False
        assert state.trials.configs == len(TWO_CONFIGS), state.trials.configs  # tuned again, though tuned before
    assert _scaled_copy.cache == before and knobs.autotuning.cache == disk
    assert _scaled_copy.__dict__.get("do_bench") is bench


def test_guard_refuses_to_pass_when_nothing_was_tuned(device):
    x = torch.zeros(4, device=device)
    with pytest.raises(NothingTuned, match="launched no Triton autotuner"):
        check_autotune_safe(lambda t: None, args=(x,))


def test_guard_refuses_to_pass_when_the_autotuners_ran_no_trial(device):
    single = triton.autotune(configs=TWO_CONFIGS[:1], key=["n"])(_scaled_copy.fn)
    x = torch.arange(4, dtype=torch.float32, device=device)
    with pytest.raises(NothingTuned, match="none ran a tuning trial") as err:
        check_autotune_safe(lambda a, b: single[_grid(4)](a, b, 4), args=(x, torch.empty_like(x)))
    assert err.value.report.autotuners and "_scaled_copy" in err.value.report.autotuners[0], err.value.report


# ---- the project's kernels --------------------------------------------------------------------------------------

# The snapshot path's autotuned kernels (its fused chunk state + state passing runs one fixed config).
SNAPSHOT_TUNED = [bmm_chunk.bmm_chunk_kernel, chunk_scan.chunk_scan_kernel, chunk_cumsum.chunk_cumsum_kernel]
H, P, N, G, Q = 2, 4, 8, 1, 8


def _ssd_inputs(contexts, tokens, device, slots=4, seed=0, state_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    meta = build_varlen_metadata(contexts, tokens, Q)
    T = meta.total_tokens
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    tensors = dict(x=r(T, H, P), dt=r(T, H) * 0.5, A=-torch.rand(H, generator=g) - 0.5, B=r(T, G, N), C=r(T, G, N))
    cache = r(slots, H, P, N).to(state_dtype)
    kw = dict(chunk_size=Q, **meta.tensors(), out=torch.empty(T, H, P), state_cache=cache, dt_softplus=True)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in {**tensors, **kw}.items()}


def _call_ssd(inputs, *, init, final, path, **extra):
    kw = dict(inputs, **extra)
    x, dt, A, B, C = (kw.pop(k) for k in ("x", "dt", "A", "B", "C"))
    batch, device = len(init), x.device
    return ssd.ssd_prefill(
        x, dt, A, B, C, **kw,
        initial_state_indices=torch.tensor(init, dtype=torch.int32, device=device),
        has_initial_states=torch.ones(batch, dtype=torch.bool, device=device),
        final_state_indices=torch.tensor(final, dtype=torch.int32, device=device), path=path)


@contextlib.contextmanager
def every_config_tried(kernels):
    """Switch off the kernels' config pruning (kernels.backend.least_overshoot): on these toy shapes it leaves one
    config per stage, and the guard must see every config's trial launches leave memory as the chosen one does."""
    saved = [(k, k.early_config_prune) for k in kernels]
    for k in kernels:
        k.early_config_prune = None
    try:
        yield
    finally:
        for k, prune in saved:
            k.early_config_prune = prune


_indexed_autotuned = triton.autotune(configs=[triton.Config({"BLOCK_SIZE": 16}), triton.Config({"BLOCK_SIZE": 32})],
                                     key=["dim"])(spi._state_passing_indexed_kernel)


def _indexed_with_autotuner(states, dA, cache, init_slot, has, final_slot, out):
    """The indexed launcher's arguments, but through a multi-config autotuner (what the project must not do)."""
    _, H_, P_, N_ = states.shape
    arguments = spi.launch_arguments(states, dA, state_cache=cache, init_slot_index=init_slot, has_initial_state=has,
                                     final_slot_index=final_slot, out=out)
    del arguments["BLOCK_SIZE"]  # the autotuner's
    _indexed_autotuned[lambda meta: (triton.cdiv(P_ * N_, meta["BLOCK_SIZE"]), H_)](**arguments)


def _indexed_inputs(device, seed=2):
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(3, H, P, N, generator=g).to(device)
    dA = (-torch.rand(H, 3, Q, generator=g)).to(device)
    cache = torch.randn(4, H, P, N, generator=g).to(device)
    return states, dA, cache, torch.ones(1, dtype=torch.bool, device=device), torch.empty_like(states)


def test_indexed_state_passing_under_an_autotuner_is_flagged_when_slots_alias(device):
    states, dA, cache, has, out = _indexed_inputs(device)
    same = torch.tensor([1], dtype=torch.int32, device=device)
    with pytest.raises(DestructiveAutotuning, match="_state_passing_indexed_kernel") as err:
        check_autotune_safe(_indexed_with_autotuner, args=(states, dA, cache, same, has, same, out))
    # The report names the config the tuner chose (the stand-in benchmarker's: the first).
    chosen = [c for configs in err.value.report.chosen.values() for c in configs]
    assert chosen and all(c in str(err.value) for c in chosen) and "chosen configs:" in str(err.value)
    assert any("BLOCK_SIZE: " in c for c in chosen)
    # distinct slots: the same autotuned kernel is harmless, so the guard is not just flagging every autotuner
    states, dA, cache, has, out = _indexed_inputs(device)
    check_autotune_safe(_indexed_with_autotuner,
                        args=(states, dA, cache, torch.tensor([1], device=device), has,
                              torch.tensor([3], device=device), out))


# The snapshot copy -> the kernels the call autotunes: with the fused gather and this cache's aligned rows the cumsum
# runs in one kernel with the copy, under its fixed config (kernels.chunk_cumsum_gather), so its autotuner never runs.
TUNED_BY_COPY = {"torch": SNAPSHOT_TUNED, "fused": SNAPSHOT_TUNED[:2]}


@pytest.mark.parametrize("gather", list(TUNED_BY_COPY))
def test_ssd_snapshot_path_autotuned_stages_are_safe(device, gather):
    inputs = _ssd_inputs([3, 0], [13, 9], device)
    call = functools.partial(_call_ssd, inputs, init=[1, 1], final=[1, 2], path="snapshot", gather=gather)
    tuned = TUNED_BY_COPY[gather]
    with every_config_tried(tuned):
        report = check_autotune_safe(call)
    # found by the hook on Triton's autotuner, not from a list: exactly the snapshot path's autotuned stages
    assert sorted(report.autotuners) == sorted(kernel_name(k) for k in tuned), report.autotuners
    assert len(report.chosen) == len(tuned)
    assert all(len(v) == 1 for v in report.chosen.values()), report.chosen  # each stage tuned once
    configs = sum(len(k.configs) for k in tuned)
    assert report.configs_benchmarked == configs, report
    assert report.trials == configs, report


def test_issue4_fresh_tuning_indexed_first_with_aliased_slot_equals_snapshot(device):
    """Issue 4: in a fresh autotune state, the indexed path runs first with init slot == final slot and must give
    the snapshot path's bits (output and every byte of the cache)."""
    from harness.compare import assert_bits_equal, assert_storage_equal, storage_bytes

    snap_in = _ssd_inputs([5], [19], device, seed=3)
    idx_in = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in snap_in.items()}
    with fresh_autotune_state():
        _call_ssd(idx_in, init=[2], final=[2], path="indexed")
    with fresh_autotune_state():
        _call_ssd(snap_in, init=[2], final=[2], path="snapshot")
    assert_bits_equal(idx_in["out"], snap_in["out"], what="output, indexed first vs snapshot")
    assert_storage_equal(idx_in["state_cache"], storage_bytes(snap_in["state_cache"]), what="state cache",
                         element=snap_in["state_cache"].dtype)
