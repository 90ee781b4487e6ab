"""The GPU runner's script: scripts/gpu_run.sh's step check and its output folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_gpu_run_refuses_an_unknown_step_before_running_any(tmp_path):
    """scripts/gpu_run.sh checks every step name first: a misspelt one found halfway through a call (notes/gpu-runs.md
    run 68) loses the rest of the device's time."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_run.sh"
    run = subprocess.run(["bash", str(script), "env", "peer-stages"], env={**os.environ, "OUT": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "unknown step peer-stages; the steps are: env pyc" in run.stderr, run.stderr
    assert " suite-same-noiso " in run.stderr and not list(tmp_path.iterdir())  # env did not run


def test_gpu_run_creates_the_folder_it_is_given(tmp_path):
    """An ``OUT`` that does not exist yet is created before the first step tees its log into it (without it, every
    step of a device call ran with its log lost: notes/gpu-runs.md, run 122)."""
    import subprocess

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_run.sh"
    out = tmp_path / "new" / "bench"
    env = {**os.environ, "OUT": str(out), "PY": str(_stub_python(tmp_path)), "PACK": "0"}  # PACK=0: logs stay as is
    run = subprocess.run(["bash", str(script), "env"], env=env, capture_output=True, text=True, timeout=120)
    assert (out / "env.log").is_file(), run.stdout + run.stderr
    assert "commit" in (out / "env.log").read_text()


def _stub_python(tmp_path: Path, flags: str = "") -> Path:
    """An interpreter for the script that runs only its byte-code check (with ``flags``) and fails everything else
    at once: the env step's version line would import torch (seconds, and from source under an empty byte-code
    prefix), which these tests do not read."""
    import sys

    python = tmp_path / f"python{flags.replace(' ', '')}"
    python.write_text(f'#!/bin/sh\ncase "$2" in *find_spec*) exec {sys.executable} {flags} "$@" ;; esac\nexit 1\n')
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("earlier", [False, True], ids=["fresh-out", "out-with-the-callers-files"])
def test_gpu_run_packs_only_what_it_wrote(tmp_path, earlier):
    """The packing at the end archives the steps' logs and leaves what the caller put into ``OUT`` before it: a
    caller's log redirected into ``OUT`` (an open file the packing once deleted mid-write, losing a whole device
    call's results: notes/gpu-runs.md, run 165) and an earlier call's archive, which the new one does not overwrite."""
    import subprocess
    import tarfile

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_run.sh"
    out = tmp_path / "out"
    out.mkdir()
    if earlier:
        (out / "driver.log").write_text("the caller's own lines\n")
        (out / "logs.tgz").write_bytes(b"an earlier call's archive")
    # PACK=1 named: a caller's PACK=0 (the GPU runner's own script sets it) would otherwise reach the script
    env = {**os.environ, "OUT": str(out), "PY": str(_stub_python(tmp_path)), "COMMIT": "abc1234", "PACK": "1"}
    run = subprocess.run(["bash", str(script), "env"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    archive_name = "logs-2.tgz" if earlier else "logs.tgz"
    kept = ["driver.log", "logs.tgz"] if earlier else []
    assert sorted(p.name for p in out.iterdir()) == sorted([*kept, archive_name]), list(out.iterdir())
    if earlier:
        assert (out / "driver.log").read_text() == "the caller's own lines\n"
        assert (out / "logs.tgz").read_bytes() == b"an earlier call's archive"
    with tarfile.open(out / archive_name) as archive:
        assert archive.getnames() == ["env.log"]
        assert "commit abc1234" in archive.extractfile("env.log").read().decode()


def test_gpu_run_says_whether_torch_imports_from_byte_code(tmp_path):
    """Each run's env log says whether the interpreter imports torch from byte-code: a later invocation of the
    script without the pyc step's ``PYTHONPYCACHEPREFIX`` compiles torch from source in every process, and its suite
    times are not comparable with a run that had it (notes/gpu-runs.md, runs 147-164)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_run.sh"
    lines = {}
    for name in ("empty", "filled", "no-torch"):
        prefix = tmp_path / name
        prefix.mkdir()
        # no-torch: -S leaves site-packages, hence torch, off the interpreter's path
        python = _stub_python(tmp_path, "-S" if name == "no-torch" else "")
        env = {**os.environ, "OUT": str(tmp_path / f"out-{name}"), "PY": str(python), "PACK": "0",
               "PYTHONPYCACHEPREFIX": str(prefix), "PYTHONDONTWRITEBYTECODE": "1"}
        if name == "filled":  # torch's byte-code where this prefix puts it (its presence is what the line reads)
            probe = subprocess.run([sys.executable, "-c", "import importlib.util as u; "
                                    "print(u.cache_from_source(u.find_spec('torch').origin))"],
                                   env=env, capture_output=True, text=True, timeout=120, check=True)
            compiled = Path(probe.stdout.strip())
            assert compiled.is_relative_to(prefix), compiled
            compiled.parent.mkdir(parents=True)
            compiled.write_bytes(b"")
        subprocess.run(["bash", str(script), "env"], env=env, capture_output=True, text=True, timeout=120)
        log = (tmp_path / f"out-{name}" / "env.log").read_text()
        lines[name] = [line for line in log.splitlines() if line.startswith("torch byte-code: ")]
    assert lines["empty"] == ["torch byte-code: no (every process compiles torch from source: run pyc in this "
                              "invocation or pass its PYTHONPYCACHEPREFIX)"], lines
    assert lines["filled"] == ["torch byte-code: yes"], lines
    assert lines["no-torch"] == ["torch byte-code: no torch to import"], lines


@pytest.mark.parametrize("shard", ["", "1/2", "2/2"])
def test_every_config_runs_the_shard_it_is_given_under_the_shards_own_names(tmp_path, shard):
    """``SHARD=K/N`` splits the corpus's every_config sweep into device calls of their own (a whole sweep of vLLM's 23
    chunk-scan configs can take longer than one device call): pytest gets ``--shard K/N``, the logs
    and the report are named for the shard, so two shards' files never overwrite each other, and only shard 1 reruns
    the serving shapes. Without SHARD the step runs every case, as before."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_run.sh"
    out = tmp_path / "out"
    calls = tmp_path / "calls"
    python = tmp_path / "python"  # records each `-m` call's arguments, one per line, a blank line after each call
    python.write_text(f'#!/bin/sh\ncase "$1" in -m) printf "%s\\n" "$@" "" >> {calls} ; exit 0 ;; esac\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "OUT": str(out), "PY": str(python), "PACK": "0", "SHARD": shard,
           "EVERY_CONFIG_CACHE": str(tmp_path / "cache")}
    run = subprocess.run(["bash", str(script), "every-config"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    recorded = [call.split("\n") for call in calls.read_text().strip("\n").split("\n\n")]
    pytest_args, *repro = recorded
    name = "every-config" + ("-shard-{}-of-{}".format(*shard.split("/")) if shard else "")
    assert pytest_args[:3] == ["-m", "pytest", "cases"], pytest_args
    assert ("--shard" in pytest_args) == bool(shard), pytest_args
    if shard:
        assert pytest_args[pytest_args.index("--shard") + 1] == shard, pytest_args
    assert f"--ssd-report={out}/{name}-report.json" in pytest_args, pytest_args
    assert (out / f"{name}.log").is_file() and (out / f"{name}-findings.txt").is_file(), list(out.iterdir())
    if shard == "2/2":
        assert repro == [] and not (out / f"{name}-serving.log").exists(), repro
    else:
        (repro_args,) = repro
        assert repro_args[:4] == ["-m", "harness", "repro", "cases/regressions/every-config-serving-shapes.yaml"]
        assert (out / f"{name}-serving.log").is_file(), list(out.iterdir())


def test_a_step_stopped_before_its_report_is_summed_up_from_the_live_parts_which_stay(tmp_path):
    """A step's time limit that ends pytest before it writes ``--ssd-report`` (notes/gpu-runs.md, run 194): the
    step's findings read the workers' live parts, their first line (the call's summary) says the run did not finish,
    and the parts stay, the only record of what ran; a step whose report was written has its parts removed."""
    import subprocess
    import sys

    from harness.report import ItemRecord, Report, append_live, parts_dir

    root = Path(__file__).resolve().parents[1]
    script = root / "scripts" / "gpu_run.sh"
    python = tmp_path / "python"  # every `-m` call (pytest, harness repro) does nothing: the report is what is given
    python.write_text(f'#!/bin/sh\ncase "$1" in -m) exit 0 ;; esac\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    record = ItemRecord("cases/x.yaml::c::every_config", "passed", duration=1.0, case_id="c", check="every_config")
    for finished in (False, True):
        out = tmp_path / f"out-{finished}"
        report = out / "every-config-report.json"
        out.mkdir()
        append_live(report, "run-1", "gw0", record)
        if finished:
            Report([record], meta={"run": "run-1", "collected": 1}).write(report)
        env = {**os.environ, "OUT": str(out), "PY": str(python), "PACK": "0",
               "EVERY_CONFIG_CACHE": str(tmp_path / "cache")}
        run = subprocess.run(["bash", str(script), "every-config"], cwd=root, env=env, capture_output=True, text=True,
                             timeout=120)
        first = (out / "every-config-findings.txt").read_text().splitlines()[0]
        assert first.startswith("items {'passed': 1} case items run 1"), first
        if finished:
            assert first.endswith("- finished"), first
            assert not parts_dir(report).exists()
        else:
            assert "- NOT FINISHED: killed before its end (gw0 never wrote a final part)" in first, first
            assert "merged from the live parts of run run-1" in first and parts_dir(report).is_dir(), first
        assert first in run.stdout, run.stdout  # the step's line in the call's summary
