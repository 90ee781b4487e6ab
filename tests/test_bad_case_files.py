"""A bad case file never aborts the session: it is one collection error naming the file (and the key where the
loader knows it), every other file's items still run, and the run fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import broken_providers as bp

pytestmark = pytest.mark.usefixtures("children_with_one_hardware_queue")  # tests/conftest.py says why

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]


def bad_files(folder: Path) -> dict[str, Path]:
    """Three files the loader cannot load, each with its own case ids (so only the flaw differs from good.yaml):
    Latin-1 text, a mapping key that is a list, and a 400-digit number."""
    def variant(prefix: str) -> str:
        return bp.TINY_CASES.replace("id: tiny-", f"id: {prefix}-")

    files = {
        "latin1": (variant("latin1").replace("one sequence continuing", "caf\u00e9 sequence continuing")
                   .encode("latin-1")),
        "listkey": variant("listkey").replace("    seed: 11\n", "    seed: 11\n    [a, b]: 1\n", 1).encode(),
        "bignum": variant("bignum").replace("fill: nan", "fill: " + "9" * 400, 1).encode(),
    }
    out = {}
    for name, data in files.items():
        out[name] = folder / f"{name}.yaml"
        out[name].write_bytes(data)
    return out


@pytest.fixture(scope="module", autouse=True)
def _provider_imported_outside():
    """pytester restores sys.modules after each in-process run; importing the provider here keeps it (and Triton's
    native modules, which cannot be loaded twice) in the snapshot."""
    from harness.checks import load_provider

    load_provider("reference:provider")


def error_lines(text: str, path: Path) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{path}:")]


def test_each_bad_file_is_one_collection_error_and_the_good_file_runs(pytester, device):
    good = pytester.path / "good.yaml"
    good.write_text(bp.TINY_CASES)
    bad = bad_files(pytester.path)
    report = pytester.path / "report.json"
    result = pytester.runpytest_inprocess(
        "-p", "ssd_pytest.plugin", "--device", device, "-p", "no:cacheprovider", "--provider", "reference:provider",
        "-k", "determinism", "--ssd-report", str(report), str(pytester.path))
    out = result.stdout.str()
    assert "INTERNALERROR" not in out and "Traceback" not in out, out
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    result.assert_outcomes(passed=3, errors=3)  # good.yaml's three determinism items; one error per bad file
    for name, path in bad.items():
        assert out.count(f"ERROR collecting {path.name}") == 1, out
        lines = error_lines(out, path)
        assert len(lines) == 1, (name, lines)
    # What the loader could not name, the collector names with the file and the exception.
    assert "utf-8" in error_lines(out, bad["latin1"])[0].lower()
    data = json.loads(report.read_text())
    assert {i["nodeid"]: i["outcome"] for i in data["items"] if i["outcome"] == "error"} == {
        p.name: "error" for p in bad.values()}
    assert "no failures" not in out and "other test failures:" in out


def test_a_python_collection_error_still_stops_the_run(pytester, device):
    """Only case files are continued past: a test module that does not import stops the run as pytest does."""
    (pytester.path / "good.yaml").write_text(bp.TINY_CASES)
    bad_files(pytester.path)
    pytester.makepyfile(test_broken="import no_such_module_ssd\n")
    result = pytester.runpytest_inprocess(
        "-p", "ssd_pytest.plugin", "--device", device, "-p", "no:cacheprovider", "--provider", "reference:provider",
        "-k", "determinism", str(pytester.path))
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.assert_outcomes(errors=4)
    assert "INTERNALERROR" not in result.stdout.str()


def test_under_xdist_too(tmp_path, device):
    """Two workers each collect every file: still one error per bad file, and the good file's items run."""
    (tmp_path / "good.yaml").write_text(bp.TINY_CASES)
    bad = bad_files(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "ssd_pytest.plugin", str(tmp_path), "--device", device, "-n", "2",
         "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--provider", "reference:provider",
         "-k", "determinism"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert "INTERNALERROR" not in out and "3 passed" in out and "3 errors" in out, out
    for path in bad.values():
        assert out.count(f"ERROR collecting {path.name}") == 1, out
