"""Sequence independence: a sequence's values reach no other sequence's outputs.

A kernel that reads past a sequence's (or a chunk's) end and relies on zero weights to cancel what it read adds exact
zeros while every input is finite, so every other check passes; but 0 * inf is NaN, and one request's overflowed
activations then corrupt its neighbours in the batch. This check puts +inf into the x of every other sequence (the
odd ones in one call, the even ones in a second, so each pair of neighbours is tried both ways) and requires the
bits of the other sequences to be those of the case's own call: their rows of ``out``, the cache storage outside the
poisoned sequences' final slots, and their rows of the returned states (final states, or the states after each of
their chunks).
"""

from __future__ import annotations

import math

import torch

from harness.checks.base import Check
from harness.checks.calls import Call, assert_cache_equal_outside, shared_call, written_slots
from harness.checks.registry import register
from harness.compare import assert_bits_equal, storage_bytes


def _with_tokens(case) -> list[int]:
    return [b for b, s in enumerate(case.sequences) if s.tokens > 0]


def _applies(case) -> tuple[bool, str]:
    if len(_with_tokens(case)) < 2:
        return False, "fewer than two sequences with tokens: no other sequence to keep apart from"
    return True, ""


def _poisoned_call(ctx, poisoned: list[int]) -> Call:
    inputs = ctx.inputs()
    cu = inputs.cu_seqlens.tolist()
    for b in poisoned:
        inputs.x[cu[b]:cu[b + 1]] = math.inf
    return Call(f"x of sequences {poisoned} set to +inf", inputs, ctx.call(inputs))


def _assert_others_kept(case, base: Call, poisoned_call: Call, poisoned: list[int]) -> None:
    """Every element outside the poisoned sequences' own rows and slots has the case's call's bits."""
    what = f"with the x of sequences {poisoned} set to +inf"
    cu = base.inputs.cu_seqlens.tolist()
    rows = [slice(cu[b], cu[b + 1]) for b in poisoned]
    _assert_equal_outside(poisoned_call.inputs.out, base.inputs.out, rows, f"out rows of the other sequences {what}")
    assert_cache_equal_outside(poisoned_call.inputs, storage_bytes(base.inputs.cache_base),
                               written_slots(case, sequences=poisoned),
                               what=f"cache storage outside the poisoned sequences' final slots {what}")

    got, ref = poisoned_call.returned, base.returned
    if not isinstance(got, torch.Tensor) or not isinstance(ref, torch.Tensor) or got.shape != ref.shape:
        return  # returned_shapes judges what was returned; here only the rows of a well-formed one
    if case.call.final_state == "returned":
        theirs = poisoned
    else:  # checkpoint: the state after each chunk, a chunk of a poisoned sequence is theirs
        theirs = [c for c, b in enumerate(base.inputs.seq_idx.tolist()) if b in poisoned]
    _assert_equal_outside(got, ref, theirs, f"returned states of the other sequences {what}")


def _assert_equal_outside(actual: torch.Tensor, expected: torch.Tensor, theirs: list, what: str) -> None:
    """``actual`` has ``expected``'s bits everywhere but at the indices ``theirs`` (rows or slices of rows)."""
    expected = expected.clone()
    for index in theirs:
        expected[index] = actual[index]
    assert_bits_equal(actual, expected, what=what)


def _sequence_independence(ctx) -> dict:
    """+inf in the x of every other sequence leaves the rest bit-equal to the case's call (module docstring)."""
    case = ctx.case
    base = shared_call(ctx, "the case's call")
    with_tokens = _with_tokens(case)
    groups = [with_tokens[1::2], with_tokens[0::2]]
    for poisoned in groups:
        _assert_others_kept(case, base, _poisoned_call(ctx, poisoned), poisoned)
    return {"poisoned_groups": groups}


register(
    Check(
        name="sequence_independence",
        doc="+inf in one sequence's x leaves the other sequences' out rows, cache bytes and returned states",
        run=_sequence_independence,
        case_applies=_applies,
        shared_calls=("case",),
        cpu_calls=2.0,
        cpu_after_others=True,
    )
)
