"""Helpers the checks share: one provider call with its inputs kept, and whole-call bit comparisons."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.compare import Mismatch, assert_bits_equal, assert_storage_equal, storage_bytes


@dataclass
class Call:
    """A finished ``ssd_prefill`` call: the (mutated) inputs it ran on and what it returned."""

    label: str  # e.g. "path=snapshot"
    inputs: Any  # CaseInputs
    returned: torch.Tensor | None


def run_call(ctx, label: str, *, path: str | None = None, final_state: str | None = None) -> Call:
    inputs = ctx.inputs()
    returned = ctx.call(inputs, path=path, final_state=final_state)
    return Call(label, inputs, returned)


def assert_returned_equal(actual: Call, expected: Call) -> None:
    """Both None, or both tensors with the same shape, dtype and bits."""
    what = f"returned tensor ({actual.label} vs {expected.label})"
    a, e = actual.returned, expected.returned
    if a is None and e is None:
        return
    if a is None or e is None:
        raise Mismatch(
            f"{what}: {actual.label} returned {_describe(a)}, {expected.label} returned {_describe(e)}", count=-1
        )
    assert_bits_equal(a, e, what=what)


def assert_calls_equal(actual: Call, expected: Call) -> list[str]:
    """Output, the whole cache storage (every byte) and the returned tensor, bit for bit. Returns what it compared."""
    assert_bits_equal(actual.inputs.out, expected.inputs.out, what=f"out ({actual.label} vs {expected.label})")
    assert_storage_equal(
        actual.inputs.cache_base,
        storage_bytes(expected.inputs.cache_base),
        what=f"state cache storage ({actual.label} vs {expected.label})",
        element=actual.inputs.cache_base.dtype,
    )
    assert_returned_equal(actual, expected)
    return ["out", "cache storage", "returned"]


def written_slots(case, final_state: str | None = None) -> list[int]:
    """Cache slots a call is allowed to write: final slots >= 0 of a direct-writeback call, else none."""
    mode = final_state or case.call.final_state
    if mode != "direct":
        return []
    return sorted({s.final_slot for s in case.sequences if s.final_slot is not None and s.final_slot >= 0})


def slot_byte_ranges(state_cache: torch.Tensor, slots: list[int]) -> list[tuple[int, int]]:
    """[start, stop) byte ranges in the backing storage of ``state_cache[slot]`` (inner dims compact)."""
    item = state_cache.element_size()
    row = state_cache[0].numel() * item
    ranges = []
    for slot in slots:
        start = (state_cache.storage_offset() + slot * state_cache.stride(0)) * item
        ranges.append((start, start + row))
    return ranges


def _describe(t) -> str:
    return "None" if t is None else f"a tensor {tuple(t.shape)} {t.dtype}"
