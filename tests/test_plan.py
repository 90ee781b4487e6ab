"""The dispatch plan (``kernels.plan``) as a table: the call's facts in, what runs out; and ``ssd_prefill`` launching
exactly the plan's kernels, in its order."""

from __future__ import annotations

import pytest

from kernels.plan import PAIR_FROM_CHUNKS, Plan, plan

CONFIG = {"STATE_BLOCK_SIZE_M": 64, "num_warps": 4}  # any config: the plan only carries it
FEW, MANY = PAIR_FROM_CHUNKS - 1, PAIR_FROM_CHUNKS

# (path, copy, nchunks, cache rows aligned, one-kernel config, unfused) -> (gather, states, bmm, kernels)
TABLE = [
    # The shipped rule, snapshot path: the copy in the cumsum's kernel where the rows are aligned, else beside it.
    (("snapshot", "fused", FEW, True, CONFIG, False),
     ("in_cumsum", "fused", "after_states", ("chunk_cumsum_gather", "chunk_state_passing", "bmm_chunk", "chunk_scan"))),
    (("snapshot", "fused", FEW, False, CONFIG, False),
     ("beside_cumsum", "fused", "after_states",
      ("chunk_cumsum", "gather_initial_states", "chunk_state_passing", "bmm_chunk", "chunk_scan"))),
    (("snapshot", "torch", FEW, True, CONFIG, False),
     ("torch", "fused", "after_states", ("chunk_cumsum", "chunk_state_passing", "bmm_chunk", "chunk_scan"))),
    (("snapshot", "fused", MANY, True, CONFIG, False),
     ("in_cumsum", "pair", "in_chunk_state",
      ("chunk_cumsum_gather", "chunk_state_bmm", "state_passing_batched", "chunk_scan"))),
    (("snapshot", "fused", MANY, False, None, False),
     ("beside_cumsum", "pair", "before_chunk_state",
      ("chunk_cumsum", "gather_initial_states", "bmm_chunk", "chunk_state", "state_passing_batched", "chunk_scan"))),
    # Indexed path: no copy; the fused kernel reads the initial state by slot on calls of few chunks.
    (("indexed", None, FEW, True, CONFIG, False),
     (None, "fused", "after_states", ("chunk_cumsum", "chunk_state_passing", "bmm_chunk", "chunk_scan"))),
    (("indexed", None, 1, False, None, False),
     (None, "fused", "after_states", ("chunk_cumsum", "chunk_state_passing", "bmm_chunk", "chunk_scan"))),
    (("indexed", None, MANY, True, CONFIG, False),
     (None, "pair", "in_chunk_state", ("chunk_cumsum", "chunk_state_bmm", "state_passing_indexed", "chunk_scan"))),
    (("indexed", None, 64, True, None, False),
     (None, "pair", "before_chunk_state",
      ("chunk_cumsum", "bmm_chunk", "chunk_state", "state_passing_indexed", "chunk_scan"))),
    # The unfused plan: every stage in a kernel of its own, alone, whatever the configs and layout allow.
    (("snapshot", "fused", FEW, True, CONFIG, True),
     ("alone", "fused", "alone",
      ("chunk_cumsum", "gather_initial_states", "bmm_chunk", "chunk_state_passing", "chunk_scan"))),
    (("snapshot", "torch", MANY, True, CONFIG, True),
     ("torch", "pair", "alone", ("chunk_cumsum", "bmm_chunk", "chunk_state", "state_passing_batched", "chunk_scan"))),
    (("indexed", None, MANY, True, CONFIG, True),
     (None, "pair", "alone", ("chunk_cumsum", "bmm_chunk", "chunk_state", "state_passing_indexed", "chunk_scan"))),
    (("indexed", None, FEW, True, CONFIG, True),
     (None, "fused", "alone", ("chunk_cumsum", "bmm_chunk", "chunk_state_passing", "chunk_scan"))),
]


@pytest.mark.parametrize(("facts", "expected"), TABLE, ids=lambda v: "-".join(map(str, v[:4])) if len(v) == 6 else "")
def test_the_plan_table(facts, expected):
    path, copy, nchunks, aligned, config, unfused = facts
    p = plan(path=path, copy=copy, nchunks=nchunks, cache_rows_aligned=aligned, chunk_state_bmm=config,
             unfused=unfused)
    gather, states, bmm, kernels = expected
    assert (p.path, p.gather, p.states, p.bmm) == (path, gather, states, bmm)
    assert p.chunk_state_bmm == (config if bmm == "in_chunk_state" else None)
    assert p.kernels == kernels
    assert p.signals_after_cumsum is (gather == "beside_cumsum")


def test_the_table_reaches_every_value_of_every_field():
    """Every gather, states and bmm value a plan can take appears in the table above (a new value needs a row)."""
    from kernels.plan import BMMS, GATHERS, STATES

    rows = [e for _, e in TABLE]
    assert {g for g, *_ in rows} == {*GATHERS, None}
    assert {s for _, s, *_ in rows} == set(STATES)
    assert {b for _, _, b, _ in rows} == set(BMMS)


@pytest.mark.parametrize("fields", [
    dict(path="indexed", gather="torch", states="fused", bmm="after_states"),  # the indexed path makes no copy
    dict(path="snapshot", gather=None, states="fused", bmm="after_states"),  # the snapshot path always does
    dict(path="snapshot", gather="alone", states="pair", bmm="after_states"),  # bmm beside a fused kernel only
    dict(path="snapshot", gather="alone", states="fused", bmm="before_chunk_state"),  # no chunk state kernel
    dict(path="snapshot", gather="alone", states="pair", bmm="in_chunk_state"),  # without its config
    dict(path="sideways", gather=None, states="fused", bmm="alone"),
])
def test_an_impossible_plan_is_refused(fields):
    with pytest.raises(AssertionError):
        Plan(**fields)
