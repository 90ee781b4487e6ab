"""Packaging: the pytest plugin is a ``pytest11`` entry point (so ``pytest my/cases --device cpu`` works anywhere
the package is installed) that the checkout's conftest names too without loading it twice, ``ssd-harness`` is the
CLI's console script, and Triton with the interpreter's numpy limit is pinned in the ``cpu`` extra alone, which every
CPU install line uses (tests/test_backend.py: the run-time refusal of a numpy the interpreter cannot use)."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ssd_pytest.plugin
from harness import cli
from tests import broken_providers as bp

tomllib = pytest.importorskip("tomllib", reason="tomllib (Python 3.11+) reads pyproject.toml")

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "ssd_pytest.plugin"


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def conftest_plugins() -> list[str]:
    tree = ast.parse((ROOT / "conftest.py").read_text())
    for node in tree.body:
        names = [t.id for t in getattr(node, "targets", ()) if isinstance(t, ast.Name)]
        if isinstance(node, ast.Assign) and names == ["pytest_plugins"]:
            return ast.literal_eval(node.value)
    return []


def test_the_entry_point_and_the_conftest_name_the_plugin_alike(pytestconfig):
    """pytest registers a plugin under its entry-point name and skips a ``pytest_plugins`` entry of a name already
    registered: one name for both means one load, whichever comes first."""
    project = pyproject()["project"]
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN}
    assert conftest_plugins() == [PLUGIN]
    assert pytestconfig.pluginmanager.get_plugin(PLUGIN) is ssd_pytest.plugin
    registered = [p for p in pytestconfig.pluginmanager.get_plugins() if p is ssd_pytest.plugin]
    assert len(registered) == 1


def test_the_console_script_is_the_cli_and_every_package_ships():
    project = pyproject()
    module, _, attr = project["project"]["scripts"]["ssd-harness"].partition(":")
    assert (module, attr) == ("harness.cli", "main") and callable(cli.main)
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    top_level = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert top_level == {"harness", "kernels", "reference", "ssd_pytest", "peers"}, top_level
    assert all(f"{name}*" in include for name in top_level), include  # with their sub-packages (harness.cases, ...)


def why_not_installed_from_here() -> str | None:
    """None when the ssd-harness distribution this Python sees is an editable install of this checkout with the
    plugin's entry point; else why not (the reason the test below skips)."""
    # The installed distribution: the one pip recorded (direct_url.json). An editable build also leaves
    # ssd_harness.egg-info in the checkout, which importlib finds first when the checkout is on sys.path.
    installed = [d for d in importlib.metadata.distributions(name="ssd-harness") if d.read_text("direct_url.json")]
    if not installed:
        return "ssd-harness is not pip-installed in this Python (pip install -e .)"
    dist = installed[0]
    if not any(ep.group == "pytest11" and ep.value == PLUGIN for ep in dist.entry_points):
        return "the installed ssd-harness has no pytest11 entry point (installed before ssd_pytest: pip install -e .)"
    origin = json.loads(dist.read_text("direct_url.json") or "{}")
    url = origin.get("url", "")
    if not origin.get("dir_info", {}).get("editable") or Path(url.removeprefix("file://")).resolve() != ROOT:
        return f"the installed ssd-harness is {url or 'not an editable install'}, not this checkout ({ROOT})"
    return None


def test_pytest_runs_a_case_folder_from_outside_the_checkout(tmp_path):
    """What a user does with the package installed: ``pytest my/cases --device cpu`` in their own folder, with no
    conftest and nothing on PYTHONPATH; the entry point loads the plugin. ``ssd-harness validate`` likewise."""
    reason = why_not_installed_from_here()
    if reason:
        pytest.skip(reason)
    entry_points = importlib.metadata.entry_points(group="pytest11")
    assert [ep.value for ep in entry_points if ep.name == PLUGIN] == [PLUGIN]
    cases = tmp_path / "my" / "cases"
    cases.mkdir(parents=True)
    (cases / "tiny.yaml").write_text(bp.TINY_CASES)
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith(("PYTEST_", "TRITON_", "SSD_"))}
    bin_dir = Path(sys.executable).parent
    report = tmp_path / "report.json"
    proc = subprocess.run([str(bin_dir / "pytest"), "my/cases", "--device", "cpu", "-k", "determinism",
                           "-p", "no:cacheprovider", "--ssd-report", str(report)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "ssd-harness: device=cpu provider=kernels:provider" in out and "3 passed" in out, out
    assert f"rootdir: {tmp_path}" in out, out  # nothing of the checkout: its conftest is not in play
    items = json.loads(report.read_text())["items"]
    assert sorted(i["nodeid"] for i in items) == [f"my/cases/tiny.yaml::{c}::determinism"
                                                  for c in ("tiny-batch", "tiny-direct", "tiny-returned")]
    validate = subprocess.run([str(bin_dir / "ssd-harness"), "validate", "my/cases"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
    assert validate.returncode == 0, validate.stdout + validate.stderr


def test_the_cpu_extra_pins_triton_and_numpy_and_every_install_line_agrees():
    """Triton comes from the CUDA torch wheel or, for the interpreter, from the ``cpu`` extra with the numpy that
    interpreter accepts; make, the install page's lines without make (docs/install.md) and the nightly GPU install agree
    with that."""
    project = pyproject()["project"]
    assert not [spec for spec in project["dependencies"] if spec.startswith("triton")], project["dependencies"]
    cpu = project["optional-dependencies"]["cpu"]
    assert "triton==3.6.0" in cpu and any(re.fullmatch(r"numpy[>=.,\d]*<2\.4", spec) for spec in cpu), cpu
    makefile = (ROOT / "Makefile").read_text()
    variables = dict(re.findall(r"^([A-Z_]+) \?= *(.*)$", makefile, re.M))
    assert variables["EXTRAS"] == "cpu,dev" and '-e ".[$(EXTRAS)]"' in makefile, variables
    assert "NUMPY_SPEC" not in makefile  # the numpy limit lives in the extra alone
    install = (ROOT / "docs" / "install.md").read_text()
    cpu_index = re.search(r"^TORCH_CPU_INDEX := (.*)$", makefile, re.M).group(1)
    assert "$(TORCH_CPU_INDEX)" in variables["TORCH_INDEX"], variables  # used where that host resolves
    torch_line = f".venv/bin/pip install {variables['TORCH_SPEC']} --index-url {cpu_index}"
    assert torch_line in install and ".venv/bin/pip install -e '.[cpu,dev]'" in install
    nightly = (ROOT / ".github" / "workflows" / "nightly-gpu.yml").read_text()
    assert re.search(r"MAKE_GPU: .*\bTORCH_SPEC= .*\bEXTRAS=dev\b", nightly), "the GPU install keeps its own torch"
