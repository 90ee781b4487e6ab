"""``python -m harness``: exit status, progress and repro lines, each subcommand's --help, validate and bench.

The CLI runs in this process (``cli.main``, what ``python -m harness`` calls: one test runs that entry point as a
subprocess), on the session's device with tiny cases; each broken provider must give a non-zero exit with the repro
line, and the working provider a zero exit on the same case and check. In-process, because a subprocess per test
re-imports torch and re-initialises CUDA (seconds each on the GPU tier).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness import cli
from tests import broken_providers as bp
from tests.support import harness

ROOT = Path(__file__).resolve().parents[1]


def test_python_dash_m_harness_is_cli_main(tiny_file):
    """The entry point itself, once as a real process: its exit status and output are ``cli.main``'s (whose other
    outcomes are tested in this process, e.g. test_unusable_input_exits_2)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ok = subprocess.run([sys.executable, "-m", "harness", "validate", str(tiny_file)], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "ok: 3 cases in 1 files" in ok.stdout, ok.stdout + ok.stderr


@pytest.fixture(autouse=True)
def _items_in_this_process(monkeypatch):
    """``run`` and ``repro`` here run their items in this process (``--isolation none``), for the reason above: a
    child per command would start torch again. tests/test_isolation.py runs them in the child, the default."""
    monkeypatch.setenv("SSD_HARNESS_ISOLATION", "none")


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "tiny.yaml"
    path.write_text(bp.TINY_CASES)
    return path


def _one_case_file(tmp_path: Path, case_id: str) -> Path:
    """A file holding only ``case_id`` of TINY_CASES (run takes paths, so narrow by file)."""
    import yaml

    data = yaml.safe_load(bp.TINY_CASES)
    data["cases"] = [c for c in data["cases"] if c["id"] == case_id]
    path = tmp_path / f"{case_id}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("provider_name", sorted(bp.CAUGHT_BY))
def test_run_exits_nonzero_with_repro_for_each_broken_provider(tmp_path, provider_name, device):
    check, case_id = bp.CAUGHT_BY[provider_name]
    path = _one_case_file(tmp_path, case_id)
    spec = f"tests.broken_providers:{provider_name}"
    proc = harness("run", str(path), "--device", device, "--provider", spec, "--check", check)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # The item's own line ends with what differed (the failure's summary); the repro line follows.
    assert re.search(rf"^\[1/1 case 1/1\] FAILED +{case_id}::{check} \(.*\) failures so far: 1 - \S", proc.stdout,
                     re.M), proc.stdout
    assert f"repro: python -m harness repro {path} --check {check} --case {case_id} --provider {spec}" in proc.stdout
    assert f"{case_id}  1 failed  [1/1 cases, " in proc.stdout  # a failing item has its lines, then its case's


def test_run_exits_zero_when_all_pass_and_writes_json(tmp_path, device):
    path = _one_case_file(tmp_path, "tiny-batch")
    report = tmp_path / "report.json"
    proc = harness("run", str(path), "--device", device, "--check", "determinism", "--check", "masked_state",
                   "--json", str(report))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "case items: 2 passed" in proc.stdout and "determinism" in proc.stdout
    from harness.report import Report

    items = Report.read(report).items
    assert sorted((r.check, r.outcome) for r in items) == [("determinism", "passed"), ("masked_state", "passed")]
    first, second = sorted(items, key=lambda r: r.start)  # run in order: the second began after the first ended
    assert first.start > 0 and second.start >= first.start + first.duration - 1e-3


def test_run_prints_a_line_per_case_and_with_verbose_one_per_item(tmp_path, device):
    path = _one_case_file(tmp_path, "tiny-batch")
    checks = ("--check", "determinism", "--check", "masked_state")
    proc = harness("run", str(path), "--device", device, *checks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^tiny-batch  2 passed  \[1/1 cases, \d+s elapsed, done\]$", proc.stdout, re.M), proc.stdout
    assert "PASSED" not in proc.stdout
    verbose = harness("run", str(path), "--device", device, *checks, "-v")
    assert "[1/2 case 1/1] PASSED      tiny-batch::determinism" in verbose.stdout
    assert "[2/2 case 1/1] PASSED      tiny-batch::masked_state" in verbose.stdout
    assert "tiny-batch  2 passed  [1/1 cases, " in verbose.stdout
    quiet = harness("run", str(path), "--device", device, *checks, "--quiet")
    assert "tiny-batch  2 passed" not in quiet.stdout and "PASSED" not in quiet.stdout and quiet.returncode == 0


def _expecting(tmp_path: Path, case_id: str, expect: dict) -> Path:
    """``_one_case_file`` with ``expect`` set on the case."""
    import yaml

    path = _one_case_file(tmp_path, case_id)
    data = yaml.safe_load(path.read_text())
    data["cases"][0]["expect"] = expect
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_run_applies_an_xfail_to_the_providers_it_names_only(tmp_path, device):
    broken = "tests.broken_providers:wrong_slot"
    path = _expecting(tmp_path, "tiny-direct", {"xfail": "writes the slot after its own", "providers": [broken]})
    report = tmp_path / "report.json"
    caught = harness("run", str(path), "--device", device, "--provider", broken, "--check", "untouched_storage",
                     "--json", str(report))
    assert caught.returncode == 0, caught.stdout + caught.stderr
    assert "case items: 1 xfailed" in caught.stdout, caught.stdout
    from harness.report import Report

    (item,) = Report.read(report).items
    assert item.reason == f"expected failure with --provider {broken}: writes the slot after its own", item.reason
    ours = harness("run", str(path), "--device", device, "--check", "untouched_storage")
    assert ours.returncode == 0 and "case items: 1 passed" in ours.stdout, ours.stdout + ours.stderr
    stale = _expecting(tmp_path, "tiny-direct", {"xfail": "thought broken", "providers": ["kernels:provider", broken]})
    proc = harness("run", str(stale), "--device", device, "--check", "untouched_storage")
    assert proc.returncode == 1 and "case items: 1 xpassed" in proc.stdout, proc.stdout + proc.stderr
    assert ("XPASS(strict): untouched_storage passed but the case expects a failure with --provider "
            "kernels:provider (thought broken)") in proc.stdout
    repro = harness("repro", str(stale), "--case", "tiny-direct", "--check", "untouched_storage", "--device", device)
    assert repro.returncode == 1, repro.stdout + repro.stderr
    assert f"remove kernels:provider from expect.providers in {stale}" in repro.stdout, repro.stdout


def test_repro_prints_the_full_report(tiny_file, device):
    proc = harness("repro", str(tiny_file), "--case", "tiny-direct", "--check", "untouched_storage",
                   "--device", device, "--provider", "tests.broken_providers:wrong_slot")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    failed = lines.index(next(line for line in lines if line.startswith("FAILED: tiny-direct::untouched_storage")))
    # The report's first line says what differed, in how many elements, by how many ulps; the elements follow.
    assert re.fullmatch(r"cache storage outside written slots \[2\] \(storage elements\): \d+ of \d+ elements differ "
                        r"in bits \(torch.float32, shape \(\d+,\)\), max ulp \d+ among the finite ones",
                        lines[failed + 1]), lines[failed + 1]
    assert "at (" in proc.stdout and "ulp" in proc.stdout
    assert "case: tiny-direct: H2 P4 N16" in proc.stdout


def test_validate_reports_file_key_path_expected_found(tmp_path, tiny_file):
    bad = tmp_path / "bad.yaml"
    bad.write_text(bp.TINY_CASES.replace("headdim: 4, dstate: 16, ngroups: 2", "headdim: 4, dstate: 16, ngroups: 3"))
    proc = harness("validate", str(tmp_path))
    assert proc.returncode == 1
    assert f"{bad}: cases[1].shape.ngroups: expected a divisor of nheads (2), found 3" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    good = harness("validate", str(tiny_file))
    assert good.returncode == 0 and "ok: 3 cases in 1 files" in good.stdout


def test_unusable_inputs_exit_2_with_the_reason(tmp_path, device):
    empty = harness("run", str(tmp_path), "--device", device)
    assert empty.returncode == 2 and "no case files under" in empty.stderr
    bad_provider = harness("run", str(tmp_path), "--device", device, "--provider", "no_such_module:provider")
    assert bad_provider.returncode == 2 and "cannot import 'no_such_module'" in bad_provider.stderr


SUBCOMMANDS = [*cli.COMMANDS, "warmup", "bench"]  # warmup and bench parse their own arguments


def test_the_top_level_help_is_plain_text_and_lists_every_command():
    proc = harness("--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "`" not in proc.stdout, proc.stdout  # no reST markup from docstrings
    listed = re.findall(r"^    ([\w-]+)(?: |$)", proc.stdout, re.M)  # a long name's help goes on the next line
    assert sorted(listed) == sorted(SUBCOMMANDS), (listed, proc.stdout)
    assert "exit status" in proc.stdout and "130" in proc.stdout


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_plain_help(command, device):
    proc = harness(command, *(["--device", device] if command == "warmup" else []), "--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "usage: python -m harness " + command in proc.stdout
    assert "`" not in proc.stdout, proc.stdout
    assert not undocumented_arguments(proc.stdout), f"arguments without a help text: {proc.stdout}"


def undocumented_arguments(help_text: str) -> list[str]:
    """Arguments argparse lists with no help text: alone on their line, and the next line is not their help."""
    lines = help_text.splitlines() + [""]
    return [line.strip() for line, after in itertools.pairwise(lines)
            if re.match(r"  \S", line) and "  " not in line.strip() and not re.match(r" {8,}\S", after)]


def test_undocumented_arguments_are_found():
    import argparse

    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("report")
    parser.add_argument("--top", type=int)
    parser.add_argument("--device", choices=("a", "b"))
    parser.add_argument("--explained-at-length-here", help="a help text")
    assert undocumented_arguments(parser.format_help()) == ["report", "--top TOP", "--device {a,b}"]


@pytest.mark.parametrize("command", ["run", "repro", "fuzz"])
def test_the_check_option_lists_every_registered_check(command):
    from harness.checks import check_names

    text = " ".join(harness(command, "--help").stdout.split())  # argparse wraps long help texts
    assert all(name in text for name in check_names()), text
    assert "one of: " + ", ".join(check_names()) in text


def test_the_generate_module_names_the_command_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """``python -m harness.cases.generate`` used to take its first argument as the folder to write, so ``--help``
    wrote a corpus into ./--help; the corpus's header now names ``python -m harness generate``."""
    from harness.cases import generate

    monkeypatch.chdir(tmp_path)
    for argv, status, says in ((["--help"], 0, "python -m harness generate --out cases/corpus"),
                               ([], 2, "nothing written; run: python -m harness generate --out cases/corpus"),
                               (["cases/corpus"], 2, "unrecognized arguments: cases/corpus")):
        with pytest.raises(SystemExit) as exit_info:
            generate.main(argv)
        out = capsys.readouterr()
        assert exit_info.value.code == status and says in " ".join((out.out + out.err).split()), (argv, out)
    assert not list(tmp_path.iterdir())  # nothing written
    assert harness("generate", "--help").returncode == 0


def test_unusable_input_exits_2(tiny_file, capsys, device):
    assert cli.main(["run", str(tiny_file.parent / "none"), "--device", device]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_bench_missing_is_reported_cleanly(monkeypatch, capsys):
    import harness

    monkeypatch.setitem(sys.modules, "harness.bench", None)  # import of harness.bench now raises ImportError
    # ... also once another test imported it: `from harness import bench` would find the package attribute and run
    # the real bench.
    monkeypatch.delattr(harness, "bench", raising=False)
    assert cli.main(["bench"]) == 2
    assert "harness.bench is not available" in capsys.readouterr().err


def test_bench_dispatches_its_arguments(monkeypatch):
    import types

    seen = {}
    fake = types.SimpleNamespace(main=lambda argv: seen.setdefault("argv", argv) and 0)
    monkeypatch.setitem(sys.modules, "harness.bench", fake)
    monkeypatch.setattr("harness.bench", fake, raising=False)
    assert cli.main(["bench", "--shape", "small"]) == 0
    assert seen["argv"] == ["--shape", "small"]


def test_generate_writes_a_corpus_that_validates(tmp_path):
    proc = harness("generate", "--out", str(tmp_path / "corpus"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"generated: 5 files under .*: \d+ cases, \d+ items, \d+ of them in the CPU tier", proc.stdout), \
        proc.stdout
    assert harness("validate", str(tmp_path / "corpus")).returncode == 0


class _RecordingRunner:
    """Stands in for the GPU's provider process: records the items that reach it and passes them."""

    mode, processes = "none", 0
    limit = SimpleNamespace(describe=lambda: "none")

    def __init__(self):
        self.ran, self.restarts = [], []

    def start(self):
        pass

    def close(self):
        pass

    def describe(self):
        return {"isolation": self.mode}

    def run(self, case, check, *, repro_device=None, guard=False):
        from harness.checks import CheckResult, Status

        self.ran.append(f"{case.id}::{check}")
        return CheckResult(case.id, check, Status.PASSED, source=str(case.source))


def test_run_and_repro_on_the_gpu_skip_every_config_unless_check_names_it(tiny_file, tmp_path, monkeypatch, capsys):
    """The GPU's decision without a GPU (the runner and device ``_runner`` returns): ``run`` skips every_config's
    items with the tier's reason, in its output and its JSON report, and they never reach the provider's process;
    ``--check every_config`` runs them; ``repro`` follows the same rule."""
    import json

    from harness.checks.tiers import tier_reason

    runner = _RecordingRunner()
    monkeypatch.setattr(cli, "_runner", lambda args: (runner, "cuda", "kernels:provider"))
    report = tmp_path / "run.json"
    assert cli.main(["run", str(tiny_file), "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert runner.ran and not any(item.endswith("::every_config") for item in runner.ran), runner.ran
    skipped = [i for i in json.loads(report.read_text())["items"] if i["check"] == "every_config"]
    assert len(skipped) == 3 and {i["outcome"] for i in skipped} == {"skipped"}, skipped
    assert all(i["reason"].startswith("not run by default on the GPU: ") for i in skipped), skipped
    assert "--check every_config runs it" in out

    runner.ran.clear()
    assert cli.main(["run", str(tiny_file), "--check", "every_config"]) == 0
    assert runner.ran == ["tiny-direct::every_config", "tiny-batch::every_config", "tiny-returned::every_config"]

    runner.ran.clear()
    assert cli.main(["repro", str(tiny_file), "--case", "tiny-direct"]) == 0
    out = capsys.readouterr().out
    assert "tiny-direct::every_config" not in runner.ran and "SKIPPED: tiny-direct::every_config" in out
    from harness.cases.loader import load_case_file

    case = next(c for c in load_case_file(tiny_file) if c.id == "tiny-direct")
    assert f"  reason: {tier_reason(case, 'every_config', 'cuda')}" in out
    assert cli.main(["repro", str(tiny_file), "--case", "tiny-direct", "--check", "every_config"]) == 0
    assert runner.ran[-1] == "tiny-direct::every_config"
