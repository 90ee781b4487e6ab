"""The CI workflow files are valid GitHub Actions YAML, and every harness command and pytest option they use exists."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from harness import cli

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def load(path: Path) -> dict:
    # PyYAML reads the key `on` as True (YAML 1.1); GitHub reads it as "on".
    doc = yaml.safe_load(path.read_text())
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


def run_lines(doc: dict) -> list[str]:
    lines = []
    for job in doc["jobs"].values():
        for step in job["steps"]:
            if "run" in step:
                lines.append(" ".join(step["run"].split()))
    return lines



def test_there_are_a_cpu_and_a_nightly_gpu_workflow():
    names = {p.name for p in WORKFLOWS}
    assert {"ci-cpu.yml", "nightly-gpu.yml"} <= names


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_structure(path):
    doc = load(path)
    assert isinstance(doc.get("name"), str), f"{path.name}: name: expected a string"
    assert doc.get("on"), f"{path.name}: on: expected triggers"
    assert isinstance(doc.get("jobs"), dict) and doc["jobs"], f"{path.name}: jobs: expected a mapping"
    for job_id, job in doc["jobs"].items():
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", job_id), f"{path.name}: jobs.{job_id}: invalid job id"
        assert "runs-on" in job, f"{path.name}: jobs.{job_id}.runs-on: missing"
        assert isinstance(job.get("timeout-minutes"), int), f"{path.name}: jobs.{job_id}.timeout-minutes: missing"
        assert job.get("steps"), f"{path.name}: jobs.{job_id}.steps: expected a list"
        for i, step in enumerate(job["steps"]):
            assert ("run" in step) != ("uses" in step), (
                f"{path.name}: jobs.{job_id}.steps[{i}]: exactly one of run/uses")


def test_cpu_workflow_runs_ci_entry_point_which_runs_readme_command():
    assert "bash .ci/run" in run_lines(load(ROOT / ".github/workflows/ci-cpu.yml"))
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci/run").read_text()
    assert "make test" in readme and re.search(r"^make test$", ci, re.M)


def make_rule(target: str) -> tuple[list[str], list[str]]:
    """The prerequisites and recipe lines of ``target`` in the Makefile."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:(?!=)(.*)\n((?:\t.*\n)*)", text, re.M)
    assert match, f"Makefile: no rule for {target}"
    return match.group(1).split(), [line.strip() for line in match.group(2).splitlines()]


def test_make_test_lints_first_with_the_pinned_ruff():
    """CI runs `make test`, so the linter runs there before the suite: ``lint`` is a prerequisite of ``test`` and runs
    ruff on the whole tree, with the ruff that pyproject's dev extra pins (and that the install step installs)."""
    test_prerequisites, _ = make_rule("test")
    assert "lint" in test_prerequisites, test_prerequisites
    _, lint_recipe = make_rule("lint")
    assert lint_recipe == ["$(PY) -m ruff check ."], lint_recipe
    tomllib = pytest.importorskip("tomllib", reason="tomllib (Python 3.11+) reads pyproject.toml")
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(re.fullmatch(r"ruff==[0-9.]+", spec) for spec in dev), dev


def defined(config: pytest.Config, option: str) -> bool:
    """Whether this pytest (with its plugins: ours and xdist) defines ``option`` (``--name``)."""
    try:
        config.getoption(option)
    except ValueError:
        return False
    return True


def harness_help_exit_code(sub: str) -> int:
    """``python -m harness SUB --help`` in this process (argparse exits after printing the help)."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            code = cli.main([sub, "--help"])
    except SystemExit as exc:
        code = exc.code
    return code or 0


def test_nightly_uses_only_existing_harness_commands_and_pytest_options(pytestconfig):
    lines = run_lines(load(ROOT / ".github/workflows/nightly-gpu.yml"))
    subcommands = {m.group(1) for line in lines for m in re.finditer(r"-m harness ([\w-]+)", line)}
    assert {"warmup", "fuzz", "report-html"} <= subcommands
    with contextlib.redirect_stderr(io.StringIO()):
        assert harness_help_exit_code("no-such-command") != 0  # the check can fail
    for sub in sorted(subcommands):
        assert harness_help_exit_code(sub) == 0, f"python -m harness {sub} --help failed"
    options = {tok.split("=")[0] for tok in shlex.split(nightly_suite_line()) if tok.startswith("--")}
    assert {"--device", "--recompile-guard", "--ssd-report"} <= options
    assert not defined(pytestconfig, "--no-such-option")  # the check can fail
    missing = [opt for opt in sorted(options) if not defined(pytestconfig, opt)]
    assert not missing, f"pytest options used by nightly-gpu.yml but not defined: {missing}"


def test_nightly_forces_every_config_over_the_whole_corpus():
    """A default GPU run skips every_config outside the cases that name it (harness.checks.tiers): the nightly run
    names it, on every case file under cases/, on the GPU, its report kept."""
    lines = run_lines(load(ROOT / ".github/workflows/nightly-gpu.yml"))
    forced = [shlex.split(line) for line in lines if "--check every_config" in line]
    assert len(forced) == 1, forced
    words = forced[0]
    assert words[words.index("-m") + 1:words.index("-m") + 4] == ["harness", "run", "cases"], words
    assert words[words.index("--device") + 1] == "cuda" and "--json" in words, words


def nightly_suite_line() -> str:
    """The nightly workflow's one step that runs pytest."""
    lines = run_lines(load(ROOT / ".github/workflows/nightly-gpu.yml"))
    (line,) = [line for line in lines if "-m pytest" in line or "make test" in line]
    return line


# Options that only add reports: the run they come with checks what the command without them checks.
REPORT_OPTIONS = {"--junit-xml", "--ssd-report"}


def test_nightly_suite_runs_the_readmes_gpu_command_as_written():
    """The nightly suite is the README's GPU command (``python3 -m pytest -n auto --device cuda``) with the venv's
    Python, plus ``--recompile-guard`` and report options only: no shard, worker count or cost file of its own, so
    the defaults a user gets are the ones measured every night."""
    readme = (ROOT / "README.md").read_text()
    match = re.search(r"`python3 (-m pytest -n auto --device cuda)`", readme)
    assert match, "README: the GPU command `python3 -m pytest -n auto --device cuda` is missing"
    words = shlex.split(nightly_suite_line())
    command = shlex.split(match.group(1))
    assert words[0] == ".venv/bin/python" and words[1:1 + len(command)] == command, words
    extra = words[1 + len(command):]
    assert "--recompile-guard" in extra, extra
    unexpected = [w for w in extra if w != "--recompile-guard" and w.split("=")[0] not in REPORT_OPTIONS]
    assert not unexpected, f"nightly suite: options beyond the README's command: {unexpected}"


def test_nightly_fuzz_ends_inside_its_timeout():
    """The fuzz job's --time-budget, plus an item that runs to the CUDA item time limit and a replaced child's
    start-up after the budget, fits inside the `timeout` the step runs under: the search writes what it found
    before it is killed."""
    from harness.isolation import DEFAULT_TIMEOUTS
    from harness.isolation.supervisor import MIN_START_SECONDS

    lines = run_lines(load(ROOT / ".github/workflows/nightly-gpu.yml"))
    (line,) = [line for line in lines if "-m harness fuzz" in line]
    words = shlex.split(line)
    assert words[0] == "timeout" and "--device" in words and words[words.index("--device") + 1] == "cuda", line
    killed_at = float(words[1])
    budget = float(words[words.index("--time-budget") + 1])
    assert budget + DEFAULT_TIMEOUTS["cuda"] + MIN_START_SECONDS < killed_at, line


def make_targets() -> set[str]:
    """Targets the Makefile defines: rule heads ``name:`` (not assignments ``NAME :=``), with ``$(NAME)`` expanded
    from the file's simple assignments (the install stamp is ``$(STAMP)``)."""
    text = (ROOT / "Makefile").read_text()
    def expand(value: str, variables: dict[str, str]) -> str:
        return re.sub(r"\$\(([A-Z_]+)\)", lambda m: variables.get(m.group(1), m.group(0)), value)

    variables = dict(re.findall(r"^([A-Z_]+) :?= *(\S*)$", text, re.M))
    for _ in range(3):  # STAMP := $(VENV)/.installed-stamp refers to another variable
        text = expand(text, variables)
        variables = {k: expand(v, variables) for k, v in variables.items()}
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_./-]+):(?!=)", text, re.M)}


def test_every_make_target_a_workflow_runs_exists():
    targets = make_targets()
    assert "no-such-target" not in targets and {"test", "run", "bytecode"} <= targets  # the parse can fail
    used = {m.group(1) for path in WORKFLOWS for line in run_lines(load(path))
            for m in re.finditer(r"\bmake ([A-Za-z0-9_./-]+)", line)}
    assert used, "no make call found in the workflows"
    missing = sorted(used - targets)
    assert not missing, f"make targets the workflows run but the Makefile lacks: {missing}"


def test_make_test_runs_the_suite_with_byte_code_writing_allowed():
    """pytest loads its own byte-code for the modules it rewrites (every module of a pytest plugin's distribution:
    this project's and Hypothesis's, and the tests), not ``compileall``'s, and writes it only where byte-code may be
    written: the suite's pytest command in ``make test`` allows it whatever the machine sets, so the pytest processes
    the tests start do not rewrite those modules again."""
    _, recipe = make_rule("test")
    (line,) = [line for line in recipe if "-m pytest" in line]
    assert line.startswith("PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n auto"), line


def test_make_test_writes_the_byte_code_of_every_python_folder_of_the_tree():
    """``make test`` compiles the tree's modules once before the suite (the machines set PYTHONDONTWRITEBYTECODE=1):
    every top-level folder with Python modules, and the top-level modules, are named, so a new one is not left to
    compile in every process."""
    _, recipe = make_rule("test")
    (line,) = [line for line in recipe if "compileall" in line]
    named = set(line.split("compileall", 1)[1].split(">")[0].split()) - {"-q", "-j", "0"}
    # scripts/ and lab/ run as programs, once, outside the suite; the others hold no module
    skip = {"scripts", "lab", "docs", "notes", "cases"}
    expected = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in skip
                and any(p.rglob("*.py"))} | {p.name for p in ROOT.glob("*.py")}
    expected -= {p.name for p in ROOT.iterdir() if p.name.endswith(".egg-info") or p.name in ("build", "reports")}
    assert named == expected, (named, expected)
