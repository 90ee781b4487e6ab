"""Suite time per check and per case family, from a JSON report: the slowest parts are visible."""

from __future__ import annotations

import pytest

from harness import cli
from harness.report import ItemRecord, Report, timing_lines


def records() -> list[ItemRecord]:
    return [
        ItemRecord("a::x::reference_bound", "passed", 3.0, "x", "reference_bound", "direct"),
        ItemRecord("a::y::reference_bound", "failed", 5.0, "y", "reference_bound", "multi"),
        ItemRecord("a::x::determinism", "passed", 1.0, "x", "determinism", "direct"),
        ItemRecord("a::z::determinism", "skipped", 99.0, "z", "determinism", "serving"),
    ]


def test_groups_slowest_first_and_leaves_skips_out():
    lines = timing_lines(records(), by="check")
    assert lines[0] == "time by check: 9.0s in 3 items run"
    assert lines[2].split()[:3] == ["reference_bound", "8.0", "88.9%"]
    assert lines[3].split()[:2] == ["determinism", "1.0"]
    fam = timing_lines(records(), by="family")
    assert [ln.split()[:2] for ln in fam[2:]] == [["multi", "5.0"], ["direct", "4.0"]]  # slowest first


def test_by_file_tells_the_python_test_files_apart_from_the_case_files():
    """``--by file``: the tests that are no case item, one "(other tests)" row by check or family, each get their
    file's row; a path longer than the other groupings' names widens the column, so the figures stay aligned."""
    long = "tests/test_a_file_with_a_long_descriptive_name.py"
    rows = records() + [ItemRecord(f"{long}::test_one", "passed", 4.0), ItemRecord(f"{long}::test_two", "passed", 2.0),
                        ItemRecord("tests/test_b.py::test_c[param::x]", "passed", 0.5)]
    assert [ln[2:26].rstrip() for ln in timing_lines(rows, by="check")[2:]] == ["reference_bound", "(other tests)",
                                                                              "determinism"]
    lines = timing_lines(rows, by="file")
    assert lines[0] == "time by file: 15.5s in 6 items run"
    assert [ln.split()[:3] for ln in lines[2:]] == [["a", "9.0", "58.1%"], [long, "6.0", "38.7%"],
                                                   ["tests/test_b.py", "0.5", "3.2%"]]
    assert len({ln.index("%") for ln in lines[2:]} | {lines[1].index("share") + len("share") - 1}) == 1, lines


def test_each_group_says_when_its_last_item_ended():
    """The report is sorted by node id; start times say when each worker (or check) finished."""
    timed = [ItemRecord("a::x::determinism", "passed", 2.0, check="determinism", worker="gw0", start=100.0),
             ItemRecord("a::y::determinism", "passed", 1.0, check="determinism", worker="gw1", start=101.0),
             ItemRecord("b::t", "passed", 5.0, worker="gw1", start=102.5),
             ItemRecord("b::u", "skipped", 0.0, worker="gw0", start=120.0)]  # skips cost nothing, end nothing
    by_worker = {ln.split()[0]: ln.split() for ln in timing_lines(timed, by="worker")[2:]}
    assert by_worker["gw1"][1] == "6.0" and by_worker["gw1"][-1] == "7.5"
    assert by_worker["gw0"][-1] == "2.0"
    by_check = timing_lines(timed, by="check")
    assert by_check[1].endswith("ends at s")
    assert [(ln.split()[0], ln.split()[-1]) for ln in by_check[2:]] == [("(other", "7.5"), ("determinism", "2.0")]
    assert [ln.split()[-1] for ln in timing_lines(records(), by="check")[2:]] == ["-", "-"]  # no start times


def test_a_table_cut_at_top_says_what_it_left_out():
    """Rows past ``top`` end the table as one line: how many, their seconds and share, the ``--top`` that lists
    them all. A table that fits has no such line."""
    lines = timing_lines(records(), by="family", top=1)
    assert [ln.split()[0] for ln in lines[2:]] == ["multi", "(+1"]
    assert lines[-1] == "  (+1 more, 4.0s, 44.4%; --top 2 lists every one)"
    assert not [ln for ln in timing_lines(records(), by="family", top=2) if "more" in ln]


def test_rejects_unknown_grouping():
    with pytest.raises(ValueError, match="by: expected"):
        timing_lines(records(), by="seed")


def test_cli_prints_both_groupings_and_exits_as_the_run_did(tmp_path, capsys):
    """``times`` exits as README and --help say: 1 for a report with a failure, 0 for one without."""
    path, passing = tmp_path / "report.json", tmp_path / "passing.json"
    Report(items=records()).write(path)
    assert cli.main(["times", str(path)]) == cli.EXIT_FAILED
    out = capsys.readouterr().out
    assert "time by check: 9.0s" in out and "time by family: 9.0s" in out
    assert "failures: 1 of 4 items" in out
    Report(items=[r for r in records() if not r.is_failure]).write(passing)
    assert cli.main(["times", str(passing)]) == cli.EXIT_OK
    assert cli.main(["times", str(tmp_path / "none.json")]) == 2
    assert "no such report" in capsys.readouterr().err


def test_a_killed_run_leaves_its_records_and_times_reads_them(tmp_path, capsys):
    """Workers append each record as it is decided; a run killed before the merge (a CI time limit) still yields a
    report, and a line cut by the kill is dropped, not fatal. ``times`` reads the parts without writing the report
    or removing them, says the run did not finish, and exits 1 for the failure it holds."""
    from harness.report import append_live, merge_parts, parts_dir, write_part

    report = tmp_path / "r.json"
    done = ItemRecord("f::c1::determinism", "passed", duration=1.5, case_id="c1", check="determinism", worker="gw0")
    failed = ItemRecord("f::c2::determinism", "failed", duration=2.0, case_id="c2", check="determinism",
                        worker="gw1", message="determinism failed\nfirst mismatch at (0, 1)")
    append_live(report, "run1", "gw0", done)
    write_part(report, "run1", "gw0", Report([done], meta={"worker": "gw0"}))  # gw0 finished: its .json wins
    append_live(report, "run1", "gw1", failed)
    with open(parts_dir(report) / "run1.gw1.jsonl", "a") as fh:
        fh.write('{"nodeid": "f::c3::determin')  # killed mid-line
    assert cli.main(["times", str(report)]) == cli.EXIT_FAILED
    out = capsys.readouterr().out
    assert "merged from the live parts of run run1, which did not finish" in out and "determinism" in out
    assert "the run did not finish (killed before its end (gw1 never wrote a final part))" in out
    assert not report.exists() and len(list(parts_dir(report).iterdir())) == 3
    merged = merge_parts(report, "run1")
    assert {r.nodeid: r.outcome for r in merged.items} == {"f::c1::determinism": "passed",
                                                          "f::c2::determinism": "failed"}
    assert merged.failures[0].message.endswith("first mismatch at (0, 1)")
    assert merged.meta["unfinished_workers"] == ["gw1"]
    assert not parts_dir(report).exists()


def test_durations_written_by_times_are_read_back_as_costs(tmp_path, capsys):
    from harness.sharding import ItemCosts

    path, compact = tmp_path / "report.json", tmp_path / "durations.json"
    Report(items=records()).write(path)
    assert cli.main(["times", str(path), "--write-durations", str(compact)]) == cli.EXIT_FAILED  # y failed
    assert f"durations of 4 items: {compact}" in capsys.readouterr().out
    costs = ItemCosts.from_report(compact)
    assert costs.durations == {"a::x::reference_bound": 3.0, "a::y::reference_bound": 5.0, "a::x::determinism": 1.0}
    assert len(compact.read_text().splitlines()) == 6  # header, one line per item, footer: diffs stay readable


def test_durations_can_keep_each_items_longest(tmp_path, capsys):
    """``--longest-of``: a compile-heavy test measured warm in one run keeps its cold time from an earlier one."""
    from harness.sharding import ItemCosts

    path, earlier, compact = tmp_path / "report.json", tmp_path / "earlier.json", tmp_path / "durations.json"
    Report(items=records()).write(path)
    Report(items=[ItemRecord("a::x::reference_bound", "passed", duration=9.0),
                  ItemRecord("a::y::reference_bound", "passed", duration=1.0),
                  ItemRecord("gone::z", "passed", duration=50.0)], meta={"source": "run 1"}).write(earlier)
    assert cli.main(["times", str(path), "--write-durations", str(compact), "--longest-of",
                     str(earlier)]) == cli.EXIT_FAILED  # y failed
    costs = ItemCosts.from_report(compact)
    assert costs.durations == {"a::x::reference_bound": 9.0, "a::y::reference_bound": 5.0, "a::x::determinism": 1.0}
    assert Report.read(compact).meta["source"] == f"{path}, each item's longest of it and run 1"
    assert cli.main(["times", str(path), "--longest-of", str(earlier)]) == cli.EXIT_UNUSABLE
    assert "--longest-of: only with --write-durations" in capsys.readouterr().err


def test_a_durations_file_takes_its_own_merge_and_a_whole_report_is_never_replaced(tmp_path, capsys):
    """``--longest-of`` the file written, as scripts/gpu_run.sh's durations step refreshes scripts/gpu-durations.json:
    a durations file is replaced by the merge (it held nothing else); a whole report named both ways is refused and
    left as it was (the durations would replace its checks, stats and messages)."""
    from harness.report import write_durations
    from harness.sharding import ItemCosts

    path, compact, whole = tmp_path / "report.json", tmp_path / "durations.json", tmp_path / "whole.json"
    Report(items=records()).write(path)
    write_durations([ItemRecord("a::x::reference_bound", "passed", duration=9.0),
                     ItemRecord("gone::z", "passed", duration=50.0)], compact, source="run 1")
    assert cli.main(["times", str(path), "--write-durations", str(compact), "--longest-of",
                     str(compact)]) == cli.EXIT_FAILED  # y failed
    assert f"durations of 4 items: {compact}" in capsys.readouterr().out
    assert ItemCosts.from_report(compact).durations == {"a::x::reference_bound": 9.0, "a::y::reference_bound": 5.0,
                                                        "a::x::determinism": 1.0}
    Report(items=records()).write(whole)
    before = whole.read_bytes()
    assert cli.main(["times", str(path), "--write-durations", str(whole), "--longest-of",
                     str(whole)]) == cli.EXIT_UNUSABLE
    assert "is also an input of this command; it is not overwritten" in capsys.readouterr().err
    assert whole.read_bytes() == before


@pytest.mark.parametrize("target", ["/dev/full", "folder/sub.json", "report"])
def test_write_durations_where_it_cannot_be_written_exits_2_with_the_reason(tmp_path, capsys, target):
    """A full disk (``/dev/full``: a device, never replaced), a path under a regular file, and the report being read
    are each refused with the CLI's error line, not a traceback; the report read is left as it was."""
    path = tmp_path / "report.json"
    Report(items=records()).write(path)
    before = path.read_bytes()
    (tmp_path / "folder").write_text("a file, not a folder")
    out = {"/dev/full": "/dev/full", "folder/sub.json": str(tmp_path / "folder/sub.json"), "report": str(path)}[target]
    assert cli.main(["times", str(path), "--write-durations", out]) == cli.EXIT_UNUSABLE
    err = capsys.readouterr().err
    assert err.startswith(f"error: --write-durations {out}: cannot write it (") and "Traceback" not in err, err
    assert path.read_bytes() == before


def test_a_report_cut_short_is_refused_with_the_reason(tmp_path, capsys):
    """A report truncated by a full disk (written by something other than this harness's rename) is exit 2 with the
    reason, not a traceback."""
    path = tmp_path / "report.json"
    Report(items=records()).write(path)
    path.write_text(path.read_text()[:100])
    assert cli.main(["times", str(path)]) == cli.EXIT_UNUSABLE
    assert capsys.readouterr().err.startswith(f"error: {path}: cannot read the report (")
