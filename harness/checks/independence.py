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
from harness.compare import Mismatch, assert_bits_equal, int_view, storage_bytes


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
    token_sequence = [b for b in range(len(cu) - 1) for _ in range(cu[b], cu[b + 1])]
    _assert_equal_outside(poisoned_call.inputs.out, base.inputs.out, rows, f"out rows of the other sequences {what}",
                          row_sequence=token_sequence, row_name="token")
    assert_cache_equal_outside(poisoned_call.inputs, storage_bytes(base.inputs.cache_base),
                               written_slots(case, sequences=poisoned),
                               what=f"cache storage outside the poisoned sequences' final slots {what}")

    got, ref = poisoned_call.returned, base.returned
    if not isinstance(got, torch.Tensor) or not isinstance(ref, torch.Tensor) or got.shape != ref.shape:
        return  # returned_shapes judges what was returned; here only the rows of a well-formed one
    if case.call.final_state == "returned":
        row_sequence, row_name = list(range(len(case.sequences))), "row"
    else:  # checkpoint: the state after each chunk, a chunk of a poisoned sequence is theirs
        row_sequence, row_name = base.inputs.seq_idx.tolist(), "chunk"
    theirs = [row for row, b in enumerate(row_sequence) if b in poisoned]
    _assert_equal_outside(got, ref, theirs, f"returned states of the other sequences {what}",
                          row_sequence=row_sequence, row_name=row_name)


def _assert_equal_outside(actual: torch.Tensor, expected: torch.Tensor, theirs: list, what: str, *,
                          row_sequence: list[int], row_name: str) -> None:
    """``actual`` has ``expected``'s bits everywhere but at the indices ``theirs`` (rows or slices of rows); a
    failure also says which sequences own the rows that differ (``row_sequence``: each row's sequence)."""
    expected = expected.clone()
    for index in theirs:
        expected[index] = actual[index]
    try:
        assert_bits_equal(actual, expected, what=what)
    except Mismatch:  # only a failure pays for finding the rows and their owners
        differ = (int_view(actual) != int_view(expected)).reshape(actual.shape[0], -1).any(dim=1)
        assert_bits_equal(actual, expected, what=what,
                          context=_owners(differ.nonzero().flatten().tolist(), row_sequence, row_name))


def _owners(rows: list[int], row_sequence: list[int], row_name: str) -> str:
    """'rows that differ, by the sequence they belong to: sequence 1: tokens 32..40 (9 of its 9)'."""
    by_sequence: dict[int, list[int]] = {}
    for row in rows:
        by_sequence.setdefault(row_sequence[row], []).append(row)
    parts = []
    for b, own in sorted(by_sequence.items()):
        span = f"{row_name} {own[0]}" if len(own) == 1 else f"{row_name}s {own[0]}..{own[-1]}"
        parts.append(f"sequence {b}: {span} ({len(own)} of its {row_sequence.count(b)})")
    return "rows that differ, by the sequence they belong to: " + "; ".join(parts)


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
