"""sequence_independence: every branch of what it compares can fail, and it never passes where it did not look.

The broken providers of ``tests.broken_providers`` leak ``0 * x`` of the next sequence into the sequence before:
exact zeros while x is finite (every other check passes), NaN once the check puts +inf there.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.checks import Status, load_provider, run_check, selected_checks
from harness.checks.independence import _owners
from tests import broken_providers as bp


@pytest.fixture(scope="module")
def kernels_provider():
    return load_provider("kernels:provider")


def _checkpoint(case):
    """The case calling in checkpoint mode (the state after each chunk returned; tiny-returned has a chunk a
    sequence, so the leaky provider's row b is sequence b's chunk)."""
    return replace(case, call=replace(case.call, final_state="checkpoint"))


# owner: which rows the failure says were hit, and whose (the leaky providers write into the last row before the
# poisoned sequence); the cache's bytes have no rows of a sequence to name.
@pytest.mark.parametrize(("provider", "case_id", "mode", "where", "owner"), [
    (bp.LeaksIntoPreviousOutput, "tiny-batch", None, "out rows of the other sequences",
     "sequence 0: token 9 (1 of its 10)"),
    (bp.LeaksIntoPreviousState, "tiny-batch", None, "cache storage outside the poisoned sequences' final slots", None),
    (bp.LeaksIntoPreviousState, "tiny-returned", None, "returned states of the other sequences",
     "sequence 0: row 0 (1 of its 1)"),
    (bp.LeaksIntoPreviousState, "tiny-returned", _checkpoint, "returned states of the other sequences",
     "sequence 0: chunk 0 (1 of its 1)"),
])
def test_a_leak_is_caught_where_it_lands(tiny_cases, device, provider, case_id, mode, where, owner):
    case = mode(tiny_cases[case_id]) if mode else tiny_cases[case_id]
    if mode:
        assert case.metadata().nchunks == len(case.sequences)  # the leaky provider's premise (see _checkpoint)
    result = run_check(case, "sequence_independence", provider(), device=device)
    assert result.status is Status.FAILED, result.reason
    assert where in result.summary and "with the x of sequences [1] set to +inf" in result.summary, result.summary
    if owner:
        assert f"rows that differ, by the sequence they belong to: {owner}" in result.message, result.message


def test_the_leaks_pass_every_other_check(tiny_cases, device):
    """What makes the check needed: with finite inputs a leak of exact zeros gives the bits of a correct kernel."""
    case = tiny_cases["tiny-batch"]
    for name, _ in selected_checks(case):
        if name in ("sequence_independence", "autotune_idempotent", "state_passing_exact", "gather_exact"):
            continue  # the stage-level checks launch the wrapped provider's stages, not its leaky call
        result = run_check(case, name, bp.LeaksIntoPreviousOutput(), device=device)
        assert result.status is Status.PASSED, (name, result.message or result.reason)


def test_checkpoint_states_pass_on_our_kernels(tiny_cases, kernels_provider, device):
    case = _checkpoint(tiny_cases["tiny-returned"])
    result = run_check(case, "sequence_independence", kernels_provider, device=device)
    assert result.status is Status.PASSED, result.message
    assert result.stats["poisoned_groups"] == [[1], [0]]


def test_a_single_sequence_is_not_applicable_and_says_why(tiny_cases, kernels_provider, device):
    case = tiny_cases["tiny-direct"]
    assert "sequence_independence" not in [name for name, _ in selected_checks(case)]
    result = run_check(case, "sequence_independence", kernels_provider, device=device)
    assert result.status is not Status.PASSED
    assert "fewer than two sequences with tokens" in result.reason


def test_the_owners_line_names_each_hit_sequence_its_span_and_count():
    """Rows hit in two sequences: each sequence with its first and last hit row and how many of its rows."""
    token_sequence = [0] * 4 + [1] * 6
    line = _owners([1, 2, 5, 9], token_sequence, "token")
    assert line == ("rows that differ, by the sequence they belong to: sequence 0: tokens 1..2 (2 of its 4); "
                    "sequence 1: tokens 5..9 (2 of its 6)"), line
