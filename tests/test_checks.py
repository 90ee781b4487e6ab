"""The checks registry: every check passes on working providers and catches the breakage it exists for.

Runs in-process on the session's device (the Triton interpreter on CPU). Each broken provider of
``tests.broken_providers`` must make its check fail with a report that names what differed, the case and the repro.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from harness.cases.model import Expect, Tiers
from harness.checks import (
    CheckContext,
    Status,
    check_names,
    get_check,
    load_provider,
    run_check,
    selected_checks,
)
from harness.compare import int_view
from tests import broken_providers as bp

EXPECTED_CHECKS = {
    "indexed_vs_snapshot", "auto_vs_snapshot", "untouched_storage", "masked_state", "readonly_inputs",
    "returned_shapes", "determinism", "reference_bound", "state_passing_exact", "gather_exact", "autotune_idempotent",
    "every_config", "sequence_independence",
}


@pytest.fixture(scope="module")
def kernels_provider():
    return load_provider("kernels:provider")


@pytest.fixture(scope="module")
def reference_provider():
    return load_provider("reference:provider")


def test_registry_holds_every_design_check():
    assert set(check_names()) == EXPECTED_CHECKS


@pytest.mark.parametrize("case_id", ["tiny-direct", "tiny-batch", "tiny-returned"])
def test_kernels_pass_every_applicable_check(tiny_cases, kernels_provider, device, case_id):
    case = tiny_cases[case_id]
    for name, _ in selected_checks(case):
        result = run_check(case, name, kernels_provider, device=device)
        assert result.status is Status.PASSED, result.message or result.reason


def test_indexed_workspace_is_compared(tiny_cases, kernels_provider, device):
    result = run_check(tiny_cases["tiny-direct"], "indexed_vs_snapshot", kernels_provider, device=device)
    assert result.status is Status.PASSED and result.stats["workspace"] == "compared", result.stats


@pytest.mark.parametrize("provider_name", sorted(bp.CAUGHT_BY))
def test_broken_provider_is_caught(tiny_cases, device, provider_name):
    check, case_id = bp.CAUGHT_BY[provider_name]
    broken = type(bp.BROKEN[provider_name])()  # a fresh instance (call counters start at zero)
    result = run_check(tiny_cases[case_id], check, broken, device=device,
                       provider_spec=f"tests.broken_providers:{provider_name}")
    assert result.status is Status.FAILED, f"{broken.breakage}: {check} gave {result.status} {result.reason}"
    assert result.summary and result.summary in result.message
    assert tiny_cases[case_id].summary() in result.message
    assert (f"repro: python -m harness repro {tiny_cases[case_id].source} --check {check} --case {case_id} "
            f"--provider tests.broken_providers:{provider_name}") in result.message


class _LyingWorkspace:
    """Indexed path right, but the entering-state workspace it reports is off by one ulp in one element."""

    name = "lying-workspace"
    supported_paths = frozenset({"snapshot", "indexed"})

    def __init__(self, inner):
        self.inner = inner

    def ssd_prefill(self, *args, workspace_out=None, **kwargs):
        result = self.inner.ssd_prefill(*args, workspace_out=workspace_out, **kwargs)
        if workspace_out is not None and workspace_out.get("path") == "indexed":
            states = workspace_out["states"]
            flat = states.view(-1)[5:6]
            flat.copy_((int_view(flat) + 1).view(states.dtype))
        return result


def test_indexed_workspace_mismatch_is_caught(tiny_cases, kernels_provider, device):
    lying = _LyingWorkspace(kernels_provider)
    result = run_check(tiny_cases["tiny-direct"], "indexed_vs_snapshot", lying, device=device)
    assert result.status is Status.FAILED and "entering-state workspace" in result.summary, result.message


def test_missing_path_is_unsupported_never_passed(tiny_cases, reference_provider, device):
    result = run_check(tiny_cases["tiny-direct"], "indexed_vs_snapshot", reference_provider, device=device,
                       provider_spec="reference:provider")
    assert result.status is Status.UNSUPPORTED
    assert "lacks the indexed path" in result.reason


def test_xfail_is_honoured_and_a_stale_xfail_is_a_strict_xpass(tiny_cases, device):
    case = replace(tiny_cases["tiny-batch"], expect=Expect("xfail", "issue 7: readonly inputs clobbered"))
    caught = run_check(case, "readonly_inputs", bp.MutatesInput(), device=device)
    assert caught.status is Status.XFAILED and "issue 7" in caught.reason
    stale = run_check(case, "readonly_inputs", load_provider("kernels:provider"), device=device)
    assert stale.status is Status.XPASSED and stale.status.is_failure
    assert "XPASS(strict)" in stale.message and "repro:" in stale.message


def test_an_xfail_for_named_providers_leaves_the_others_strict(tiny_cases, device):
    """The provider under test is named by its spec (``provider_spec``): an xfail naming another provider changes
    nothing, so a failure stays a failure; one naming it turns a pass into a strict XPASS; a process that died
    (``fault_result``) is judged the same way, when the xfail names its kind (``test_hostile_checks``: when not)."""
    from harness.checks.runner import fault_result

    case = replace(tiny_cases["tiny-batch"], expect=Expect("xfail", "theirs clobbers x", ("theirs:provider",)))
    caught = run_check(case, "readonly_inputs", bp.MutatesInput(), device=device, provider_spec="theirs:provider")
    assert caught.status is Status.XFAILED and caught.reason == ("expected failure with --provider "
                                                                 "theirs:provider: theirs clobbers x"), caught.reason
    ours_broken = run_check(case, "readonly_inputs", bp.MutatesInput(), device=device)
    assert ours_broken.status is Status.FAILED
    ours = run_check(case, "readonly_inputs", load_provider("kernels:provider"), device=device)
    assert ours.status is Status.PASSED
    listed = replace(case, expect=Expect("xfail", "theirs clobbers x", ("theirs:provider", "kernels:provider")))
    stale = run_check(listed, "readonly_inputs", load_provider("kernels:provider"), device=device)
    assert stale.status is Status.XPASSED and "remove kernels:provider from expect.providers" in stale.message
    dies = replace(case, expect=replace(case.expect, fails_with=("exit",)))
    assert fault_result(dies, "readonly_inputs", "died", fault="exit").status is Status.ERROR
    assert fault_result(dies, "readonly_inputs", "died", fault="exit",
                        provider_spec="theirs:provider").status is Status.XFAILED


def test_provider_crash_is_an_error_with_traceback(tiny_cases, device):
    class Crashes:
        name = "crashes"

        def ssd_prefill(self, *args, **kwargs):
            raise RuntimeError("kernel launch failed")

    result = run_check(tiny_cases["tiny-direct"], "determinism", Crashes(), device=device)
    assert result.status is Status.ERROR and result.status.is_failure
    assert "kernel launch failed" in result.summary and "Traceback" in result.message


class _CountingCalls:
    """Our kernels, counting calls per path; ``fail_first`` calls raise first."""

    name = "counting"

    def __init__(self, inner, fail_first: int = 0):
        self.inner, self.fail_first, self.calls = inner, fail_first, []
        self.supported_paths = inner.supported_paths

    def ssd_prefill(self, **kwargs):
        self.calls.append(kwargs["path"])
        if len(self.calls) <= self.fail_first:
            raise RuntimeError(f"call {len(self.calls)} fails")
        return self.inner.ssd_prefill(**kwargs)


def test_the_checks_of_a_case_share_the_calls_they_make_identically(tiny_cases, kernels_provider, device):
    """One context per case (as the front ends keep it): the call on the case's inputs and path is made once for
    untouched_storage, readonly_inputs, returned_shapes, reference_bound, determinism's first call and masked_state's
    as-built call; determinism's second call, masked_state's zeroed call and sequence_independence's two poisoned
    calls are their own. tiny-batch is not indexed-eligible: auto_vs_snapshot adds the snapshot call and the refused
    indexed one."""
    case = tiny_cases["tiny-batch"]  # path: auto
    provider = _CountingCalls(kernels_provider)
    ctx = CheckContext(case, provider, device)
    stage_level = {"autotune_idempotent", "state_passing_exact", "gather_exact"}  # no plain ssd_prefill calls
    stage_level.add("every_config")  # its calls are its own: one per forced config, each under other configs
    names = [name for name, _ in selected_checks(case) if name not in stage_level]
    for name in names:
        result = run_check(case, name, provider, device=device, context=ctx)
        assert result.status is Status.PASSED, (name, result.message or result.reason)
    assert sorted(provider.calls) == ["auto"] * 5 + ["indexed", "snapshot"], provider.calls
    # Without the shared context each check makes its own calls.
    alone = _CountingCalls(kernels_provider)
    for name in names:
        run_check(case, name, alone, device=device)
    assert len(alone.calls) == 14, alone.calls


@pytest.mark.parametrize("case_id", ["tiny-direct", "tiny-batch"])
def test_each_check_declares_the_shared_calls_it_reads(tiny_cases, kernels_provider, device, case_id):
    """``Check.shared_calls`` is what the CPU tier's estimate charges: it must be what the check really reads."""
    from harness.checks.tiers import shared_paths

    case = tiny_cases[case_id]
    for name, _ in selected_checks(case):
        ctx = CheckContext(case, kernels_provider, device)
        run_check(case, name, kernels_provider, device=device, context=ctx)
        assert set(ctx.shared_calls) == shared_paths(case, name), name


def test_a_shared_call_that_raised_is_made_again_by_the_next_check(tiny_cases, kernels_provider, device):
    case = tiny_cases["tiny-direct"]
    provider = _CountingCalls(kernels_provider, fail_first=1)
    ctx = CheckContext(case, provider, device)
    first = run_check(case, "untouched_storage", provider, device=device, context=ctx)
    assert first.status is Status.ERROR and "call 1 fails" in first.summary
    second = run_check(case, "readonly_inputs", provider, device=device, context=ctx)
    assert second.status is Status.PASSED, second.message
    assert len(provider.calls) == 2


def test_cpu_tier_skip_carries_a_reason(tiny_cases, kernels_provider):
    big = replace(tiny_cases["tiny-direct"], tiers=Tiers(cpu=False))
    result = run_check(big, "determinism", kernels_provider, device="cpu")
    assert result.status is Status.SKIPPED and "tiers.cpu is false" in result.reason
    # Decided from the case and the check alone, before the provider's paths (as pytest decides it, at collection).
    unsupported_there = run_check(big, "indexed_vs_snapshot", load_provider("reference:provider"), device="cpu")
    assert unsupported_there.status is Status.SKIPPED and "tiers.cpu is false" in unsupported_there.reason


def test_all_expands_to_case_applicable_checks_and_explicit_names_are_kept(tiny_cases):
    direct = [n for n, _ in selected_checks(tiny_cases["tiny-direct"])]
    assert "masked_state" not in direct and "indexed_vs_snapshot" in direct  # no masked sequence; eligible
    batch = [n for n, _ in selected_checks(tiny_cases["tiny-batch"])]
    assert "masked_state" in batch and "indexed_vs_snapshot" not in batch
    explicit = replace(tiny_cases["tiny-direct"], checks=("masked_state",))
    assert selected_checks(explicit) == [("masked_state", True)]
    ok, reason = get_check("masked_state").applies(explicit, load_provider("reference:provider"))
    assert not ok and "has_state: true" in reason
    with pytest.raises(ValueError, match="unknown"):
        selected_checks(replace(tiny_cases["tiny-direct"], checks=("no_such_check",)))


def test_untouched_storage_sees_a_byte_before_the_offset(tiny_cases, kernels_provider, device):
    class WritesBeforeOffset:
        name = "writes-before-offset"
        supported_paths = kernels_provider.supported_paths

        def ssd_prefill(self, *args, state_cache, **kwargs):
            result = kernels_provider.ssd_prefill(*args, state_cache=state_cache, **kwargs)
            base = torch.empty(0, dtype=state_cache.dtype, device=state_cache.device).set_(
                state_cache.untyped_storage())
            base[0] = 0.0  # storage element 0 lies before the cache's storage offset
            return result

    case = tiny_cases["tiny-direct"]
    assert case.cache.offset > 0
    result = run_check(case, "untouched_storage", WritesBeforeOffset(), device=device)
    assert result.status is Status.FAILED and "at (0,)" in result.message, result.message


def test_untouched_storage_sees_a_padded_sequence_stored_before_slot_0(tiny_cases, kernels_provider, device):
    """A provider that stores a padded sequence's final state at ``slot * stride(0)`` (what vLLM 0.33 does) writes
    before slot 0. With no offset that row would lie outside the storage; the builder's guard puts it inside, so
    the check sees the store instead of missing it."""

    class StoresPaddedRows:
        name = "stores-padded-rows"
        supported_paths = kernels_provider.supported_paths

        def ssd_prefill(self, *args, state_cache, final_state_indices=None, **kwargs):
            result = kernels_provider.ssd_prefill(*args, state_cache=state_cache,
                                                  final_state_indices=final_state_indices, **kwargs)
            base = torch.empty(0, dtype=state_cache.dtype, device=state_cache.device).set_(
                state_cache.untyped_storage())
            for slot in final_state_indices.tolist():
                start = state_cache.storage_offset() + slot * state_cache.stride(0)
                if slot < 0:
                    assert start >= 0, "the row before slot 0 is outside the storage"
                    base[start : start + state_cache[0].numel()] = 1.0
            return result

    batch = tiny_cases["tiny-batch"]
    padded = replace(batch, sequences=(batch.sequences[0], replace(batch.sequences[1], final_slot=-1)),
                     cache=replace(batch.cache, offset=0))
    assert padded.cache_guard() > 0
    assert run_check(padded, "untouched_storage", kernels_provider, device=device).status is Status.PASSED
    result = run_check(padded, "untouched_storage", StoresPaddedRows(), device=device)
    assert result.status is Status.FAILED and "elements differ" in result.message, result.message
