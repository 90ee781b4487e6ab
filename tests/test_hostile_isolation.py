"""The supervisor under providers that outlive or outwait it: a helper process a provider started ends with the
child that ran it, and a provider that hangs on a case costs the item time limit once for that case, not once per
item (``harness.isolation.supervisor``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from harness.cases.loader import load_case_file
from harness.checks import Status
from harness.isolation.supervisor import Supervisor
from tests import broken_providers as bp
from tests import faulty_providers as fp
from tests.support import alive

pytestmark = pytest.mark.usefixtures("children_with_one_hardware_queue")  # tests/conftest.py says why


@pytest.fixture
def tiny(tmp_path) -> dict:
    path = tmp_path / "tiny.yaml"
    path.write_text(bp.TINY_CASES)
    return {c.id: c for c in load_case_file(path)}


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from Linux's /proc")
def test_a_providers_helper_process_ends_with_the_child(tiny, device, tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv(fp.PID_FILE_ENV, str(pids))
    with Supervisor("tests.hostile_providers:leaves_a_helper", device, timeout=120) as runner:
        result = runner.run(tiny["tiny-direct"], "returned_shapes")
        assert result.status is Status.PASSED, result.message
        (helper,) = _pids(pids)
        assert alive(helper)  # running while the child that started it serves items
    deadline = time.monotonic() + 10
    while alive(helper) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(helper), f"the provider's helper {helper} outlived the run"


def test_a_case_that_hangs_fails_its_remaining_items_at_once(tiny, device, tmp_path, monkeypatch):
    monkeypatch.setenv(fp.PID_FILE_ENV, str(tmp_path / "pids"))
    checks = ("determinism", "readonly_inputs", "untouched_storage")
    with Supervisor("tests.faulty_providers:hangs", device, timeout=3) as runner:
        first = runner.run(tiny[fp.FAULTING_CASE], checks[0])
        assert first.status is Status.ERROR and first.summary.startswith("timed out after 3 s"), first.summary
        began = time.monotonic()
        rest = [runner.run(tiny[fp.FAULTING_CASE], check) for check in checks[1:]]
        assert time.monotonic() - began < 2  # no child started, no limit waited out
        for result in rest:
            assert result.status is Status.ERROR, result.message
            assert result.summary.startswith("not run: determinism of the same case timed out after 3 s"), \
                result.summary
            assert "the hang's repro: python -m harness repro" in result.message
            assert f"--check determinism --case {fp.FAULTING_CASE}" in result.message
        assert len(runner.restarts) == 1 and runner.processes == 1
        other = runner.run(tiny["tiny-direct"], "returned_shapes")  # another case still runs
        assert other.status is Status.PASSED, other.message


def test_only_the_case_that_hung_fails_at_once_not_others_named_alike(tiny, device, tmp_path, monkeypatch):
    """The fuzzer names every drawn case "fuzz-candidate": a case with other contents under the same id runs."""
    from dataclasses import replace

    monkeypatch.setenv(fp.PID_FILE_ENV, str(tmp_path / "pids"))
    hung = tiny[fp.FAULTING_CASE]
    with Supervisor("tests.faulty_providers:hangs", device, timeout=3) as runner:
        assert runner.run(hung, "determinism").summary.startswith("timed out after 3 s")
        namesake = replace(tiny["tiny-direct"], id=hung.id, source=hung.source)
        result = runner.run(namesake, "determinism")
        assert result.status is Status.PASSED, result.message


def test_an_xfail_excuses_a_crash_only_when_it_names_exit(tiny, device, tmp_path, monkeypatch):
    """The supervisor tells the case's expect how its item failed: a segfault is an exit, which an xfail for a
    mismatch does not excuse."""
    from dataclasses import replace

    from harness.cases.model import Expect

    monkeypatch.setenv(fp.PID_FILE_ENV, str(tmp_path / "pids"))
    case = tiny[fp.FAULTING_CASE]
    wrong_bits = replace(case, expect=Expect("xfail", "issue 9: wrong bits"))
    crashes = replace(case, expect=Expect("xfail", "issue 9: segfaults", None, ("exit",)))
    with Supervisor("tests.faulty_providers:segfaults", device, timeout=120) as runner:
        crash = runner.run(wrong_bits, "determinism")
        assert crash.status is Status.ERROR and "SIGSEGV" in crash.summary, crash.message
        assert "this item ended with its process's exit (fails_with: exit)" in crash.message
        assert runner.run(crashes, "determinism").status is Status.XFAILED
