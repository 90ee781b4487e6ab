"""The corpus generator: deterministic bytes, the checked-in corpus is current, and it covers the issue's axes."""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from harness.cases import load_cases
from harness.cases.covering import covering_rows, uncovered_targets
from harness.cases.generate import COMMAND, HEADER, SHAPES, generate_corpus

CORPUS = Path(__file__).resolve().parents[1] / "cases" / "corpus"


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.yaml"))}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus_a")
    generate_corpus(out)
    return out


@pytest.fixture(scope="module")
def cases():
    return load_cases([CORPUS])


def test_generating_twice_gives_identical_bytes(fresh, tmp_path):
    generate_corpus(tmp_path)
    assert _files(fresh) == _files(tmp_path)


def test_checked_in_corpus_equals_a_fresh_run(fresh):
    checked_in, generated = _files(CORPUS), _files(fresh)
    assert sorted(checked_in) == sorted(generated)
    stale = [name for name in generated if checked_in[name] != generated[name]]
    assert not stale, f"regenerate with `python -m harness generate --out cases/corpus`: {stale} differ"


def test_the_header_names_the_command_that_writes_the_corpus():
    """The first line of every corpus file is the command ``make generate`` runs, which the CLI has."""
    makefile = (CORPUS.parents[1] / "Makefile").read_text()
    assert f"$(PY) -m {COMMAND.removeprefix('python -m ')}\n" in makefile
    assert all(p.read_text().startswith(HEADER) for p in CORPUS.glob("*.yaml"))
    assert f"`{COMMAND}`" in HEADER


def test_determinism_check_sees_a_changed_file(fresh, tmp_path):
    """Negative control: the byte comparison notices one edited file."""
    generate_corpus(tmp_path)
    edited = tmp_path / "serving.yaml"
    edited.write_text(edited.read_text().replace("seed: ", "seed: 1", 1))
    assert _files(fresh) != _files(tmp_path)


def test_covering_rows_cover_every_pair_and_group():
    axes = {"a": (0, 1, 2), "b": ("x", "y"), "c": (True, False), "d": (1, 2, 3, 4)}
    valid = lambda row: not (row.get("a") == 2 and row.get("b") == "y")  # noqa: E731
    rows = covering_rows(axes, groups=[("a", "c", "d")], valid=valid)
    assert not uncovered_targets(rows, axes, [("a", "c", "d")], valid)
    assert all(valid(r) for r in rows)
    assert len(rows) < 3 * 2 * 2 * 4  # fewer than the full product
    # Negative control: dropping a row leaves some combination uncovered.
    assert uncovered_targets(rows[1:], axes, [("a", "c", "d")], valid)


def test_corpus_size_and_tiers(cases):
    from harness.checks import selected_checks
    from harness.checks.tiers import CPU_CASE_SECONDS, cpu_plan, cpu_tier_items, runs_on_cpu

    assert 150 <= len(cases) <= 400
    on_cpu, items = cpu_tier_items(cases)
    # docs/checks.md#tiers. every_config costs a call per forced config, so the tier runs it on the small cases only;
    # the other checks' share is what the case budget was chosen for (every item of the earlier tier, about three
    # quarters of the corpus's items).
    forced = sum(n == "every_config" for c in cases for n, _ in selected_checks(c))
    forced_on_cpu = sum(runs_on_cpu(c, n) for c in cases for n, _ in selected_checks(c) if n == "every_config")
    assert 0.7 <= (on_cpu - forced_on_cpu) / (items - forced) <= 0.8, (on_cpu, items, forced_on_cpu, forced)
    assert forced_on_cpu > 0, "every_config runs on no case of the CPU tier"
    for c in cases:
        names = [n for n, _ in selected_checks(c)]
        if c.family == "index_layouts":  # gather layouts run on both tiers, whatever their size
            assert c.tiers.cpu is True and all(runs_on_cpu(c, n) for n in names), c.id
        else:  # the others follow the estimate: what runs fits the case's limit, and nothing else would
            assert c.tiers.cpu is None, c.id
            plan = cpu_plan(c)
            assert plan.spent <= CPU_CASE_SECONDS, c.id
            assert all(plan.spent + plan.seconds[n] > CPU_CASE_SECONDS for n in names if n not in plan.runs), c.id
    assert len({c.id for c in cases}) == len(cases)
    assert set(Counter(c.family for c in cases)) == {"direct", "multi", "fallback", "index_layouts", "serving"}


# The tier as it stood before its constants were refitted to the faster interpreter (docs/decisions.md): the case
# items it ran are the CPU coverage any later tier keeps.
EARLIER_TIER = {"per_block": 0.028, "per_state": 3.3e-7, "budget": 2.0}


def _on_cpu(cases) -> set:
    from harness.checks import selected_checks
    from harness.checks.tiers import runs_on_cpu

    return {(c.id, n) for c in cases for n, _ in selected_checks(c) if runs_on_cpu(c, n)}


def test_the_tier_runs_every_item_the_earlier_tier_ran(cases):
    from harness.checks.tiers import costed

    with costed(**EARLIER_TIER):
        earlier = _on_cpu(cases)
    now = _on_cpu(cases)
    assert earlier <= now, sorted(earlier - now)
    assert len(now) > len(earlier)
    # The comparison can fail: at a case budget of 1 s, the serving shapes' state_passing_exact items drop out.
    with costed(budget=1.0):
        left_out = earlier - _on_cpu(cases)
    assert left_out and all(check == "state_passing_exact" for _, check in left_out), sorted(left_out)


def test_corpus_covers_dtypes_and_shapes(cases):
    direct = [c for c in cases if c.family == "direct"]
    triples = {(c.dtype.io, c.dtype.state, c.shape) for c in direct}
    dtypes = ("float16", "bfloat16", "float32")
    assert triples == {(i, s, sh) for i in dtypes for s in dtypes for sh in SHAPES.values()}
    required = {(3, 5, 16, 3, 64), (11, 19, 32, 1, 64), (4, 16, 64, 2, 128), (8, 64, 128, 2, 128), (2, 32, 256, 1, 256),
                (64, 64, 128, 1, 256)}
    assert required <= {(s.nheads, s.headdim, s.dstate, s.ngroups, s.chunk_size) for s in (c.shape for c in cases)}


def test_corpus_covers_sequences_slots_and_options(cases):
    direct = [c for c in cases if c.family == "direct"]
    assert all(c.indexed_eligible() for c in direct)
    contexts = {(s.context, c.shape.chunk_size) for c in direct for s in c.sequences}
    tokens = {(s.tokens, c.shape.chunk_size) for c in direct for s in c.sequences}
    def relative(x: int, q: int) -> str:
        for value, name in ((0, "0"), (1, "1"), (q - 1, "q-1"), (q, "q")):
            if x == value:
                return name
        return str(x)

    rel_ctx = {relative(x, q) for x, q in contexts}
    assert {"0", "1", "q-1", "q", "4224"} <= rel_ctx
    rel_tok = {"q" if t == q else "2q+5" if t == 2 * q + 5 else str(t) for t, q in tokens}
    assert {"1", "32", "q", "2q+5", "600", "1600"} <= rel_tok
    seq = [s for c in direct for s in c.sequences]
    assert any(s.init_slot == s.final_slot and s.has_state for s in seq)  # in place
    assert any(s.init_slot != s.final_slot and s.final_slot >= 0 for s in seq)  # distinct
    assert any(not s.has_state for s in seq)  # masked NaN slot
    assert any(s.final_slot < 0 for s in seq)  # padded
    assert {c.options.D for c in direct} == {"none", "per_head", "per_channel"}
    for flag in ("z", "dt_bias", "dt_softplus"):
        assert {getattr(c.options, flag) for c in direct} == {True, False}
    assert {c.options.dt_limit for c in direct} == {(0.0, math.inf), (0.01, 0.1)}
    assert {c.cache.row_pad for c in direct} >= {0, 3, 64} and {c.cache.offset for c in direct} >= {0, 5, 8}
    assert {c.cache.fill for c in direct} == {"nan", -7.25}
    assert any(c.cache.slots == 16 for c in direct) and any(c.cache.slots == 3 for c in direct)


def test_corpus_covers_index_layouts(cases):
    layouts = {(c.indices.layout, c.indices.dtype) for c in cases}
    assert layouts == {(layout, d) for layout in ("contiguous", "block_table") for d in ("int32", "int64")}
    offsets = [
        c.indices.column_byte_offset(col) % 16 == 0
        for c in cases
        if c.indices.layout == "block_table"
        for col in (c.indices.init_column, c.indices.final_column)
        if col is not None
    ]
    assert True in offsets and False in offsets
    gather = [c for c in cases if c.family == "index_layouts"]
    strides = {(c.indices.dtype, c.indices.columns if c.indices.layout == "block_table" else 1) for c in gather}
    assert {("int32", 1), ("int32", 16), ("int64", 1), ("int64", 16)} <= strides


def test_corpus_covers_ineligible_calls(cases):
    multi = [c for c in cases if c.family == "multi"]
    assert all(not c.indexed_eligible() for c in multi)
    crossed = [
        c for c in multi
        if any(a.final_slot == b.init_slot and b.final_slot == a.init_slot
               for i, a in enumerate(c.sequences) for b in c.sequences[i + 1:])
    ]
    shared = [c for c in multi if len({s.init_slot for s in c.sequences}) < c.batch]
    assert crossed and shared
    assert {c.batch for c in multi} == {2, 3}
    calls = Counter(c.call.final_state for c in cases)
    assert calls["checkpoint"] > 0 and calls["returned"] > 0 and calls["direct"] > 0
    serving = [c for c in cases if c.family == "serving"]
    assert any(c.sequences[0].context == 4224 and c.sequences[0].tokens == 32 and c.batch == 1 for c in serving)
