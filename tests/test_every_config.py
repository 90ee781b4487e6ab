"""``every_config`` (issue 53): a config the autotuner would not pick, wrong under the compiler, is flagged by name;
the same provider without it passes; declared-exact outputs are held bit for bit; configs the device cannot run,
the budget and the one-config rerun are reported as such; our kernels pass on corpus cases."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import triton
from triton.runtime.errors import OutOfResources

from harness.cases.loader import load_case_file
from harness.checks import CheckContext, Status, get_check, load_provider, run_check
from harness.checks import configs as every_config
from tests import autotuned_providers as ap
from tests.broken_providers import TINY_CASES
from tests.support import harness

CHECK = "every_config"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("cases") / "tiny.yaml"
    path.write_text(TINY_CASES)
    return {c.id: c for c in load_case_file(path)}


def _cpu_only(device):
    if device != "cpu":
        pytest.skip("the config this test needs forced, or left unforced, is one only the interpreter's stand-in "
                    "benchmarker is sure to pick or pass over (the first config wins there); on the GPU the tuner "
                    "times them")


def test_a_miscompiled_config_the_tuner_does_not_pick_is_flagged_by_name(tiny, device):
    """On the GPU the tuner times the three configs: the miscompiled one is by far the slowest, never its pick."""
    case = tiny["tiny-direct"]
    provider = ap.RowCopyOut(ap.row_copy)
    plain = run_check(case, "reference_bound", provider, device=device)
    assert plain.status is Status.PASSED, plain.message  # the tuner's pick is fine: only forcing shows the bug

    result = run_check(case, CHECK, provider, device=device)

    assert result.status is Status.FAILED, (result.status, result.reason)
    assert result.summary.startswith("1 of 2 forced configs fail: "), result.summary
    assert f"{ap.ROW_COPY}[1] ROWS=8 num_warps=4 num_stages=3" in result.summary, result.summary
    assert "out vs fp64 sequential reference (forced" in result.message and "nan" in result.message.lower()
    assert f"--check {CHECK} --case tiny-direct" in result.message
    assert f"--config {ap.ROW_COPY}:1" in result.message, result.message
    # the tuner's pick (the first config under the interpreter), which the first call ran: the other two are forced
    assert result.stats["configs_forced"] == 2 and result.stats["autotuners"] == {ap.ROW_COPY: 3}, result.stats


def test_the_same_provider_without_that_config_passes(tiny, device):
    result = run_check(tiny["tiny-direct"], CHECK, ap.RowCopyOut(ap.row_copy_without_miscompiled), device=device)
    assert result.status is Status.PASSED, result.message
    assert result.stats["configs_forced"] == 1 and result.stats["configs_to_force"] == 1, result.stats


def test_declared_exact_outputs_are_held_bit_for_bit(tiny, device):
    """One ulp moved by one config is within the bound, so it passes undeclared; declared exact, it fails."""
    _cpu_only(device)
    case = tiny["tiny-direct"]
    undeclared = run_check(case, CHECK, ap.RowCopyOut(ap.row_copy_nudging), device=device)
    assert undeclared.status is Status.PASSED, undeclared.message

    declared = run_check(case, CHECK, ap.RowCopyOut(ap.row_copy_nudging, {ap.ROW_COPY: ("out",)}), device=device)

    assert declared.status is Status.FAILED, declared.status
    assert f"{ap.ROW_COPY}[1] ROWS=2" in declared.summary, declared.summary
    assert "declared exact" in declared.message and "max ulp 1" in declared.message, declared.message


def test_an_unknown_declared_output_is_an_error(tiny, device):
    result = run_check(tiny["tiny-direct"], CHECK, ap.RowCopyOut(ap.row_copy, {ap.ROW_COPY: ("bits",)}),
                       device=device)
    assert result.status is Status.ERROR and "exact_across_configs" in result.summary, result.summary


def test_a_config_the_device_cannot_run_is_reported_not_passed(tiny, device):
    """Triton raises OutOfResources for a config that needs more shared memory than the device has; the config is
    listed as not runnable on this device and the others are still judged."""
    _cpu_only(device)

    def too_big(nargs):
        raise OutOfResources(300000, 232448, "shared memory")

    oversized = triton.Config({"ROWS": 16}, pre_hook=too_big)
    kernel = triton.autotune(configs=[triton.Config({"ROWS": 4}), oversized], key=["row_len"])(ap._row_copy)

    result = run_check(tiny["tiny-direct"], CHECK, ap.RowCopyOut(kernel), device=device)

    assert result.status is Status.PASSED, result.message
    assert result.stats["configs_forced"] == 0, result.stats
    [line] = result.stats["not_runnable_on_this_device"]
    assert line.startswith(f"{ap.ROW_COPY}[1] ROWS=16") and "not runnable on this device" in line, line


def test_a_config_whose_call_raises_is_the_items_error_naming_it(tiny, device):
    _cpu_only(device)

    def crash(nargs):
        raise ValueError("bad launch")

    kernel = triton.autotune(configs=[triton.Config({"ROWS": 4}), triton.Config({"ROWS": 16}, pre_hook=crash)],
                             key=["row_len"])(ap._row_copy)

    result = run_check(tiny["tiny-direct"], CHECK, ap.RowCopyOut(kernel), device=device)

    assert result.status is Status.ERROR, result.status
    assert result.summary == (f"RuntimeError: forced {ap.ROW_COPY}[1] ROWS=16 num_warps=4 num_stages=3: the call "
                              "raised ValueError: bad launch"), result.summary


def test_past_the_budget_the_item_says_not_all_ran(tiny, device, monkeypatch):
    """The miscompiled config comes after the budget: the item is not passed, and says what ran."""
    _cpu_only(device)
    late = triton.autotune(configs=[ap.ROW_COPY_CONFIGS[0], ap.ROW_COPY_CONFIGS[2], ap.ROW_COPY_CONFIGS[1]],
                           key=["row_len"])(ap._row_copy)
    monkeypatch.setattr(every_config, "CONFIG_BUDGET", 1)

    result = run_check(tiny["tiny-direct"], CHECK, ap.RowCopyOut(late), device=device)

    assert result.status is Status.SKIPPED, (result.status, result.message)
    assert result.reason.startswith("not all ran: 1 of 2 configs to force ran (budget 1 forced calls"), result.reason
    assert result.stats["configs_forced"] == 1 and "ROWS=16" in result.stats["forced"][0], result.stats

    monkeypatch.setattr(every_config, "CONFIG_BUDGET", 2)
    result = run_check(tiny["tiny-direct"], CHECK, ap.RowCopyOut(late), device=device)
    assert result.status is Status.FAILED and f"{ap.ROW_COPY}[2] ROWS=8" in result.summary, result.summary


def test_the_rerun_line_runs_that_config_alone(tiny, device, monkeypatch):
    _cpu_only(device)
    monkeypatch.setenv(every_config.CONFIG_ENV, f"{ap.ROW_COPY}:2")
    result = run_check(tiny["tiny-direct"], CHECK, ap.RowCopyOut(ap.row_copy), device=device)
    assert result.status is Status.PASSED, result.message
    assert [r.split(" ")[0] for r in result.stats["forced"]] == [f"{ap.ROW_COPY}[2]"]

    monkeypatch.setenv(every_config.CONFIG_ENV, f"{ap.ROW_COPY}:1")
    result = run_check(tiny["tiny-direct"], CHECK, ap.RowCopyOut(ap.row_copy), device=device)
    assert result.status is Status.FAILED and f"{ap.ROW_COPY}[1] ROWS=8" in result.summary, result.summary


def test_a_provider_without_autotuners_is_skipped_with_the_reason(tiny, device):
    result = run_check(tiny["tiny-direct"], CHECK, load_provider("reference:provider"), device=device)
    assert result.status is Status.SKIPPED and "launched no Triton autotuner" in result.reason, result.reason


# Corpus cases whose call forces configs under the interpreter (bmm has four candidates at dstate 64), and one
# whose autotuners each have one candidate, their pick.
OUR_CASES = [("direct.yaml", "direct-073-fp32-bf16-h4p16n64g2", 3),
             ("fallback.yaml", "fallback-031-fp16-fp16-h4p16n64g2", 3),
             ("multi.yaml", "multi-000-fp16-fp16-h3p5n16g3", 0)]


@pytest.mark.parametrize(("file", "case_id", "forced"), OUR_CASES)
def test_our_kernels_pass_on_corpus_cases(device, file, case_id, forced):
    """The check itself, whatever the CPU tier's estimate for the case: our kernels' declared-exact states and every
    forced config within the bound."""
    if device != "cpu":
        pytest.skip("the interpreter's candidates; the GPU tier runs the whole corpus")
    [case] = [c for c in load_case_file(REPO / "cases" / "corpus" / file) if c.id == case_id]
    provider = load_provider("kernels:provider")
    stats = get_check(CHECK).run(CheckContext(case, provider, device))
    assert stats["configs_forced"] == forced, stats
    assert set(stats["exact_across_configs"]) == {k for k, v in stats["autotuners"].items() if "chunk_scan" in k
                                                  or "bmm_chunk" in k}, stats


def test_repro_config_reruns_that_config_and_leaves_the_environment(tiny, tmp_path, device):
    _cpu_only(device)
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_CASES)
    spec = "tests.autotuned_providers:row_copy_out"
    common = ("repro", str(path), "--case", "tiny-direct", "--device", device, "--provider", spec)

    proc = harness(*common, "--check", CHECK, "--config", f"{ap.ROW_COPY}:1")

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAILED: tiny-direct::{CHECK}" in proc.stdout and "1 of 1 forced configs fail" in proc.stdout, proc.stdout
    assert every_config.CONFIG_ENV not in os.environ
    proc = harness(*common, "--check", "reference_bound", "--config", f"{ap.ROW_COPY}:1")
    assert proc.returncode == 2 and "--config selects a config for --check every_config alone" in proc.stderr
    assert every_config.CONFIG_ENV not in os.environ
