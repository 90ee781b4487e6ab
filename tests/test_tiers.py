"""The CPU tier (harness.checks.tiers): which items run under the interpreter, what a skip says, and the regression
warning of ``validate``. Nothing here runs a kernel: the tier is decided before any tensor is built."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.cases.loader import load_case_file, load_cases
from harness.cases.model import Tiers
from harness.checks import Status, get_check, load_provider, run_check, selected_checks
from harness.checks.kernel_exact import STATE_PASSING_SECONDS_PER_STATE
from harness.checks.runner import run_selected
from harness.checks.tiers import (
    CPU_CASE_SECONDS,
    SECONDS_PER_BLOCK,
    cpu_estimate,
    cpu_plan,
    cpu_tier_gaps,
    cpu_tier_reason,
    gpu_default_reason,
    runs_on_cpu,
    tier_reason,
)
from tests.support import harness

# The tier's budget in blocks of one call: how large H4_CASE must be for its checks to fit but for its two costliest
# ones (about 5 calls of the case between them). Its heads follow it (even: two groups), so a refit of the constants
# keeps each case below in its role.
BUDGET_BLOCKS = CPU_CASE_SECONDS / SECONDS_PER_BLOCK
HEADS = max(2, 2 * round(BUDGET_BLOCKS / 40))
# Two sequences of 40 new tokens over HEADS heads, each crossing a 64-token chunk boundary: 4 chunks x HEADS heads =
# BLOCKS blocks, one call BLOCKS x SECONDS_PER_BLOCK. Its checks share the call on path auto (the case's) and the
# snapshot call; all but autotune_idempotent and every_config fit in the case budget (CPU_CASE_SECONDS).
BLOCKS = 4 * HEADS
H4_CASE = f"""\
schema: ssd-case/1
id: h4-two-sequences
seed: 3
shape: {{nheads: {HEADS}, headdim: 16, dstate: 64, ngroups: 2, chunk_size: 64}}
dtype: {{io: float16, state: float32}}
sequences:
  - {{context: 50, tokens: 40, init_slot: 0, has_state: true, final_slot: 1}}
  - {{context: 30, tokens: 40, init_slot: 2, has_state: true, final_slot: 3}}
cache: {{slots: 5}}
"""
CALL = BLOCKS * SECONDS_PER_BLOCK  # seconds of one call of H4_CASE
STATE_PASSING = STATE_PASSING_SECONDS_PER_STATE * 4 * HEADS * 16 * 64  # 4 chunks of H x P x N states
# What the tier runs of H4_CASE, in collection order, and what each costs in calls (a shared call charged to the
# first check making it: auto_vs_snapshot makes the snapshot call and the auto call, which is the case's own).
H4_RUNS = {"auto_vs_snapshot": 2.3, "untouched_storage": 0, "readonly_inputs": 0, "determinism": 1.0,
           "returned_shapes": 0, "reference_bound": 0, "state_passing_exact": STATE_PASSING / CALL,
           "gather_exact": 0.02}


def _load(tmp_path: Path, text: str, folder: str = "cases") -> tuple[Path, object]:
    path = tmp_path / folder / "case.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    (case,) = load_case_file(path)
    return path, case


def test_blocks_count_chunks_heads_and_the_block_sizes(tmp_path):
    _, case = _load(tmp_path, H4_CASE)
    assert case.cpu_blocks() == 4 * HEADS
    wide = replace(case, shape=replace(case.shape, chunk_size=256, dstate=256))  # 2 chunks of 4 x 2 blocks
    assert wide.cpu_blocks() == 2 * HEADS * (256 // 64) * (256 // 128)
    narrow = replace(case, shape=replace(case.shape, chunk_size=16, dstate=16))  # one block per small chunk
    assert narrow.cpu_blocks() == 7 * HEADS  # 14+16+10 and 2+16+16+6 tokens


def test_the_estimate_charges_each_shared_call_once_to_the_first_check_making_it(tmp_path):
    _, case = _load(tmp_path, H4_CASE)
    plan = cpu_plan(case)
    assert list(plan.seconds) == [name for name, _ in selected_checks(case)]
    for name, calls in H4_RUNS.items():
        assert cpu_estimate(case, name) == pytest.approx(calls * CALL), name
    assert plan.spent == pytest.approx(sum(H4_RUNS.values()) * CALL) and plan.spent <= CPU_CASE_SECONDS
    # Skipped: costed on top of what runs (its own calls; it shares none).
    assert cpu_estimate(case, "autotune_idempotent") == pytest.approx(get_check("autotune_idempotent").cpu_calls * CALL)
    # Alone, a check pays for the shared calls it reads.
    snapshot_path = replace(case, call=replace(case.call, path="snapshot"), checks=("readonly_inputs",))
    assert cpu_estimate(snapshot_path, "readonly_inputs") == pytest.approx(CALL)


def test_a_case_beyond_the_limit_runs_its_cheapest_items(tmp_path):
    path, case = _load(tmp_path, H4_CASE)
    assert case.tiers == Tiers()
    assert cpu_plan(case).runs == set(H4_RUNS)
    assert all(runs_on_cpu(case, name) for name in H4_RUNS)
    reason = cpu_tier_reason(case, "autotune_idempotent")
    total = (sum(H4_RUNS.values()) + get_check("autotune_idempotent").cpu_calls) * CALL
    assert reason == (
        f"beyond the CPU interpreter tier: autotune_idempotent would bring the case's estimated interpreter time to "
        f"{total:.1f} s > {CPU_CASE_SECONDS:g} s per case ({BLOCKS} blocks = 4 chunks x {HEADS} heads x 1 x 1, "
        f"blocks of 64 chunk rows and 128 state columns, {SECONDS_PER_BLOCK} s per block and call; the tier runs its "
        f"cheaper items: {', '.join(H4_RUNS)}); tiers: {{cpu: true}} in {path} runs it there anyway; runs on the GPU "
        "tier")


def test_a_large_case_runs_the_checks_that_read_its_one_call(tmp_path):
    """Cheapest first: the stage checks, then the one call on the case's path with every check that only reads it;
    a second call (determinism's, the snapshot path's) no longer fits."""
    _, case = _load(tmp_path, H4_CASE.replace("tokens: 40", "tokens: 300"))  # 12 chunks x HEADS heads
    assert case.cpu_blocks() == 12 * HEADS
    assert cpu_plan(case).runs == {"untouched_storage", "readonly_inputs", "returned_shapes", "reference_bound",
                                   "state_passing_exact", "gather_exact"}


def test_a_small_case_runs_every_item(tmp_path):
    _, case = _load(tmp_path, H4_CASE.replace("context: 50", "context: 0").replace("context: 30", "context: 0")
                    .replace(f"nheads: {HEADS}", "nheads: 2"))
    assert case.cpu_blocks() == 4  # 2 chunks x 2 heads
    assert all(runs_on_cpu(case, name) for name, _ in selected_checks(case))
    plan = cpu_plan(case)  # the costliest item runs too: the whole case fits
    assert max(plan.seconds, key=plan.seconds.get) == "every_config" and plan.spent <= CPU_CASE_SECONDS


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
    beyond = ["sequence_independence", "autotune_idempotent", "every_config"]
    every = (sum(H4_RUNS.values()) + sum(get_check(n).cpu_calls for n in beyond)) * CALL
    assert cpu_tier_gaps(case) == (beyond,
                                   f"{BLOCKS} blocks: all its checks are estimated at {every:.1f} s > "
                                   f"{CPU_CASE_SECONDS:g} s per case; the others take {cpu_plan(case).spent:.1f} s")


def test_validate_warns_about_a_regression_the_cpu_tier_skips(tmp_path):
    path, case = _load(tmp_path, H4_CASE, folder="cases/regressions")
    proc = harness("validate", str(tmp_path / "cases"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _, why = cpu_tier_gaps(case)
    assert (f"warning: {path}: h4-two-sequences: the CPU tier skips sequence_independence, autotune_idempotent, "
            f"every_config ({why}), so CI runs them only on the nightly GPU run, not on every change; add tiers: "
            f"{{cpu: true}} to the case to run them on the CPU tier too") in proc.stdout
    assert "ok: 1 cases in 1 files, 1 warning(s)" in proc.stdout


def test_validate_is_quiet_about_forced_regressions_and_about_the_corpus(tmp_path):
    _load(tmp_path, H4_CASE + "tiers: {cpu: true}\n", folder="cases/regressions")
    _load(tmp_path, H4_CASE.replace("h4-two-sequences", "h4-corpus"), folder="cases/corpus")
    proc = harness("validate", str(tmp_path / "cases"))
    assert proc.returncode == 0 and "warning" not in proc.stdout, proc.stdout
    assert "ok: 2 cases in 2 files\n" in proc.stdout


REPO = Path(__file__).resolve().parents[1]
SERVING_SHAPES = REPO / "cases" / "regressions" / "every-config-serving-shapes.yaml"


def test_every_config_runs_on_the_gpu_only_when_named(tmp_path):
    """Each config every_config forces is a binary of its own on the GPU: a run that does not name it (--check, or
    the case's checks: list) skips its GPU items with a reason saying why and how to run it; every other check of
    the case runs there, and naming it runs it."""
    _, case = _load(tmp_path, H4_CASE)
    assert case.checks == ("all",) and "every_config" in [n for n, _ in selected_checks(case)]
    reason = tier_reason(case, "every_config", "cuda")
    assert reason == gpu_default_reason(case, "every_config") == (
        f"not run by default on the GPU: {get_check('every_config').gpu_when_named}; --check every_config runs it "
        "(pytest or python -m harness run), as does a case whose checks: list names it")
    assert "binary of its own to compile" in reason and "scripts/gpu_run.sh every-config" in reason
    assert [n for n, _ in selected_checks(case) if tier_reason(case, n, "cuda")] == ["every_config"]
    assert tier_reason(case, "every_config", "cuda", ["every_config"]) == ""
    assert tier_reason(case, "every_config", "cuda", ["reference_bound"]) == reason  # named: another check only


def test_a_case_naming_every_config_runs_it_on_the_gpu_by_default():
    cases = load_case_file(SERVING_SHAPES)
    assert cases and all(c.checks == ("every_config",) for c in cases)
    assert all(tier_reason(c, "every_config", "cuda") == "" for c in cases)


def test_naming_every_config_leaves_the_cpu_tier_to_its_cost_model(tmp_path):
    """Under the interpreter the tier's estimate decides, named or not: every_config runs on a small case and is
    skipped with the tier's reason on one beyond the limit."""
    _, small = _load(tmp_path, H4_CASE.replace("context: 50", "context: 0").replace("context: 30", "context: 0")
                     .replace(f"nheads: {HEADS}", "nheads: 2"))
    assert tier_reason(small, "every_config", "cpu") == ""
    assert tier_reason(small, "every_config", "cpu", ["every_config"]) == ""
    _, big = _load(tmp_path, H4_CASE)
    for named in (None, ["every_config"]):
        assert tier_reason(big, "every_config", "cpu", named) == cpu_tier_reason(big, "every_config") != ""


class _Runner:
    def __init__(self):
        self.ran = []

    def run(self, case, check, *, repro_device=None):
        self.ran.append(check)
        return SimpleNamespace(status=Status.PASSED, check=check)


def test_the_front_ends_skip_an_unnamed_every_config_on_the_gpu_without_reaching_the_provider(tmp_path):
    """``run_selected`` is what ``python -m harness run`` and ``repro`` run each item through: on the GPU an unnamed
    every_config is SKIPPED with the tier's reason and its repro line, and never reaches the provider's process;
    named, it runs, as every other check does."""
    _, case = _load(tmp_path, H4_CASE)
    runner = _Runner()
    skipped = run_selected(runner, case, "every_config", device="cuda", named=None, repro_device="cuda")
    assert skipped.status is Status.SKIPPED and skipped.reason == tier_reason(case, "every_config", "cuda")
    assert skipped.repro.endswith("--check every_config --case h4-two-sequences --device cuda"), skipped.repro
    assert runner.ran == []
    run_selected(runner, case, "every_config", device="cuda", named=["every_config"])
    run_selected(runner, case, "reference_bound", device="cuda", named=None)
    assert runner.ran == ["every_config", "reference_bound"]


def test_a_check_after_the_others_takes_no_item_off_the_tier():
    """Over the corpus: with ``sequence_independence`` (``cpu_after_others``) selected, the tier runs exactly the
    items it runs without it, and the new check only where a case has budget left."""
    added = 0
    for case in load_cases(sorted((REPO / "cases").rglob("*.yaml"))):
        names = [name for name, _ in selected_checks(case)]
        if "sequence_independence" not in names:
            continue
        without = replace(case, checks=tuple(n for n in names if n != "sequence_independence"))
        runs = cpu_plan(case).runs
        assert runs - {"sequence_independence"} == cpu_plan(without).runs, case.id
        added += "sequence_independence" in runs
    assert added > 0
