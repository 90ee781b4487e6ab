"""Stage-level exact checks through the provider's optional ``stages`` hooks (docs/provider.md#optional-hooks): they
run for any provider that offers the hook, catch a broken one, and are unsupported (never passed) without it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.checks import Status, load_provider, run_check
from harness.checks.hooks import STAGE_HOOKS, stage_hook
from harness.compare import int_view


@pytest.fixture(scope="module")
def ours():
    return load_provider("kernels:provider")


def index_select_gather(state_cache, initial_state_indices, has_initial_states):
    """Another engine's gather with the stage contract: index_select of every slot read, then a select by mask."""
    has = has_initial_states.to(torch.bool)
    rows = state_cache.index_select(0, torch.where(has, initial_state_indices.long(), 0))
    return torch.where(has[:, None, None, None], rows, torch.zeros((), dtype=rows.dtype, device=rows.device))


class Foreign:
    """A provider that is not ours (the reference computes its calls), with the stage hooks given."""

    def __init__(self, **stages):
        self.name = "foreign-stages"
        self.supported_paths = frozenset({"snapshot"})
        self.stages = SimpleNamespace(**stages) if stages else None
        self._reference = load_provider("reference:provider")

    def ssd_prefill(self, *args, **kwargs):
        return self._reference.ssd_prefill(*args, **kwargs)


def flip_one_bit(t: torch.Tensor, index: int = 3) -> None:
    flat = t.reshape(-1)[index:index + 1]
    flat.copy_((int_view(flat) ^ 1).view(t.dtype))


def test_our_provider_offers_every_stage_hook(ours):
    assert all(stage_hook(ours, name)[0] is not None for name in STAGE_HOOKS)


@pytest.mark.parametrize("case_id", ["tiny-direct", "tiny-batch", "tiny-returned"])
def test_stage_checks_pass_on_our_provider(tiny_cases, ours, device, case_id):
    for check in ("state_passing_exact", "gather_exact"):
        result = run_check(tiny_cases[case_id], check, ours, device=device)
        assert result.status is Status.PASSED, (check, result.reason, result.message)
    indexed = run_check(tiny_cases["tiny-direct"], "state_passing_exact", ours, device=device)
    assert "indexed entering states" in indexed.stats["compared"], indexed.stats


def test_stage_checks_run_through_a_foreign_providers_hooks(tiny_cases, ours, device):
    """Hooks are looked up on whatever provider is under test: here a foreign one whose gather is its own code and
    whose state passing is our kernel; it offers no indexed twin, which the stats say instead of passing it."""
    foreign = Foreign(state_passing=ours.stages.state_passing, gather_initial_states=index_select_gather)
    gather = run_check(tiny_cases["tiny-batch"], "gather_exact", foreign, device=device)
    assert gather.status is Status.PASSED and gather.stats["rows"] == 2, gather.message
    passing = run_check(tiny_cases["tiny-direct"], "state_passing_exact", foreign, device=device)
    assert passing.status is Status.PASSED, passing.message
    assert passing.stats["compared"] == ["exiting states", "cache storage"], passing.stats
    assert "lacks stage hook stages.state_passing_indexed" in passing.stats["not compared"][0], passing.stats


def test_a_gather_hook_that_ignores_the_mask_is_caught(tiny_cases, device):
    def unmasked(state_cache, indices, has):
        return state_cache[indices.long()].clone()

    result = run_check(tiny_cases["tiny-batch"], "gather_exact", Foreign(gather_initial_states=unmasked), device=device)
    assert result.status is Status.FAILED and "stages.gather_initial_states" in result.summary, result.message


def test_a_gather_hook_that_writes_the_cache_is_caught(tiny_cases, device):
    def clobbers(state_cache, indices, has):
        out = index_select_gather(state_cache, indices, has)
        state_cache[indices.long()[0]].zero_()  # a "consumed" slot
        return out

    result = run_check(tiny_cases["tiny-batch"], "gather_exact", Foreign(gather_initial_states=clobbers), device=device)
    assert result.status is Status.FAILED and "it only reads" in result.summary, result.message


def test_a_state_passing_hook_one_bit_off_is_caught(tiny_cases, ours, device):
    def off_by_one_bit(*args, **kwargs):
        out = ours.stages.state_passing(*args, **kwargs)
        flip_one_bit(out)
        return out

    result = run_check(tiny_cases["tiny-batch"], "state_passing_exact", Foreign(state_passing=off_by_one_bit),
                       device=device)
    assert result.status is Status.FAILED and "exiting states" in result.summary, result.message


def test_a_state_passing_hook_that_skips_the_writeback_is_caught(tiny_cases, ours, device):
    def no_writeback(*args, state_cache=None, final_state_indices=None, **kwargs):
        return ours.stages.state_passing(*args, **kwargs)

    foreign = Foreign(state_passing=no_writeback)
    result = run_check(tiny_cases["tiny-batch"], "state_passing_exact", foreign, device=device)
    assert result.status is Status.FAILED and "cache storage" in result.summary, result.message


def test_a_broken_indexed_twin_is_caught(tiny_cases, ours, device):
    def entering_one_bit_off(*args, out, **kwargs):
        ours.stages.state_passing_indexed(*args, out=out, **kwargs)
        flip_one_bit(out)

    broken = Foreign(state_passing=ours.stages.state_passing, state_passing_indexed=entering_one_bit_off)
    result = run_check(tiny_cases["tiny-direct"], "state_passing_exact", broken, device=device)
    assert result.status is Status.FAILED and "state_passing_indexed entering states" in result.summary, result.message


@pytest.mark.parametrize("check, hook", [("state_passing_exact", "state_passing"),
                                         ("gather_exact", "gather_initial_states")])
def test_absent_hooks_are_unsupported_never_passed(tiny_cases, ours, device, check, hook):
    for provider in (Foreign(), Foreign(**{other: ours.stages.state_passing for other in STAGE_HOOKS
                                           if other != hook}), load_provider("reference:provider")):
        result = run_check(tiny_cases["tiny-direct"], check, provider, device=device)
        assert result.status is Status.UNSUPPORTED, (provider, result.status, result.message)
        assert result.reason.startswith(f"unsupported: provider {provider.name!r} lacks stage hook stages.{hook}"), \
            result.reason
