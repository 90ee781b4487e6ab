"""Path equivalence: the indexed path and ``auto`` must give the snapshot path's bits (docs/checks.md)."""

from __future__ import annotations

import torch

from harness.checks.base import Check
from harness.checks.calls import WORKSPACE_KWARG, assert_calls_equal, shared_call
from harness.checks.registry import register
from harness.compare import Mismatch, assert_bits_equal, assert_storage_equal, storage_bytes


def eligibility(case) -> tuple[bool, str]:
    """``case.indexed_eligible()`` as (eligible, reason when not)."""
    answer = case.indexed_eligible()
    return bool(answer), str(getattr(answer, "reason", "") or "")


def _snapshot_entering_states(snapshot_exiting: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    """Entering state of each chunk of one sequence: the initial state, then the previous chunk's exiting state.

    snapshot_exiting: (C,H,P,N); initial: (H,P,N) in the same dtype -> (C,H,P,N)."""
    return torch.cat([initial.unsqueeze(0), snapshot_exiting[:-1]], dim=0)


def _indexed_vs_snapshot(ctx) -> dict:
    case = ctx.case
    snap = shared_call(ctx, "path=snapshot", path="snapshot")
    idx = shared_call(ctx, "path=indexed", path="indexed")
    snap_states, idx_states = snap.workspace, idx.workspace
    stats: dict = {"compared": assert_calls_equal(idx, snap)}
    if snap_states is None or idx_states is None:
        stats["workspace"] = f"not exposed by the provider (no {WORKSPACE_KWARG} keyword)"
    elif snap_states.dtype != idx_states.dtype:
        stats["workspace"] = f"not comparable: snapshot {snap_states.dtype} vs indexed {idx_states.dtype}"
    else:
        seq = case.sequences[0]
        if seq.has_state:
            initial = ctx.inputs().state_cache[seq.init_slot].to(snap_states.dtype)
        else:
            initial = torch.zeros_like(snap_states[0])
        expected = _snapshot_entering_states(snap_states, initial.to(snap_states.device))
        assert_bits_equal(idx_states, expected, what="entering-state workspace (indexed vs snapshot chunk states)")
        stats["workspace"] = "compared"
    return stats


def _auto_vs_snapshot(ctx) -> dict:
    snap = shared_call(ctx, "path=snapshot", path="snapshot")
    auto = shared_call(ctx, "path=auto", path="auto")
    stats = {"compared": assert_calls_equal(auto, snap)}
    eligible, why = eligibility(ctx.case)
    if not eligible:
        inputs = ctx.inputs()
        cache_before = storage_bytes(inputs.cache_base)
        out_before = inputs.out.clone()
        try:
            ctx.call(inputs, path="indexed")
        except ValueError as exc:
            stats["indexed_refusal"] = str(exc)
        else:
            raise Mismatch(
                f"path='indexed' on an ineligible call ({why}) returned instead of raising ValueError", count=-1
            )
        # A refused call must leave the cache and the output as they were.
        assert_storage_equal(inputs.cache_base, cache_before, what="state cache after the refused indexed call")
        assert_bits_equal(inputs.out, out_before, what="out after the refused indexed call")
    return stats


register(
    Check(
        name="indexed_vs_snapshot",
        doc="indexed path == snapshot path: out, whole cache storage, entering-state workspace (bits)",
        run=_indexed_vs_snapshot,
        case_applies=eligibility,
        needs_paths=frozenset({"snapshot", "indexed"}),
        shared_calls=('snapshot', 'indexed'),
        cpu_calls=1.0,
    )
)
register(
    Check(
        name="auto_vs_snapshot",
        doc="path=auto == path=snapshot (bits); on ineligible calls path=indexed raises ValueError and writes nothing",
        run=_auto_vs_snapshot,
        needs_paths=frozenset({"snapshot"}),
        shared_calls=('snapshot', 'auto'),
        cpu_calls=0.3,
    )
)
