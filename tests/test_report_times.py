"""Suite time per check and per case family, from a JSON report: the slowest parts are visible."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.report import ItemRecord, Report, timing_lines

ROOT = Path(__file__).resolve().parents[1]


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


def test_rejects_unknown_grouping():
    with pytest.raises(ValueError, match="by: expected"):
        timing_lines(records(), by="seed")


def test_cli_prints_both_groupings(tmp_path):
    path = tmp_path / "report.json"
    Report(items=records()).write(path)
    res = subprocess.run([sys.executable, "-m", "harness", "times", str(path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "time by check: 9.0s" in res.stdout and "time by family: 9.0s" in res.stdout
    missing = subprocess.run([sys.executable, "-m", "harness", "times", str(tmp_path / "none.json")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no such report" in missing.stderr
