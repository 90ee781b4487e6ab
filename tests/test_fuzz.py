"""The Hypothesis fuzzer: it draws only valid cases, finds and shrinks a broken provider's failure, and the YAML it
writes reproduces that failure through ``harness run`` (and passes on a working provider).

The broken providers here wrap ``reference:provider`` (``tests.broken_providers:on_reference.*``): shrinking calls
the provider hundreds of times, which takes minutes through the Triton interpreter and milliseconds in PyTorch. The
kernels themselves are covered by test_checks / test_cli / test_plugin with the same broken providers. The first two
searches run in this process (``isolation="none"``); of the CLI ones, the first in supervised children, as the CLI
does by default, the other with ``--isolation none``. Providers that crash, hang or raise: test_fuzz_faults.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from harness import cli
from harness.cases.builder import build_inputs
from harness.cases.loader import dump_case, load_case_file
from harness.fuzz import NoFailure, cases, fuzz
from tests import broken_providers as bp

pytestmark = pytest.mark.usefixtures("children_with_one_hardware_queue")  # tests/conftest.py says why


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_strategy_draws_only_valid_buildable_cases(tmp_path_factory, case):
    path = tmp_path_factory.mktemp("drawn") / "case.yaml"
    path.write_text(dump_case(case))
    assert load_case_file(path) == [case]  # the loader's validation accepts it unchanged
    inputs = build_inputs(case, "cpu")
    kwargs = inputs.kwargs()
    assert kwargs["x"].shape == (case.total_tokens, case.shape.nheads, case.shape.headdim)
    assert case.tiers.cpu


def test_fuzz_finds_nothing_against_a_working_provider(tmp_path, device):
    found = fuzz("reference:provider", budget=8, out_dir=tmp_path, device=device, isolation="none")
    assert isinstance(found, NoFailure) and found.examples > 0 and found.items > 0, found
    assert not found.stopped and not list(tmp_path.iterdir())


def test_a_time_budget_spent_before_the_first_item_still_runs_that_item_and_no_other(tmp_path, device):
    """A start-up longer than the budget (torch and a CUDA context on a busy host) must not end the search before
    it has tried anything: the first item runs, the next example meets the spent budget."""
    found = fuzz("reference:provider", budget=8, out_dir=tmp_path, device=device, isolation="none",
                 checks=["determinism"], time_budget=1e-9)
    assert isinstance(found, NoFailure), found
    assert (found.examples, found.items) == (1, 1), found
    assert found.stopped == "the time budget of 1e-09 s ran out", found
    assert not list(tmp_path.iterdir())


def test_fuzz_shrinks_and_writes_a_regression_in_process(tmp_path, device):
    found = fuzz("tests.broken_providers:on_reference.mutates_input", budget=20, out_dir=tmp_path, device=device,
                 isolation="none", provider=bp.on_reference.mutates_input)
    assert found is not None and found.check == "readonly_inputs"
    assert found.failure.kind == "mismatch" and not found.stopped
    (case,) = load_case_file(found.path)
    assert case.checks == ("readonly_inputs",) and case.expect.kind == "pass"
    # shrunk: Hypothesis minimises toward one short sequence
    assert case.batch == 1 and case.total_tokens == 1, case.summary()


def _fuzz_then_run(tmp_path: Path, capsys, provider_name: str, check: str, device: str, *isolation: str) -> None:
    """``harness fuzz`` writes a shrunk failing case; ``harness run`` on it fails the same check with a repro line
    and passes on a working provider. Through ``cli.main`` in this process, on the session's device (one process
    cannot switch backends): a fresh interpreter per command would import torch and start CUDA again each time (the
    process entry point has its own test in test_cli). ``isolation``: extra options of all three commands."""
    spec = f"tests.broken_providers:on_reference.{provider_name}"
    assert cli.main(["fuzz", "--budget", "40", "--out", str(tmp_path), "--provider", spec, "--device", device,
                     "--check", check, *isolation]) == 1
    (written,) = tmp_path.glob("*.yaml")
    assert f"fuzz: {check} failed; shrunk case written to {written}" in capsys.readouterr().out
    assert cli.main(["run", str(written), "--provider", spec, "--device", device, *isolation]) == 1
    out = capsys.readouterr().out
    assert f"FAILED      {written.stem}::{check}" in out
    assert f"repro: python -m harness repro {written} --check {check}" in out
    healthy = cli.main(["run", str(written), "--provider", "reference:provider", "--device", device, *isolation])
    out = capsys.readouterr().out
    assert healthy == 0 or f"{written.stem}  1 unsupported" in out, out


def test_fuzz_cli_regression_reproduces_wrong_slot(tmp_path, capsys, device):
    _fuzz_then_run(tmp_path, capsys, "wrong_slot", "untouched_storage", device)


def test_fuzz_cli_regression_reproduces_one_ulp_indexed(tmp_path, capsys, device):
    """The same through the CLI's in-process runner (the test above runs the default supervised children)."""
    _fuzz_then_run(tmp_path, capsys, "one_ulp_indexed", "indexed_vs_snapshot", device, "--isolation", "none")
