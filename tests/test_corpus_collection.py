"""The case corpus is collected in full: one item per case and applicable check, nothing silently dropped, and every
item the CPU tier cannot run skips with a reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from harness.cases.loader import load_cases
from harness.checks import Status, load_provider, run_check, selected_checks

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "cases"


def collect(pytester, device: str, *paths: Path) -> tuple[list[str], str]:
    """``pytest --collect-only -q PATHS`` with the plugin, in this process (a fresh interpreter would import torch and
    start CUDA again). On the session's device: in one process the backend cannot switch (harness.backend)."""
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--device", device, "-p", "no:cacheprovider",
                                          "-p", "ssd_pytest.plugin", "--rootdir", str(ROOT), *map(str, paths))
    out = "\n".join(result.outlines)
    assert result.ret == 0, out + "\n".join(result.errlines)
    return [line for line in result.outlines if "::" in line], out


def expected_items(cases, root: Path) -> list[str]:
    return [f"{Path(c.source).resolve().relative_to(root)}::{c.id}::{name}"
            for c in cases for name, _ in selected_checks(c)]


def _corpus_cases():
    files = sorted(CASES.rglob("*.yaml"))
    if not files:
        pytest.skip("cases/ holds no case files yet (python -m harness generate --out cases/corpus)")
    return load_cases([CASES])


def test_checked_in_cases_are_collected_in_full(pytester, device):
    cases = _corpus_cases()
    items, out = collect(pytester, device, CASES)
    want = expected_items(cases, ROOT)
    assert len(items) == len(set(items)) == len(want)
    assert set(items) == set(want)
    assert re.search(rf"\b{len(want)} tests? collected", out)


def test_every_item_beyond_the_cpu_tier_skips_naming_the_limits_and_the_override():
    from harness.checks.tiers import runs_on_cpu

    beyond = [(c, name) for c in _corpus_cases() for name, _ in selected_checks(c) if not runs_on_cpu(c, name)]
    if not beyond:
        pytest.skip("every corpus item is in the CPU tier")
    provider = load_provider("kernels:provider")
    for case, name in beyond:
        result = run_check(case, name, provider, device="cpu")  # decided before any tensor is built
        assert result.status in (Status.SKIPPED, Status.UNSUPPORTED), (case.id, name, result.status)
        if result.status is Status.SKIPPED and case.tiers.cpu is False:  # the case's own word: GPU only
            assert "tiers.cpu is false" in result.reason, result.reason
            assert str(case.source) in result.reason, result.reason
        elif result.status is Status.SKIPPED:  # the estimate's
            assert "s per case (" in result.reason and "tiers: {cpu: true}" in result.reason, result.reason
            assert str(case.source) in result.reason, result.reason


def test_a_freshly_generated_corpus_is_collected_in_full(pytester, tmp_path, device):
    from harness.cases.generate import generate_corpus

    out = tmp_path / "corpus"
    generate_corpus(out)
    cases = load_cases([out])
    assert cases
    # node ids are relative to the rootdir pytest picks for out: compare file names
    items, _ = collect(pytester, device, out)

    def key(nodeid: str) -> str:
        file, rest = nodeid.split("::", 1)
        return f"{Path(file).name}::{rest}"

    assert sorted(map(key, items)) == sorted(map(key, expected_items(cases, tmp_path)))
