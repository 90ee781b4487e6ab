"""A repro line runs as printed: a provider found through a ``PYTHONPATH`` entry outside the repository brings that
entry along (``PYTHONPATH=<entry> python -m harness repro ...``)."""

from __future__ import annotations

import os
import sys

from harness.checks.runner import repro_line

PROVIDER_MODULE = "from reference import provider  # noqa: F401\n"


def test_a_provider_from_pythonpath_puts_its_entry_in_the_repro_line(tmp_path, tiny_cases, monkeypatch):
    home = tmp_path / "their providers"  # a space: the entry must be quoted for the shell
    home.mkdir()
    (home / "their_ssd_provider.py").write_text(PROVIDER_MODULE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.environ.get("PYTHONPATH", ""), str(home)]))
    monkeypatch.syspath_prepend(str(home))
    case = tiny_cases["tiny-direct"]
    line = repro_line(case, "determinism", "their_ssd_provider:provider")
    assert line == (f"PYTHONPATH='{home}' python -m harness repro {case.source} --check determinism "
                    "--case tiny-direct --provider their_ssd_provider:provider"), line
    assert "their_ssd_provider" not in sys.modules  # located, never imported


def test_providers_of_the_repository_need_no_environment(tiny_cases, monkeypatch):
    from harness.checks.providers import REPO_ROOT

    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    case = tiny_cases["tiny-direct"]
    for spec in ("tests.broken_providers:wrong_slot", "reference:provider"):
        assert repro_line(case, "determinism", spec).startswith("python -m harness repro "), spec
