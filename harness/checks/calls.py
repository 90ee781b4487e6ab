"""Helpers the checks share: provider calls with their inputs kept (made once per case where checks make the same
call), and whole-call bit comparisons."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.compare import Mismatch, assert_bits_equal, assert_storage_equal, storage_bytes

WORKSPACE_KWARG = "workspace_out"


@dataclass
class Call:
    """A finished ``ssd_prefill`` call: the (mutated) inputs it ran on and what it returned. Checks only read it: a
    shared call is the same object for every check of the case."""

    label: str  # e.g. "path=snapshot"
    inputs: Any  # CaseInputs
    returned: torch.Tensor | None
    # The (C,H,P,N) states workspace the provider handed back through the optional ``workspace_out`` keyword
    # (docs/provider.md): entering states on the indexed path, exiting states on the snapshot path. None when the
    # provider has no such keyword.
    workspace: torch.Tensor | None = None


def run_call(ctx, label: str, *, path: str | None = None) -> Call:
    """``provider.ssd_prefill`` on fresh inputs (the case's own path unless ``path`` says) in the case's final-state
    mode, with ``workspace_out={}``. A provider without that keyword rejects it when binding its arguments; it is then
    called plainly on fresh inputs."""
    inputs = ctx.inputs()
    workspace: dict = {}
    try:
        returned = ctx.provider.ssd_prefill(**inputs.kwargs(path=path), **{WORKSPACE_KWARG: workspace})
    except TypeError as exc:
        if WORKSPACE_KWARG not in str(exc):
            raise
        inputs = ctx.inputs()
        return Call(label, inputs, ctx.call(inputs, path=path))
    return Call(label, inputs, returned, workspace.get("states"))


def shared_call(ctx, label: str, *, path: str | None = None) -> Call:
    """``run_call``, made once per case and path in this process and shared by every check that asks for it: the
    checks that judge one call on the case's inputs (storage, read-only inputs, returned shapes, the reference bound,
    the first of determinism's two calls, the paths compared with each other) then cost one interpreted or compiled
    call between them instead of one each. A call that raises is not kept: each check asking for it calls again and
    reports what it raised."""
    key = path or ctx.case.call.path
    if key not in ctx.shared_calls:
        ctx.shared_calls[key] = run_call(ctx, label, path=path)
    return replace(ctx.shared_calls[key], label=label)


def assert_returned_equal(actual: Call, expected: Call) -> None:
    """Both None, or both tensors with the same shape, dtype and bits."""
    what = f"returned tensor ({actual.label} vs {expected.label})"
    a, e = actual.returned, expected.returned
    if a is None and e is None:
        return
    if a is None or e is None:
        raise Mismatch(
            f"{what}: {actual.label} returned {describe_returned(a)}, "
            f"{expected.label} returned {describe_returned(e)}",
            count=-1,
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


def written_slots(case, final_state: str | None = None, sequences: list[int] | None = None) -> list[int]:
    """Cache slots a call is allowed to write: final slots >= 0 of a direct-writeback call (of the given sequences'
    indices, default all), else none."""
    mode = final_state or case.call.final_state
    if mode != "direct":
        return []
    chosen = case.sequences if sequences is None else [case.sequences[b] for b in sequences]
    return sorted({s.final_slot for s in chosen if s.final_slot is not None and s.final_slot >= 0})


def assert_cache_equal_outside(inputs, expected_bytes: torch.Tensor, slots: list[int], *, what: str) -> None:
    """``inputs``' whole cache storage holds ``expected_bytes`` (``storage_bytes`` of it earlier) everywhere but the
    rows of ``slots``, which may hold anything."""
    expected = expected_bytes.clone()
    after = storage_bytes(inputs.cache_base)
    for start, stop in slot_byte_ranges(inputs.state_cache, slots):
        expected[start:stop] = after[start:stop]
    assert_storage_equal(inputs.cache_base, expected, what=what, element=inputs.cache_base.dtype)


def slot_byte_ranges(state_cache: torch.Tensor, slots: list[int]) -> list[tuple[int, int]]:
    """[start, stop) byte ranges in the backing storage of ``state_cache[slot]`` (inner dims compact)."""
    item = state_cache.element_size()
    row = state_cache[0].numel() * item
    ranges = []
    for slot in slots:
        start = (state_cache.storage_offset() + slot * state_cache.stride(0)) * item
        ranges.append((start, start + row))
    return ranges


def describe_returned(value) -> str:
    """What a provider returned, in words: "None", "a tensor (2, 4) torch.float16", or the type of anything else
    (a provider may return anything; the report must say what without touching tensor attributes)."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"a tensor {tuple(value.shape)} {value.dtype}"
    return f"a {type(value).__name__}, not a tensor"
