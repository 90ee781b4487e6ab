"""Bad case files through the CLI: each kind is one clear error (file, key or line, expected, found) in ``validate``
and in ``run``, every bad file of a folder is reported and the good files still run; sizes no device holds are
refused before anything is allocated; each file is parsed once; ``.yml`` files are cases; nothing run is never a
pass (exit 2); temporary files are unique and removed.

The CLI runs in this process (``tests.support.harness``); the good case runs one check against the PyTorch
reference provider, so each run takes a fraction of a second on any device.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import yaml

from harness.cases import CaseError, load_case_file, load_cases
from harness.cases.files import REPO_ROOT, case_files, is_case_file
from harness.cases.loader import MAX_FILE_BYTES
from harness.report import ItemRecord, Report
from tests import broken_providers as bp
from tests.support import harness

GOOD = """\
schema: ssd-case/1
id: good-1
seed: 0
shape: {nheads: 2, headdim: 4, dstate: 16, ngroups: 1, chunk_size: 16}
dtype: {io: float32, state: float32}
sequences: [{context: 3, tokens: 20, init_slot: 0, has_state: true, final_slot: 1}]
cache: {slots: 2}
"""
PASSED_GOOD = "good-1  1 passed  [1/1 cases, "  # its case's progress line


# Runs here are about files, not faults: in this process, since a supervised child per run re-imports torch and
# initialises the device (seconds each on the GPU; tests/test_isolation.py covers the child).
IN_PROCESS = ("--isolation", "none")


@pytest.fixture
def run_good(device) -> tuple[str, ...]:
    """``harness run`` options for GOOD: one check against the PyTorch reference provider, on the session's device,
    in this process (IN_PROCESS)."""
    return ("--device", device, "--provider", "reference:provider", "--check", "determinism", *IN_PROCESS)


def _bad(old: str, new: str) -> bytes:
    assert old in GOOD
    return GOOD.replace("id: good-1", "id: bad-1").replace(old, new).encode()


NINES = "9" * 400
# name -> (file content, the error after "<file>: "; a regular expression where the words depend on the platform)
BAD: dict[str, tuple[bytes, str]] = {
    "not_utf8": (GOOD.replace("id: good-1", "id: caf\xe9").encode("latin-1"),
                 "line 2: expected UTF-8 text, found byte 0xe9, not UTF-8 (column 8)"),
    "nul_character": (_bad("seed: 0", "seed: \x000"),
                      "line 3: expected valid YAML, found character U+0000, special characters are not allowed "
                      "(column 7)"),
    "list_as_key": (_bad("cache: {slots: 2}\n", "cache: {slots: 2}\n? [a, b]\n: 1\n"),
                    "line 8: expected a key that is a name or a number, found a list as a key (column 3)"),
    "mapping_as_key": (_bad("seed: 0", "seed: 0\n{a: 1}: 2"),
                       "line 4: expected a key that is a name or a number, found a mapping as a key (column 1)"),
    "seed_of_400_digits": (_bad("seed: 0", f"seed: {NINES}"),
                           "seed: expected an integer <= 2^63 - 1, found an integer of 400 digits"),
    "nheads_of_400_digits": (_bad("nheads: 2,", f"nheads: {NINES},"),
                             "shape.nheads: expected an integer <= 2^31 - 1, found an integer of 400 digits"),
    "negative_slot_of_400_digits": (_bad("final_slot: 1", f"final_slot: -{NINES}"),
                                    "sequences[0].final_slot: expected an integer >= -2^31, found an integer of 400 "
                                    "digits"),
    "number_of_400_digits": (_bad("cache: {slots: 2}", f"cache: {{slots: 2}}\ninputs: {{x_scale: {NINES}}}"),
                             "inputs.x_scale: expected a number >= 0 that a 64-bit float can hold, found an integer "
                             "of 400 digits"),
    "integer_too_long_to_read": (_bad("seed: 0", f"seed: {'9' * 5000}"),
                                 "line 3: expected an integer of at most 4300 characters, found an integer of 5000 "
                                 "characters (column 7)"),
    "float_overflow": (_bad("cache: {slots: 2}", "cache: {slots: 2}\ninputs: {dt_offset: 1.0e+999}"),
                       "line 8: expected a number a 64-bit float can hold (.inf for infinity), found '1.0e+999', "
                       "which overflows to infinity (column 21)"),
    "infinite_input": (_bad("cache: {slots: 2}", "cache: {slots: 2}\ninputs: {x_scale: .inf}"),
                       "inputs.x_scale: expected a finite number (inputs are drawn from it), found .inf"),
    "date_for_integer": (_bad("seed: 0", "seed: 2024-01-01"),
                         "seed: expected an integer in [0, 2^63 - 1], found date"),
    "long_string_for_integer": (_bad("seed: 0", f"seed: {'x' * 1000}"),
                                f"seed: expected an integer in [0, 2^63 - 1], found a string of 1000 characters, "
                                f"'{'x' * 40}'..."),
    "wrong_type_nested": (_bad("has_state: true", "has_state: 1"),
                          "sequences[0].has_state: expected true or false, found 1"),
    "duplicate_key": (_bad("cache: {slots: 2}\n", "cache: {slots: 2}\nseed: 1\n"),
                      "line 8: expected valid YAML, found key 'seed' repeated (first on line 3) (column 1)"),
    "empty_file": (b"", "(top level): expected a mapping, found null"),
    "comments_only": (b"# nothing here\n", "(top level): expected a mapping, found null"),
    "top_level_list": (b"- schema: ssd-case/1\n", "(top level): expected a mapping, found a list of 1 item"),
    "top_level_text": (b"just some text\n", "(top level): expected a mapping, found 'just some text'"),
    # Whether 3000 levels parse depends on the PyYAML build (libyaml's depth limit) and the Python: each outcome is
    # one clear error naming the file and where.
    "nested_too_deep": (_bad("seed: 0", "seed: " + "[" * 3000 + "]" * 3000),
                        r"(line 3: expected valid YAML, found .*nesting depth.*|\(file\): expected YAML nested at "
                        r"most a few hundred levels deep, found nesting too deep to read|seed: expected an integer in "
                        r"\[0, 2\^63 - 1\], found a list of 1 item)"),
    "larger_than_the_file_limit": (_bad("seed: 0", "seed: 0\n# " + "x" * MAX_FILE_BYTES),
                                   rf"\(file\): expected a case file of at most {MAX_FILE_BYTES:,} bytes \(split the "
                                   r"cases into several files: every pytest worker reads every file\), found "
                                   r"1,048,\d\d\d bytes"),
}
REGEX = {"nested_too_deep", "larger_than_the_file_limit"}

# Cases whose tensors no device holds (all within the schema's per-key bounds), and the key each error names.
ENORMOUS: dict[str, tuple[bytes, str]] = {
    "cache_slots": (_bad("cache: {slots: 2}", "cache: {slots: 2147483647}"), "cache.slots"),
    "nheads": (_bad("nheads: 2, headdim: 4", "nheads: 2147483646, headdim: 4"), "shape.nheads"),
    "chunk_size": (_bad("chunk_size: 16", "chunk_size: 1073741824"), "shape.chunk_size"),
    "cache_row_pad": (_bad("cache: {slots: 2}", "cache: {slots: 1000, row_pad: 2147483647}"), "cache.row_pad"),
    "tokens_in_all": (_bad("sequences: [{context: 3, tokens: 20, init_slot: 0, has_state: true, final_slot: 1}]",
                           "sequences: [{context: 0, tokens: 1073741825, init_slot: 0, has_state: true},"
                           " {context: 0, tokens: 1073741825, init_slot: 0, has_state: true}]\n"
                           "call: {final_state: returned}"),
                      "sequences[1].tokens"),
    # The storage holds the row a negative final slot addresses (Case.cache_guard): 2^31 rows before slot 0.
    "negative_final_slot": (_bad("final_slot: 1}]", "final_slot: -2147483648}]"), "sequences[0].final_slot"),
}


def _expected(kind: str, path: Path) -> re.Pattern:
    text = BAD[kind][1]
    return re.compile(re.escape(f"{path}: ") + (text if kind in REGEX else re.escape(text)) + "$", re.M)


def _folder(tmp_path: Path, **files: bytes) -> Path:
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "good.yaml").write_text(GOOD)
    for name, content in files.items():
        (folder / f"{name}.yaml").write_bytes(content)
    return folder


@pytest.mark.parametrize("kind", sorted(BAD))
def test_each_bad_file_kind_is_one_clear_error_in_validate_and_run(tmp_path, kind, run_good):
    folder = _folder(tmp_path, **{kind: BAD[kind][0]})
    bad = folder / f"{kind}.yaml"
    with pytest.raises(CaseError) as info:
        load_case_file(bad)
    assert _expected(kind, bad).match(str(info.value)), str(info.value)

    checked = harness("validate", str(folder))
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert _expected(kind, bad).search(checked.stdout), checked.stdout[-2000:]
    assert "1 error(s) in 2 file(s)" in checked.stdout

    ran = harness("run", str(folder), *run_good)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 1, out[-3000:]
    assert re.search("^ERROR       " + _expected(kind, bad).pattern, ran.stdout, re.M), out[-3000:]
    assert PASSED_GOOD in ran.stdout
    assert "Traceback" not in checked.stdout + checked.stderr + out


def test_a_folder_with_two_bad_files_reports_both_and_runs_the_good_one(tmp_path, run_good):
    folder = _folder(tmp_path, a=BAD["not_utf8"][0], z=BAD["list_as_key"][0])
    checked = harness("validate", str(folder))
    assert checked.returncode == 1
    assert f"{folder / 'a.yaml'}: line 2: expected UTF-8 text" in checked.stdout
    assert f"{folder / 'z.yaml'}: line 8: expected a key that is a name or a number" in checked.stdout
    assert "2 error(s) in 3 file(s)" in checked.stdout

    report = tmp_path / "report.json"
    ran = harness("run", str(folder), *run_good, "--json", str(report))
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "1 items, 2 bad case files" in ran.stdout and PASSED_GOOD in ran.stdout
    assert f"ERROR       {folder / 'a.yaml'}: line 2" in ran.stdout
    assert f"ERROR       {folder / 'z.yaml'}: line 8" in ran.stdout
    records = {r.nodeid: r for r in Report.read(report).items}
    assert records[str(folder / "a.yaml")].outcome == "error"
    assert "expected UTF-8 text" in records[str(folder / "a.yaml")].message
    assert records[str(folder / "z.yaml")].outcome == "error"
    assert records[f"{folder / 'good.yaml'}::good-1::determinism"].outcome == "passed"


def test_a_duplicate_id_in_a_later_file_makes_that_file_bad_and_the_first_still_runs(tmp_path, run_good):
    folder = _folder(tmp_path, zz_again=GOOD.encode())
    ran = harness("run", str(folder), *run_good)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert (f"ERROR       {folder / 'zz_again.yaml'}: id: expected an id unique across the corpus, found 'good-1', "
            f"already used in {folder / 'good.yaml'}") in ran.stdout
    assert PASSED_GOOD in ran.stdout


@pytest.mark.parametrize("kind", sorted(ENORMOUS))
def test_enormous_shapes_are_refused_with_their_key_before_anything_is_allocated(tmp_path, monkeypatch, kind, run_good):
    content, key = ENORMOUS[kind]
    path = tmp_path / f"{kind}.yaml"
    path.write_bytes(content)
    checked = harness("validate", str(path))
    assert checked.returncode == 1 and f"{path}: {key}: expected " in checked.stdout, checked.stdout

    def allocation(*args, **kwargs):
        raise AssertionError("a tensor was allocated while loading")

    with monkeypatch.context() as patched:
        for name in ("empty", "empty_strided", "zeros", "ones", "full", "rand", "randn", "randint", "tensor", "arange"):
            patched.setattr(torch, name, allocation)
        with pytest.raises(CaseError) as info:
            load_case_file(path)
    assert info.value.key_path == key, str(info.value)

    import harness.cases.builder as builder

    monkeypatch.setattr(builder, "build_cpu_inputs", allocation)
    ran = harness("run", str(path), *run_good)
    assert ran.returncode == 2, ran.stdout + ran.stderr  # nothing ran: its only file is bad
    assert f"ERROR       {path}: {key}: expected " in ran.stdout
    assert "a tensor was allocated" not in ran.stdout + ran.stderr


def test_the_device_bound_names_the_largest_tensor_and_the_whole_need(tmp_path):
    path = tmp_path / "slots.yaml"
    path.write_bytes(ENORMOUS["cache_slots"][0])
    with pytest.raises(CaseError) as info:
        load_case_file(path)
    assert info.value.expected == "tensors that fit one device (at most 512 GiB in all)"
    assert info.value.found == ("1 TiB in all; state_cache (slots x nheads x headdim x dstate = 2147483647 x 2 x 4 x "
                                "16, float32) alone 1024 GiB"), info.value.found
    # A case just under the bound loads: a quarter of the slots in float32 is 256 GiB.
    path.write_bytes(_bad("cache: {slots: 2}", "cache: {slots: 536870912}"))
    assert load_case_file(path)[0].cache.slots == 2**29


def test_each_good_file_is_parsed_once(tmp_path, monkeypatch):
    """libyaml (or the Python parser where PyYAML lacks it) reads each good file once; a file it refuses is read again
    by the Python parser, which words the error and is the judge (harness.cases.loader._parse_yaml says why)."""
    from harness.cases import loader

    calls = []
    real_load = loader._load  # yaml.load's work, keeping where each mapping starts

    def counted(text, loader_class):
        calls.append(loader_class)
        return real_load(text, loader_class)

    monkeypatch.setattr(loader, "_load", counted)
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "one.yaml").write_text(GOOD)
    (folder / "two.yaml").write_text(GOOD.replace("good-1", "good-2"))
    assert harness("validate", str(folder)).returncode == 0
    assert len(calls) == 2, calls
    calls.clear()
    (folder / "two.yaml").write_bytes(BAD["duplicate_key"][0])  # a bad file: libyaml, then the Python parser judges
    assert harness("validate", str(folder)).returncode == 1
    assert len(calls) == 3, calls  # one.yaml once; two.yaml twice (the error path only)


def test_yml_files_are_cases_to_the_cli(tmp_path, run_good):
    (tmp_path / "good.yml").write_text(GOOD)
    checked = harness("validate", str(tmp_path))
    assert checked.returncode == 0 and "ok: 1 cases in 1 files" in checked.stdout, checked.stdout + checked.stderr
    ran = harness("run", str(tmp_path), *run_good)
    assert ran.returncode == 0 and PASSED_GOOD in ran.stdout, ran.stdout + ran.stderr


def test_case_file_rule_matches_the_plugins(tmp_path):
    """YAML in a named folder (hidden folders and virtual environments skipped, as pytest does), the repository's
    cases/ only when the repository itself is named, fixtures under tests/ only when named one by one."""
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yml").write_text(GOOD)
    (tmp_path / "notes.txt").write_text("not a case")
    for skipped in (".hidden", "venv", "build", "env_with_pyvenv"):
        (tmp_path / skipped).mkdir()
        (tmp_path / skipped / "c.yaml").write_text(GOOD)
    (tmp_path / "env_with_pyvenv" / "pyvenv.cfg").write_text("home = /usr\n")
    assert case_files([tmp_path]) == [tmp_path / "a.yaml", tmp_path / "sub" / "b.yml"]
    assert is_case_file(tmp_path / ".hidden" / "c.yaml", named=[tmp_path / ".hidden" / "c.yaml"])

    corpus = case_files([REPO_ROOT / "cases"])
    assert corpus and all(REPO_ROOT / "cases" in f.parents for f in corpus)
    assert [f.resolve() for f in case_files([REPO_ROOT])] == [f.resolve() for f in corpus]
    fixture = REPO_ROOT / "tests" / "malformed" / "empty_file.yaml"
    assert not case_files([fixture.parent]) and not case_files([REPO_ROOT / "tests"])
    assert case_files([fixture]) == [fixture]
    assert not is_case_file(fixture, named=[REPO_ROOT / "tests"])
    assert is_case_file(fixture, named=[fixture])
    assert is_case_file(tmp_path / "cases" / "x.yml", roots=[tmp_path])  # a rootdir's cases/ (pytest's rootdir)


def test_one_path_alone_is_one_path_not_its_characters(tmp_path):
    """``load_cases("x.yaml")`` loads that file: a lone string once walked "x", ".", "y", ... and "/" (the whole
    disk)."""
    (tmp_path / "a.yaml").write_text(GOOD)
    assert case_files(str(tmp_path / "a.yaml")) == case_files(tmp_path / "a.yaml") == [tmp_path / "a.yaml"]
    assert [c.id for c in load_cases(str(tmp_path))] == [c.id for c in load_cases([tmp_path])] != []


def test_validate_and_run_of_a_folder_without_case_files_exit_2(tmp_path, run_good):
    (tmp_path / "notes.txt").write_text("not a case")
    for command in (("validate", str(tmp_path)), ("run", str(tmp_path), *run_good)):
        proc = harness(*command)
        assert proc.returncode == 2 and "no case files under" in proc.stderr, proc.stdout + proc.stderr
    fixtures = harness("validate", str(REPO_ROOT / "tests" / "malformed"))
    assert fixtures.returncode == 2 and "only files named one by one count" in fixtures.stderr
    named = harness("validate", str(tmp_path / "notes.txt"))
    assert named.returncode == 1 and "not a case file (a case file ends in .yaml or .yml)" in named.stdout


def _tiny(tmp_path: Path, case_id: str, **changes) -> Path:
    data = yaml.safe_load(bp.TINY_CASES)
    data["cases"] = [{**c, **changes} for c in data["cases"] if c["id"] == case_id]
    path = tmp_path / f"{case_id}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_run_with_every_item_filtered_out_exits_2(tmp_path, device):
    path = _tiny(tmp_path, "tiny-batch")  # two sequences: the indexed path's check does not apply
    proc = harness("run", str(path), "--device", device, "--check", "indexed_vs_snapshot", *IN_PROCESS)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "nothing to run: no check of the 1 cases" in proc.stderr and "--check indexed_vs_snapshot" in proc.stderr


def test_run_where_every_item_is_skipped_or_unsupported_exits_2(tmp_path, device):
    skipped = _tiny(tmp_path, "tiny-batch", checks=["indexed_vs_snapshot"])  # named, not applicable: a skip
    proc = harness("run", str(skipped), "--device", device, "--provider", "reference:provider", *IN_PROCESS)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "tiny-batch  1 skipped  [1/1 cases" in proc.stdout, proc.stdout
    assert "nothing ran: 1 items, none passed or failed" in proc.stderr
    assert "      1  not applicable; e.g. tiny-batch::indexed_vs_snapshot: not applicable: " in proc.stdout
    # gather_exact checks our kernels only: against the reference provider it is unsupported
    unsupported = harness("run", str(_tiny(tmp_path, "tiny-direct")), "--device", device, *IN_PROCESS,
                          "--provider", "reference:provider", "--check", "gather_exact")
    assert unsupported.returncode == 2 and "tiny-direct  1 unsupported" in unsupported.stdout, unsupported.stdout


def test_repro_that_runs_nothing_exits_2(tmp_path, device):
    path = _tiny(tmp_path, "tiny-direct")
    unsupported = harness("repro", str(path), "--check", "gather_exact", "--device", device, *IN_PROCESS,
                          "--provider", "reference:provider")
    assert unsupported.returncode == 2, unsupported.stdout + unsupported.stderr
    assert "UNSUPPORTED: tiny-direct::gather_exact" in unsupported.stdout
    assert "nothing ran: all 1 items were skipped or unsupported" in unsupported.stderr
    unknown = harness("repro", str(path), "--check", "nosuch", "--device", device)
    assert unknown.returncode == 2 and "--check: unknown ['nosuch']" in unknown.stderr


def test_fuzz_with_an_unknown_check_exits_2(tmp_path, device):
    proc = harness("fuzz", "--budget", "2", "--out", str(tmp_path), "--check", "nosuch", "--device", device)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--check: unknown ['nosuch']" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_fuzz_that_tried_nothing_exits_2(tmp_path, device):
    proc = harness("fuzz", "--budget", "3", "--out", str(tmp_path), "--check", "gather_exact", "--device", device,
                   "--provider", "reference:provider")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "fuzz: nothing ran: no check (--check gather_exact) passed or failed on any of" in proc.stderr


def test_times_of_a_report_without_items_exits_2(tmp_path):
    report = Report(items=[], meta={"command": "run"}).write(tmp_path / "empty.json")
    proc = harness("times", str(report))
    assert proc.returncode == 2 and "no items" in proc.stderr, proc.stdout + proc.stderr


def test_report_write_uses_a_temporary_file_of_its_own_and_leaves_none(tmp_path):
    other_run = tmp_path / "report.json.tmp"  # what another run writing the same report could be holding
    other_run.write_text("another run's half-written report")
    record = ItemRecord(nodeid="a.yaml::c::determinism", outcome="passed", check="determinism")
    Report(items=[record]).write(tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text())["items"][0]["nodeid"] == record.nodeid
    assert other_run.read_text() == "another run's half-written report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.json.tmp"]


def test_fuzz_finding_that_does_not_load_back_leaves_no_file(tmp_path, monkeypatch):
    import harness.cases.loader as loader
    from harness.fuzz import write_finding

    (case,) = [c for c in load_case_file(_tiny(tmp_path, "tiny-direct")) if c.id == "tiny-direct"]
    out = tmp_path / "found"
    monkeypatch.setattr(loader, "load_case_file", lambda path: [])
    with pytest.raises(RuntimeError, match="does not load back"):
        write_finding(case, out)
    assert not list(out.iterdir())
    monkeypatch.undo()
    written = write_finding(case, out)
    assert [p.name for p in out.iterdir()] == [written.name] and load_case_file(written) == [case]


def test_a_utf8_byte_order_mark_is_allowed(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD.encode())
    assert [c.id for c in load_case_file(path)] == ["good-1"]
