"""Destructive-autotuning guard: flags in-place / aliased autotuned kernels, passes safe ones (issue 4)."""

from __future__ import annotations

import functools

from harness.backend import configure

DEVICE = configure()  # before any @triton.jit below (TRITON_INTERPRET is read at decoration)

import pytest  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from harness.guards.autotune import (  # noqa: E402
    DestructiveAutotuning,
    FakeBench,
    StorageSnapshot,
    check_autotune_safe,
    fresh_autotune_state,
)

TWO_CONFIGS = [triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})]


@triton.autotune(configs=TWO_CONFIGS, key=["n"])
@triton.jit
def _inplace_increment(x_ptr, n, BLOCK: tl.constexpr):
    """x += 1: every trial launch adds one more (DESIGN section 8: ended at 4106 on the GPU)."""
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


def test_inplace_increment_is_flagged_and_names_kernel_and_config():
    x = torch.zeros(10, device=DEVICE)
    with pytest.raises(DestructiveAutotuning) as err:
        check_autotune_safe(increment, [_inplace_increment], args=(x,))
    text = str(err.value)
    assert "_inplace_increment" in text and "BLOCK: 4" in text, text
    assert "storage of tensor0" in text, text
    # the tuned call left x + trials + 1; the guard leaves that state for inspection
    assert torch.equal(x, torch.full_like(x, 3.0)), x


def test_fake_bench_repeats_trials_like_the_gpu_benchmarker():
    x = torch.zeros(6, device=DEVICE)
    bench = FakeBench(reps=5)
    with pytest.raises(DestructiveAutotuning, match=r"10 trial launches"):
        check_autotune_safe(increment, [_inplace_increment], args=(x,), do_bench=bench)
    assert torch.equal(x, torch.full_like(x, 11.0)), x


def test_read_only_kernel_passes_and_reports_choice():
    x = torch.arange(12, dtype=torch.float32, device=DEVICE)
    y = torch.full_like(x, float("nan"))
    report = check_autotune_safe(scaled_copy, [_scaled_copy], args=(x, y))
    assert torch.equal(y, 2 * x)
    assert report.trials == 2 and report.storages == 2
    assert any("BLOCK: 4" in c for c in report.chosen[next(iter(report.chosen))]), report.chosen


def test_aliased_slots_are_flagged_distinct_slots_pass():
    cache = torch.arange(24, dtype=torch.float32, device=DEVICE).reshape(3, 8)
    distinct = (torch.tensor([0], device=DEVICE), torch.tensor([2], device=DEVICE))
    check_autotune_safe(functools.partial(slot_update, cache, *distinct), [_read_slot_write_slot])
    same = (torch.tensor([1], device=DEVICE), torch.tensor([1], device=DEVICE))
    with pytest.raises(DestructiveAutotuning, match="_read_slot_write_slot"):
        check_autotune_safe(functools.partial(slot_update, cache, *same), [_read_slot_write_slot])


def test_aliases_share_one_snapshot_and_restore_together():
    base = torch.arange(16, dtype=torch.float32, device=DEVICE)
    view = base[4:8]
    snap = StorageSnapshot.take([("base", base), ("view", view), ("other", torch.zeros(2))])
    assert len(snap.tensors) == 2 and snap.names[0] == "base = view"
    base.fill_(-1.0)
    snap.restore()
    assert torch.equal(view, torch.tensor([4.0, 5.0, 6.0, 7.0]))


def test_fresh_state_clears_and_restores_tuning_cache():
    x = torch.zeros(4, device=DEVICE)
    with fresh_autotune_state([_scaled_copy], FakeBench()):
        scaled_copy(x, torch.empty_like(x))
        assert len(_scaled_copy.cache) == 1
    before = dict(_scaled_copy.cache)
    with fresh_autotune_state([_scaled_copy], FakeBench()) as (tuner,):
        assert tuner.cache == {}
    assert _scaled_copy.cache == before


def test_guard_refuses_to_pass_when_nothing_was_tuned():
    x = torch.zeros(4, device=DEVICE)
    with pytest.raises(DestructiveAutotuning, match="checked nothing"):
        check_autotune_safe(lambda t: None, [_scaled_copy], args=(x,))
