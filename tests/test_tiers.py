"""The CPU tier (harness.checks.tiers): which items run under the interpreter, what a skip says, and the regression
warning of ``validate``. Nothing here runs a kernel: the tier is decided before any tensor is built."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.cases.loader import load_case_file
from harness.cases.model import Tiers
from harness.checks import Status, get_check, load_provider, run_check, selected_checks
from harness.checks.tiers import (
    CPU_CASE_BLOCKS,
    CPU_ITEM_SECONDS,
    SECONDS_PER_BLOCK,
    cpu_estimate,
    cpu_tier_gaps,
    cpu_tier_reason,
    runs_on_cpu,
)
from tests.support import harness

# Two sequences of 40 new tokens over 4 heads, each crossing a 64-token chunk boundary: 4 chunks x 4 heads = 16
# blocks, beyond CPU_CASE_BLOCKS. A check of one call is estimated at 16 x 0.066 = 1.06 s (within the item limit),
# one of two calls or more beyond it.
H4_CASE = """\
schema: ssd-case/1
id: h4-two-sequences
seed: 3
shape: {nheads: 4, headdim: 16, dstate: 64, ngroups: 2, chunk_size: 64}
dtype: {io: float16, state: float32}
sequences:
  - {context: 50, tokens: 40, init_slot: 0, has_state: true, final_slot: 1}
  - {context: 30, tokens: 40, init_slot: 2, has_state: true, final_slot: 3}
cache: {slots: 5}
"""


def _load(tmp_path: Path, text: str, folder: str = "cases") -> tuple[Path, object]:
    path = tmp_path / folder / "case.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    (case,) = load_case_file(path)
    return path, case


def test_blocks_count_chunks_heads_and_the_block_sizes(tmp_path):
    _, case = _load(tmp_path, H4_CASE)
    assert case.cpu_blocks() == 4 * 4
    wide = replace(case, shape=replace(case.shape, chunk_size=256, dstate=256))  # 2 chunks of 4 x 2 blocks
    assert wide.cpu_blocks() == 2 * 4 * (256 // 64) * (256 // 128)
    narrow = replace(case, shape=replace(case.shape, chunk_size=16, dstate=16))  # one block per small chunk
    assert narrow.cpu_blocks() == 7 * 4  # 14+16+10 and 2+16+16+6 tokens


def test_the_estimate_is_calls_times_blocks_times_the_measured_seconds(tmp_path):
    _, case = _load(tmp_path, H4_CASE)
    for name, _ in selected_checks(case):
        assert cpu_estimate(case, name) == pytest.approx(get_check(name).cpu_calls * 16 * SECONDS_PER_BLOCK)
    assert get_check("readonly_inputs").cpu_calls == 1.0 < get_check("indexed_vs_snapshot").cpu_calls


def test_a_case_beyond_the_block_limit_runs_only_its_cheap_items(tmp_path):
    path, case = _load(tmp_path, H4_CASE)
    assert case.tiers == Tiers() and case.cpu_blocks() > CPU_CASE_BLOCKS
    assert runs_on_cpu(case, "readonly_inputs") and runs_on_cpu(case, "gather_exact")
    reason = cpu_tier_reason(case, "determinism")
    assert reason == (
        f"beyond the CPU interpreter tier: 16 blocks > {CPU_CASE_BLOCKS} per case (4 chunks x 4 heads x 1 x 1: blocks "
        f"of 64 chunk rows and 128 state columns) and determinism is estimated at 2.1 s > {CPU_ITEM_SECONDS:g} s per "
        f"item (2 calls x {SECONDS_PER_BLOCK} s per block); tiers: {{cpu: true}} in {path} runs it there anyway; runs "
        f"on the GPU tier")


def test_a_small_case_runs_every_item(tmp_path):
    _, case = _load(tmp_path, H4_CASE.replace("context: 50, tokens: 40", "context: 0, tokens: 40"))
    assert case.cpu_blocks() == CPU_CASE_BLOCKS  # 3 chunks x 4 heads
    assert all(runs_on_cpu(case, name) for name, _ in selected_checks(case))
    assert cpu_estimate(case, "indexed_vs_snapshot") > CPU_ITEM_SECONDS  # runs although the item alone is costly


def test_tiers_cpu_overrides_the_estimate_both_ways(tmp_path):
    path, case = _load(tmp_path, H4_CASE + "tiers: {cpu: true}\n")
    assert case.tiers == Tiers(cpu=True) and all(runs_on_cpu(case, n) for n, _ in selected_checks(case))
    small = replace(case, sequences=case.sequences[:1], tiers=Tiers(cpu=False))
    assert cpu_tier_reason(small, "gather_exact") == (
        f"beyond the CPU interpreter tier: tiers.cpu is false in {path}; runs on the GPU tier")


def test_the_skip_is_decided_on_the_cpu_only(tmp_path):
    """The runner reports the reason as a skip before building anything; the GPU tier ignores the CPU limits."""
    _, case = _load(tmp_path, H4_CASE)
    provider = load_provider("kernels:provider")
    result = run_check(case, "autotune_idempotent", provider, device="cpu")
    assert result.status is Status.SKIPPED and result.reason == cpu_tier_reason(case, "autotune_idempotent")
    assert cpu_tier_gaps(case) == (["auto_vs_snapshot", "determinism", "autotune_idempotent"],
                                   f"16 blocks > {CPU_CASE_BLOCKS} per case, and each of these is estimated above "
                                   f"{CPU_ITEM_SECONDS:g} s")


def test_validate_warns_about_a_regression_the_cpu_tier_skips(tmp_path):
    path, _ = _load(tmp_path, H4_CASE, folder="cases/regressions")
    proc = harness("validate", str(tmp_path / "cases"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (f"warning: {path}: h4-two-sequences: the CPU tier skips auto_vs_snapshot, determinism, "
            f"autotune_idempotent (16 blocks > {CPU_CASE_BLOCKS} per case, and each of these is estimated above "
            f"{CPU_ITEM_SECONDS:g} s), so CI runs them only on the nightly GPU run, not on every change; add "
            f"tiers: {{cpu: true}} to the case to run them on the CPU tier too") in proc.stdout
    assert "ok: 1 cases in 1 files, 1 warning(s)" in proc.stdout


def test_validate_is_quiet_about_forced_regressions_and_about_the_corpus(tmp_path):
    _load(tmp_path, H4_CASE + "tiers: {cpu: true}\n", folder="cases/regressions")
    _load(tmp_path, H4_CASE.replace("h4-two-sequences", "h4-corpus"), folder="cases/corpus")
    proc = harness("validate", str(tmp_path / "cases"))
    assert proc.returncode == 0 and "warning" not in proc.stdout, proc.stdout
    assert "ok: 2 cases in 2 files\n" in proc.stdout
