"""Initial/final state semantics: masked states act as zeros, returned tensors have the documented shape."""

from __future__ import annotations

import torch

from harness.checks.base import Check
from harness.checks.calls import Call, assert_returned_equal, describe_returned, shared_call, written_slots
from harness.checks.registry import register
from harness.compare import Mismatch, assert_bits_equal


def _masked_applies(case) -> tuple[bool, str]:
    masked = [b for b, s in enumerate(case.sequences) if not s.has_state]
    if not masked:
        return False, "every sequence has has_state: true (no masked initial state)"
    masked_slots = {case.sequences[b].init_slot for b in masked}
    shared = sorted(masked_slots & {s.init_slot for s in case.sequences if s.has_state})
    if shared:
        return False, f"init slots {shared} are read both masked and unmasked; zero-filling them changes other inputs"
    return True, ""


def _masked_state(ctx) -> dict:
    """Sequences with has_state false (slot holding NaN) give the same bits as has_state true over a zeroed slot."""
    case = ctx.case
    masked = [b for b, s in enumerate(case.sequences) if not s.has_state]
    as_built = shared_call(ctx, "masked NaN slot")
    zeroed_inputs = ctx.inputs()
    for b in masked:
        zeroed_inputs.state_cache[case.sequences[b].init_slot].zero_()
        zeroed_inputs.has_initial_states[b] = True
    zeroed = Call("zero initial state", zeroed_inputs, ctx.call(zeroed_inputs))
    assert_bits_equal(as_built.inputs.out, zeroed.inputs.out, what="out (masked NaN slot vs zero initial state)")
    for slot in written_slots(case):
        assert_bits_equal(
            as_built.inputs.state_cache[slot],
            zeroed.inputs.state_cache[slot],
            what=f"final state in slot {slot} (masked NaN slot vs zero initial state)",
        )
    assert_returned_equal(as_built, zeroed)
    return {"masked_sequences": masked}


def _expected_returned(case, inputs) -> tuple[tuple[int, ...], torch.dtype] | None:
    mode = case.call.final_state
    if mode == "direct":
        return None
    _, heads, headdim, dstate = inputs.state_cache.shape
    rows = len(case.sequences) if mode == "returned" else case.metadata().nchunks
    return (rows, heads, headdim, dstate), inputs.state_cache.dtype


def _returned_shapes(ctx) -> dict:
    """direct: None; returned: (batch, H, P, N); checkpoint: (nchunks, H, P, N); both in the cache dtype."""
    call = shared_call(ctx, f"final_state={ctx.case.call.final_state}")
    expected = _expected_returned(ctx.case, call.inputs)
    got = call.returned
    if expected is None:
        if got is not None:
            raise Mismatch(
                f"returned: direct writeback must return None, found {describe_returned(got)}", count=-1
            )
        return {"returned": None}
    shape, dtype = expected
    if not isinstance(got, torch.Tensor):
        raise Mismatch(f"returned: expected a tensor {shape} {dtype}, found {describe_returned(got)}", count=-1)
    if tuple(got.shape) != shape or got.dtype != dtype or got.device != call.inputs.out.device:
        raise Mismatch(
            f"returned: expected {shape} {dtype} on {call.inputs.out.device}, "
            f"found {tuple(got.shape)} {got.dtype} on {got.device}",
            count=-1,
        )
    return {"returned": f"{shape} {dtype}"}


register(
    Check(
        name="masked_state",
        doc="has_state false over a NaN slot == has_state true over a zeroed slot (bits)",
        run=_masked_state,
        case_applies=_masked_applies,
        shared_calls=('case',),
        cpu_calls=1.1,
    )
)
register(
    Check(
        name="returned_shapes",
        doc="returned tensors have the documented shape and dtype (None for direct writeback)",
        run=_returned_shapes,
        shared_calls=('case',),
        cpu_calls=0.0,
    )
)
