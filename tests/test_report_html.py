"""``python -m harness report-html``: a self-contained page of each check's error against its bound, from a JSON
report (harness.report_html)."""

from __future__ import annotations

import re

import pytest

from harness.report import ItemRecord, Report
from harness.report_html import render
from tests import broken_providers as bp
from tests.support import harness


def _report() -> Report:
    bound = [ItemRecord(f"f::case-{k}::reference_bound", "passed", case_id=f"case-{k}", check="reference_bound",
                        max_ulp=k, bound_use=10.0 ** -k) for k in range(1, 5)]
    bound.append(ItemRecord("f::<odd>&::reference_bound", "failed", case_id="<odd>&", check="reference_bound",
                            max_ulp=900, bound_use=3.5))
    exact = [ItemRecord("f::case-1::determinism", "passed", case_id="case-1", check="determinism"),
             ItemRecord("f::case-2::determinism", "skipped", case_id="case-2", check="determinism"),
             ItemRecord("f::case-3::determinism", "failed", case_id="case-3", check="determinism", max_ulp=40)]
    return Report(items=bound + exact, meta={"device": "cpu", "provider": "kernels:provider", "command": "run"})


def test_each_check_gets_its_outcomes_and_a_dot_per_measured_item():
    page = render(_report())
    assert page.startswith("<!doctype html>") and "<script" not in page
    assert "device=cpu, provider=kernels:provider, command=run" in page
    sections = dict(re.findall(r"<h2><code>(\w+)</code></h2>(.*?)(?=<h2>|</body>)", page, re.S))
    assert set(sections) == {"reference_bound", "determinism"}
    bounded, exact = sections["reference_bound"], sections["determinism"]
    assert bounded.count("<circle") == 5 and "the bound" in bounded  # the dashed line at err/bound 1
    assert "the bound" not in exact and "1 failed, 1 passed, 1 skipped; 2 measured" in exact
    assert "case-1::determinism: passed, 0 ulp" in exact and "case-3::determinism: failed, 40 ulp" in exact
    assert "&lt;odd&gt;&amp;::reference_bound: failed, 3.5" in bounded and "<odd>" not in page  # escaped
    assert 'fill="#c62828"' in bounded  # the failure in red
    worst = re.findall(r"<tr><td><code>(.*?)</code></td><td>(.*?)</td>", bounded)
    assert worst[:2] == [("&lt;odd&gt;&amp;", "3.5"), ("case-1", "0.1")]  # closest to the bound first


def test_a_run_report_carries_bound_use_into_the_page(tmp_path, device, monkeypatch):
    """run --json records each bounded item's largest error over its bound; report-html draws it."""
    monkeypatch.setenv("SSD_HARNESS_ISOLATION", "none")
    cases, report, page = tmp_path / "tiny.yaml", tmp_path / "report.json", tmp_path / "page.html"
    cases.write_text(bp.TINY_CASES)
    ran = harness("run", str(cases), "--device", device, "--check", "reference_bound", "--check", "determinism",
                  "--json", str(report))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    records = Report.read(report).items
    assert all(0 < r.bound_use < 1 for r in records if r.check == "reference_bound"), records
    assert all(r.bound_use is None for r in records if r.check == "determinism")
    made = harness("report-html", str(report), "-o", str(page))
    assert made.returncode == 0 and f"wrote {page}: 6 case items" in made.stdout, made.stdout + made.stderr
    assert page.read_text().count("<circle") >= 3


@pytest.mark.parametrize("missing", ["report", "out"])
def test_a_missing_report_or_an_unwritable_page_exits_2(tmp_path, missing):
    report = tmp_path / "report.json"
    _report().write(report)
    args = ([str(tmp_path / "none.json"), "-o", str(tmp_path / "p.html")] if missing == "report"
            else [str(report), "-o", str(tmp_path / "no-dir" / "p.html")])
    proc = harness("report-html", *args)
    assert proc.returncode == 2 and ("no such report" if missing == "report" else "cannot write it") in proc.stderr
