"""The case schema and loader: malformed files give their exact error, the JSON Schema agrees, cases round-trip."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from harness.cases import CaseError, dump_case, load_case_file, load_cases
from harness.cases.files import case_files
from harness.cases.loader import _FastStrictLoader, _StrictLoader
from harness.cases.model import Expect, InputKnobs, Tiers, count_chunks
from harness.cases.schema import SCHEMA, SCHEMA_FILE, schema_json

ROOT = Path(__file__).resolve().parents[1]
MALFORMED = Path(__file__).resolve().parent / "malformed"
EXPECTED = yaml.safe_load((MALFORMED / "expected.yaml").read_text())
CASE_DIRS = [ROOT / "cases" / "corpus", ROOT / "cases" / "regressions"]

DESIGN_EXAMPLE = """\
schema: ssd-case/1
id: crossed-slots-bf16
description: free text
seed: 7
shape: {nheads: 8, headdim: 64, dstate: 128, ngroups: 2, chunk_size: 64}
dtype: {io: bfloat16, state: float16}
options: {D: per_head, z: true, dt_bias: true, dt_softplus: true, dt_limit: [0.0, .inf]}
sequences:
  - {context: 4224, tokens: 32, init_slot: 3, has_state: true, final_slot: 5}
  - {context: 0, tokens: 300, init_slot: 5, has_state: false, final_slot: 3}
cache: {slots: 16, row_pad: 64, offset: 8, fill: nan}
indices: {layout: block_table, dtype: int32, columns: 5, init_column: 0, final_column: 1, rows_before: 3}
call: {final_state: direct, path: auto}
checks: [all]
expect: pass
"""

MINIMAL = """\
schema: ssd-case/1
id: minimal-1
seed: 0
shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
dtype: {io: float32, state: float32}
sequences: [{context: 3, tokens: 20, init_slot: 0, has_state: true, final_slot: 1}]
cache: {slots: 2}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_every_malformed_file_has_an_expected_error():
    files = sorted(p.name for p in MALFORMED.glob("*.yaml") if p.name != "expected.yaml")
    assert files == sorted(EXPECTED)
    assert len(files) >= 20


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_malformed_file_raises_its_exact_error(name):
    path = MALFORMED / name
    with pytest.raises(CaseError) as info:
        load_case_file(path)
    assert str(info.value) == f"{path}: {EXPECTED[name]['error']}"
    assert info.value.file == str(path)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_json_schema_agrees_on_malformed_file(name):
    """Structural errors are rejected by both validators; combinations only the loader can check pass jsonschema."""
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (dev extra) checks the shipped schema file")
    verdict = EXPECTED[name]["jsonschema"]
    text = (MALFORMED / name).read_text()
    if verdict == "unparsable":
        with pytest.raises(yaml.YAMLError):
            yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
        return
    data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506
    errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data))
    assert (verdict == "rejects") == bool(errors), [e.message for e in errors]


def test_corpus_and_regressions_validate_against_json_schema():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (dev extra) checks the shipped schema file")
    validator = jsonschema.Draft202012Validator(SCHEMA)
    files = case_files(CASE_DIRS)
    assert files, "no case files found"
    for f in files:
        errors = list(validator.iter_errors(yaml.safe_load(f.read_text())))
        assert not errors, f"{f}: {[e.message for e in errors]}"
        assert load_case_file(f)


def test_libyaml_loader_reads_every_case_file_as_the_python_loader_does():
    """Good files load through libyaml (start-up speed); it must not change a single value, nor let a repeated key
    pass."""
    for f in case_files(CASE_DIRS):
        text = f.read_text()
        assert yaml.load(text, Loader=_FastStrictLoader) == yaml.load(text, Loader=_StrictLoader), f  # noqa: S506
    with pytest.raises(yaml.constructor.ConstructorError, match="key 'seed' repeated"):
        yaml.load("seed: 1\nseed: 2\n", Loader=_FastStrictLoader)  # noqa: S506


def test_shipped_schema_file_is_current_and_a_valid_schema():
    assert SCHEMA_FILE.read_text() == schema_json(), "regenerate it: python -m harness schema"
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (dev extra) checks the shipped schema file")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_design_example_loads_with_its_values(tmp_path):
    (case,) = load_case_file(_write(tmp_path, "example.yaml", DESIGN_EXAMPLE))
    assert case.id == "crossed-slots-bf16" and case.family == "crossed"
    assert case.shape.nheads == 8 and case.dtype.io == "bfloat16" and case.dtype.state == "float16"
    assert case.options.dt_limit == (0.0, math.inf)
    assert [s.final_slot for s in case.sequences] == [5, 3]
    assert case.cache.fill == "nan" and case.indices.rows_before == 3
    assert case.checks == ("all",) and case.expect == Expect("pass")
    assert case.tiers == Tiers() and case.cpu_blocks() == 48  # 6 chunks x 8 heads: the CPU tier by estimate
    elig = case.indexed_eligible()
    assert not elig and "2 sequences" in elig.reason
    assert case.metadata().batch == 2 and case.metadata().total_tokens == 332


def test_defaults_of_a_minimal_case(tmp_path):
    (case,) = load_case_file(_write(tmp_path, "minimal.yaml", MINIMAL))
    assert case.description == ""
    assert case.options.D == "none" and not case.options.z and case.options.dt_limit == (0.0, math.inf)
    assert case.cache.row_pad == 0 and case.cache.offset == 0 and case.cache.fill == "nan"
    assert case.indices.layout == "contiguous" and case.indices.dtype == "int32"
    assert case.call.final_state == "direct" and case.call.path == "auto"
    assert case.inputs == InputKnobs()
    assert case.tiers == Tiers() and case.cpu_blocks() == 4  # 2 chunks x 2 heads
    assert case.indexed_eligible() and tuple(case.indexed_eligible()) == (True, "")
    assert case.source == tmp_path / "minimal.yaml" and case.index_in_file == 0 and case.line == 0
    assert "minimal-1" in case.summary() and "\n" not in case.summary()


def test_each_case_knows_the_line_it_starts_on(tmp_path):
    """0-based, as pytest counts an item's location (the line its skip lines name)."""
    body = [line for line in MINIMAL.splitlines() if not line.startswith("schema:")]
    listed = "schema: ssd-case/1\n# a comment\ncases:\n"
    starts = []
    for k in range(3):
        starts.append(listed.count("\n"))
        listed += "".join(("  - " if i == 0 else "    ") + line.replace("minimal-1", f"c{k}") + "\n"
                          for i, line in enumerate(body))
    cases = load_case_file(_write(tmp_path, "listed.yaml", listed))
    assert [c.line for c in cases] == starts and starts[0] == 3, (listed, [c.line for c in cases])


def _round_trip(tmp_path: Path, case, name: str):
    (back,) = load_case_file(_write(tmp_path, name, dump_case(case)))
    assert back == case
    return back


def test_round_trip_of_the_design_example_and_variants(tmp_path):
    (case,) = load_case_file(_write(tmp_path, "example.yaml", DESIGN_EXAMPLE))
    _round_trip(tmp_path, case, "rt0.yaml")
    variants = [
        replace(case, family="explicit_family", expect=Expect("xfail", "wrong bits, see commit abc123")),
        replace(case, expect=Expect("xfail", "vLLM writes slot -1", ("peers.vllm_ssd:provider", "mine.sub:obj.attr"))),
        replace(case, inputs=InputKnobs(dt_offset=-5.5, x_scale=0.25), tiers=Tiers(cpu=True)),
        replace(case, tiers=Tiers(cpu=False)),
        replace(case, cache=replace(case.cache, fill=-7.25), options=replace(case.options, dt_limit=(0.01, 0.1))),
        replace(case, checks=("path_equivalence", "storage_unchanged")),
    ]
    for i, variant in enumerate(variants):
        back = _round_trip(tmp_path, variant, f"rt{i + 1}.yaml")
        assert back.family == variant.family and back.expect == variant.expect and back.inputs == variant.inputs


def test_an_xfail_for_named_providers_applies_to_them_only(tmp_path):
    text = MINIMAL + "expect: {xfail: 'their bug, see docs', providers: [peers.vllm_ssd:provider, theirs:p]}\n"
    (case,) = load_case_file(_write(tmp_path, "scoped.yaml", text))
    assert case.expect == Expect("xfail", "their bug, see docs", ("peers.vllm_ssd:provider", "theirs:p"))
    assert case.expect.fails_for("peers.vllm_ssd:provider") and case.expect.fails_for("theirs:p")
    assert not case.expect.fails_for("kernels:provider") and not case.expect.fails_for("reference:provider")
    everyone = Expect("xfail", "our bug")
    assert everyone.fails_for("kernels:provider") and everyone.fails_for("peers.vllm_ssd:provider")
    assert not Expect().fails_for("kernels:provider")


def test_round_trip_changes_are_seen():
    """Negative control for the round-trip test: equality notices a changed field but ignores the source path."""
    case = load_cases([CASE_DIRS[0]])[0]
    assert replace(case, seed=case.seed + 1) != case
    assert replace(case, source=Path("elsewhere.yaml"), index_in_file=7, line=70) == case


def test_round_trip_of_every_corpus_case(tmp_path):
    cases = load_cases([CASE_DIRS[0]])
    text = "".join(f"---\n{dump_case(c)}" for c in cases)
    docs = list(yaml.safe_load_all(text))
    assert len(docs) == len(cases)
    for i, case in enumerate(cases):
        (back,) = load_case_file(_write(tmp_path, f"c{i}.yaml", dump_case(case)))
        assert back == case, case.id


def test_chunk_count_of_the_tier_rule_matches_the_metadata():
    for case in load_cases([CASE_DIRS[0]]):
        assert count_chunks(case.shape.chunk_size, case.sequences) == case.metadata().nchunks, case.id


def test_duplicate_id_across_files_names_both_files(tmp_path):
    first = _write(tmp_path, "a/one.yaml", MINIMAL)
    second = _write(tmp_path, "b/two.yaml", MINIMAL)
    with pytest.raises(CaseError) as info:
        load_cases([tmp_path])
    msg = str(info.value)
    assert msg == f"{second}: id: expected an id unique across the corpus, found 'minimal-1', already used in {first}"


def test_load_cases_recurses_into_directories_in_sorted_order(tmp_path):
    _write(tmp_path, "z/deep/two.yaml", MINIMAL.replace("minimal-1", "minimal-2"))
    _write(tmp_path, "a.yaml", MINIMAL)
    _write(tmp_path, "notes.txt", "not a case")
    assert [c.id for c in load_cases([tmp_path])] == ["minimal-1", "minimal-2"]


def test_nan_fill_spellings_mean_the_same(tmp_path):
    (a,) = load_case_file(_write(tmp_path, "a.yaml", MINIMAL.replace("{slots: 2}", "{slots: 2, fill: nan}")))
    (b,) = load_case_file(_write(tmp_path, "b.yaml", MINIMAL.replace("{slots: 2}", "{slots: 2, fill: .nan}")))
    assert a.cache.fill == b.cache.fill == "nan"


def test_case_error_format():
    err = CaseError("x.yaml", "sequences[0].tokens", "an integer >= 1", "0")
    assert str(err) == "x.yaml: sequences[0].tokens: expected an integer >= 1, found 0"


def test_case_create_fills_in_the_schema_defaults(tmp_path):
    """``Case.create`` given only what a minimal YAML case says equals that case as loaded (its defaults are the
    loader's, the cache is sized to the slots named); a field it is given wins over the default."""
    from harness.cases.model import CallSpec, Case, Shape

    (loaded,) = load_case_file(_write(tmp_path, "minimal.yaml", MINIMAL))
    fields = dict(shape=Shape(nheads=2, headdim=4, dstate=16, ngroups=1, chunk_size=16), dtype=("float32", "float32"),
                  sequences=[(3, 20, 0, True, 1)])
    assert Case.create("minimal-1", **fields) == loaded
    snapshot = Case.create("minimal-1", **fields, call=CallSpec(path="snapshot"))
    assert snapshot != loaded and snapshot.call == CallSpec(final_state="direct", path="snapshot")
