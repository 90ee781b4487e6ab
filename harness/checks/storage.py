"""Storage checks: nothing outside the written final slots changes, inputs stay read-only, and calls repeat exactly."""

from __future__ import annotations

from harness.checks.base import Check
from harness.checks.calls import (
    assert_cache_equal_outside,
    assert_calls_equal,
    run_call,
    shared_call,
    written_slots,
)
from harness.checks.registry import register
from harness.compare import assert_bits_equal, storage_bytes


def _untouched_storage(ctx) -> dict:
    """Every byte of the cache's backing storage outside ``state_cache[final_slot]`` rows is unchanged: sentinel
    gaps between rows, other slots, bytes before the storage offset and after the last row."""
    before = storage_bytes(ctx.inputs().cache_base)
    inputs = shared_call(ctx, "the case's call").inputs
    allowed = written_slots(ctx.case)  # the written rows are checked by value elsewhere
    assert_cache_equal_outside(inputs, before, allowed, what=f"cache storage outside written slots {allowed}")
    return {"written_slots": allowed, "storage_bytes": int(before.numel())}


def _readonly_inputs(ctx) -> dict:
    """x, dt, A, B, C, D, z, dt_bias, the index tensors and the metadata keep every byte of their storage."""
    before = {name: storage_bytes(t) for name, t in ctx.inputs().read_only_tensors().items()}
    tensors = shared_call(ctx, "the case's call").inputs.read_only_tensors()
    for name, t in tensors.items():
        after = storage_bytes(t)
        if after.numel() % t.element_size() == 0 and t.dtype.is_floating_point:
            assert_bits_equal(after.view(t.dtype), before[name].view(t.dtype), what=f"read-only input {name} (storage)")
        else:
            assert_bits_equal(after, before[name], what=f"read-only input {name} (storage bytes)")
    return {"inputs": sorted(tensors)}


def _determinism(ctx) -> dict:
    """Two identical calls from identical inputs give identical out, cache storage and returned bits."""
    first = shared_call(ctx, "first call")
    second = run_call(ctx, "second call")
    return {"compared": assert_calls_equal(second, first)}


register(
    Check(
        name="untouched_storage",
        doc="every cache-storage byte outside the written final slots is unchanged",
        run=_untouched_storage,
        shared_calls=('case',),
        cpu_calls=0.0,
    )
)
register(
    Check(
        name="readonly_inputs",
        doc="x, dt, A, B, C, D, z, dt_bias, index tensors and metadata are unchanged bit for bit",
        run=_readonly_inputs,
        shared_calls=('case',),
        cpu_calls=0.0,
    )
)
register(
    Check(
        name="determinism",
        doc="a second identical call gives identical bits (out, cache storage, returned)",
        run=_determinism,
        shared_calls=('case',),
        cpu_calls=1.0,
    )
)
