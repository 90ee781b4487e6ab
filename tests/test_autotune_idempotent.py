"""``autotune_idempotent``: flags a provider's destructive autotuned kernel even when an earlier case already tuned
its key, passes idempotent ones and ours, and says so when a provider launches no autotuner (issue 16)."""

from __future__ import annotations

import pytest
from triton import knobs

from harness import triton_autotuner as tt
from harness.cases.loader import load_case_file
from harness.checks import CheckContext, Status, load_provider, run_check
from harness.guards.autotune import StorageSnapshot, call_tensors
from harness.guards.specialization import kernel_name
from tests import autotuned_providers as ap

KERNEL = ap.slot_update_kernel
CHECK = "autotune_idempotent"


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("cases") / "slot_update.yaml"
    path.write_text(ap.CASES)
    return {c.id: c for c in load_case_file(path)}


def _tune_on(case, provider, device) -> dict:
    """One plain call of ``provider`` on ``case`` (tunes the writeback's key when new); the kernel's cache after."""
    ctx = CheckContext(case, provider, device)
    ctx.call(ctx.inputs())
    return dict(KERNEL.cache)


def _autotuner_state(kernel) -> tuple:
    return dict(kernel.cache), kernel.cache_results, kernel.__dict__.get("do_bench")


def _assert_trials(result, configs: int) -> None:
    """The guard's stand-in benchmarker launches each config once, on every backend."""
    assert result.stats["trial_launches"] == configs, result.stats


def test_destructive_writeback_is_flagged_on_a_key_an_earlier_case_tuned(cases, device):
    provider = ap.SlotUpdateWriteback(reads_private_copy=False)
    tuned = _tune_on(cases["slot-update-first"], provider, device)
    assert len(tuned) == 1, tuned  # the first case tuned the writeback's key
    before, disk = _autotuner_state(KERNEL), knobs.autotuning.cache

    result = run_check(cases["slot-update-second"], CHECK, provider, device=device)

    assert result.status is Status.FAILED, (result.status, result.reason, result.message)
    assert "autotuning trials changed memory" in result.message and "storage of state_cache" in result.message
    assert kernel_name(KERNEL) in result.message and "BLOCK: 16" in result.message, result.message
    assert result.stats["autotuners"] == [kernel_name(KERNEL)], result.stats
    assert result.stats["configs_benchmarked"] == len(KERNEL.configs), result.stats  # re-tuned: every config
    _assert_trials(result, len(KERNEL.configs))
    # the rest of the process sees the autotuner and the disk-cache switch as they were
    assert _autotuner_state(KERNEL) == before and knobs.autotuning.cache == disk
    # the second case's key is the one the first case tuned: a plain call tunes nothing new
    assert _tune_on(cases["slot-update-second"], provider, device) == tuned


def test_without_retuning_the_destructive_writeback_escapes(cases, monkeypatch, device):
    """Negative control: on a key already tuned, the checks that compare calls pass the destructive provider, and
    the guard with its cache clearing switched off finds no tuning to check. Clearing is what catches it."""
    provider = ap.SlotUpdateWriteback(reads_private_copy=False)
    _tune_on(cases["slot-update-first"], provider, device)
    second = cases["slot-update-second"]
    for check in ("reference_bound", "determinism", "untouched_storage", "readonly_inputs"):
        result = run_check(second, check, provider, device=device)
        assert result.status is Status.PASSED, (check, result.message)

    # a snapshot replay without re-tuning: the call and its replay leave the same bytes
    inputs = CheckContext(second, provider, device).inputs()
    kwargs = inputs.kwargs()
    snap = StorageSnapshot.take(call_tensors(provider.ssd_prefill, (), kwargs))
    provider.ssd_prefill(**kwargs)
    first = snap.current()
    snap.restore()
    provider.ssd_prefill(**kwargs)
    assert all((a == b).all() for a, b in zip(snap.current(), first, strict=True))

    monkeypatch.setattr(tt, "forget_tuning", lambda tuner: None)  # the guard keeps the tuned key
    kept = run_check(second, CHECK, provider, device=device)
    assert kept.status is Status.SKIPPED and "none ran a tuning trial" in kept.reason, (kept.status, kept.message)
    monkeypatch.undo()
    assert run_check(second, CHECK, provider, device=device).status is Status.FAILED


def test_private_copy_writeback_is_not_flagged(cases, device):
    provider = ap.SlotUpdateWriteback(reads_private_copy=True)
    _tune_on(cases["slot-update-first"], provider, device)
    before = _autotuner_state(KERNEL)
    result = run_check(cases["slot-update-second"], CHECK, provider, device=device)
    assert result.status is Status.PASSED, result.message
    assert result.stats["autotuners"] == [kernel_name(KERNEL)], result.stats
    assert result.stats["configs_benchmarked"] == len(KERNEL.configs), result.stats
    _assert_trials(result, len(KERNEL.configs))
    assert _autotuner_state(KERNEL) == before


def test_our_provider_is_not_flagged_and_retunes_every_stage(tiny_cases, device):
    from dataclasses import replace

    provider = load_provider("kernels:provider")
    # the snapshot path (auto takes the indexed one on a GPU): its three autotuned stages
    case = replace(tiny_cases["tiny-direct"], call=replace(tiny_cases["tiny-direct"].call, path="snapshot"))
    ctx = CheckContext(case, provider, device)
    ctx.call(ctx.inputs())  # every tuning key of this call tuned before the check
    result = run_check(case, CHECK, provider, device=device)
    assert result.status is Status.PASSED, result.message
    from kernels import bmm_chunk, chunk_cumsum, chunk_scan

    stages = {kernel_name(k) for k in (bmm_chunk.bmm_chunk_kernel, chunk_scan.chunk_scan_kernel,
                                       chunk_cumsum.chunk_cumsum_kernel)}
    assert set(result.stats["autotuners"]) == stages, result.stats
    assert result.stats["trial_launches"] >= len(stages), result.stats


def test_a_config_cache_outside_tritons_autotuner_is_emptied_through_the_providers_hook(cases, device):
    """A launcher that keeps the chosen config itself (vLLM's ``launch_autotuned``) never reaches Triton's autotuner
    again for a key it tuned: the check sees no tuning unless the provider names that cache (``tuning_caches``).
    With the hook the destructive writeback is flagged on a key an earlier case tuned, the harmless one passes, and
    the cache holds what it held before."""
    hidden = ap.CachedConfigWriteback(reads_private_copy=False, offers_hook=False)
    _tune_on(cases["slot-update-first"], hidden, device)
    unseen = run_check(cases["slot-update-second"], CHECK, hidden, device=device)
    assert unseen.status is Status.SKIPPED and "launched no Triton autotuner" in unseen.reason, unseen.message

    named = ap.CachedConfigWriteback(reads_private_copy=False, offers_hook=True)
    _tune_on(cases["slot-update-first"], named, device)
    before = dict(named.configs)
    assert len(before) == 1, before
    flagged = run_check(cases["slot-update-second"], CHECK, named, device=device)
    assert flagged.status is Status.FAILED and "autotuning trials changed memory" in flagged.message, flagged.message
    assert named.configs == before

    harmless = ap.CachedConfigWriteback(reads_private_copy=True, offers_hook=True)
    _tune_on(cases["slot-update-first"], harmless, device)
    passed = run_check(cases["slot-update-second"], CHECK, harmless, device=device)
    assert passed.status is Status.PASSED, passed.message
    _assert_trials(passed, len(KERNEL.configs))


def test_a_provider_without_autotuners_is_not_passed(tiny_cases, device):
    result = run_check(tiny_cases["tiny-direct"], CHECK, load_provider("reference:provider"), device=device)
    assert result.status is Status.SKIPPED, (result.status, result.message)
    assert result.reason == "not applicable: the call launched no Triton autotuner, so there was no tuning to check"


def test_xfail_case_without_autotuners_stays_a_skip(tiny_cases, device):
    """A skip found by running is not a pass, so an expected failure does not turn it into XPASS."""
    from dataclasses import replace

    from harness.cases.model import Expect

    case = replace(tiny_cases["tiny-direct"], expect=Expect(kind="xfail", reason="demo"))
    result = run_check(case, CHECK, load_provider("reference:provider"), device=device)
    assert result.status is Status.SKIPPED, (result.status, result.message)


@pytest.mark.interpreter(reason="the stand-in benchmarker is for the interpreter")
def test_foreign_autotuners_run_under_the_interpreter(cases):
    """The writeback kernel brings no benchmarker; Triton's default needs a GPU driver, so without the stand-in that
    harness.backend.configure installs its first launch fails under the interpreter."""
    assert KERNEL._do_bench is None
    assert tt.benchmarker(KERNEL) is tt.interpreter_do_bench
    load_provider("kernels:provider")  # imports our kernels
    from kernels import chunk_scan

    assert tt.benchmarker(chunk_scan.chunk_scan_kernel) is not tt.interpreter_do_bench  # ours keep theirs


def test_unverified_triton_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(tt.triton, "__version__", "3.99.0")
    with pytest.raises(tt.UnsupportedTriton, match=r"Triton 3\.99\.0: harness/triton_autotuner\.py relies on"):
        tt.require_supported()
    monkeypatch.undo()
    monkeypatch.setattr(tt.Autotuner, "do_bench", property(lambda self: None))
    with pytest.raises(tt.UnsupportedTriton, match="lacks Autotuner.do_bench as a functools.cached_property"):
        tt.require_supported()
