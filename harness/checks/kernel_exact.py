"""Stage-level exact checks (docs/checks.md), for any provider that offers the stage hooks they need
(``provider.stages``, docs/provider.md#optional-hooks; each hook has docs/architecture.md's stage contract): state
passing teacher-forced on the reference's dA_cumsum and chunk states vs ``reference.chunked.state_passing`` under
the device's arithmetic profile, and the snapshot gather vs the ``torch.where`` snapshot. A provider without the
hook a check needs is unsupported by it, never passed."""

from __future__ import annotations

import torch

from harness.cases.model import count_chunks
from harness.checks.base import Check
from harness.checks.hooks import stage_hook
from harness.checks.paths import eligibility
from harness.checks.registry import register
from harness.compare import assert_bits_equal, assert_storage_equal, storage_bytes
from kernels.environment import arithmetic_profile


def _offers(name: str):
    """``provider_applies``: the provider offers ``stages.<name>`` (else the unsupported reason names it)."""

    def applies(provider, provider_spec: str) -> tuple[bool, str]:
        fn, reason = stage_hook(provider, name)
        return fn is not None, reason

    return applies


def _teacher_inputs(inputs, profile: str):
    """dA_cumsum (H,C,Q) and chunk states (C,H,P,N), fp32, for these inputs: the reference's stages under the
    device's profile (any valid inputs teacher-force state passing; these are the case's own)."""
    from reference import chunked

    o = inputs.case.options
    dA_cumsum, dt_out = chunked.chunk_cumsum(
        inputs.dt, inputs.A, inputs.case.shape.chunk_size, inputs.cu_chunk_seqlens,
        dt_bias=inputs.dt_bias, dt_softplus=o.dt_softplus, dt_limit=o.dt_limit, profile=profile,
    )
    return dA_cumsum, chunked.chunk_state(inputs.B, inputs.x, dt_out, dA_cumsum, inputs.cu_chunk_seqlens,
                                          profile=profile)


def _state_passing_exact(ctx) -> dict:
    from reference import chunked, snapshot

    state_passing, _ = stage_hook(ctx.provider, "state_passing")
    profile = arithmetic_profile(ctx.device)
    kernel_in, ref_in = ctx.inputs(), ctx.inputs()
    dA_cumsum, states = _teacher_inputs(ref_in, profile)
    initial = snapshot.gather_initial_states(
        ref_in.state_cache, ref_in.initial_state_indices, ref_in.has_initial_states
    )
    out_dtype = ref_in.state_cache.dtype
    direct = ctx.case.call.final_state == "direct"

    def writeback(inp) -> dict:
        if not direct:
            return {}
        return dict(state_cache=inp.state_cache, final_state_indices=inp.final_state_indices,
                    last_chunk_indices=inp.last_chunk_indices)

    # The provider's stage gets copies: one that wrote into its inputs must not change the reference's.
    got = state_passing(states.clone(), dA_cumsum.clone(), kernel_in.seq_idx, initial_states=initial.clone(),
                        out_dtype=out_dtype, profile=profile, **writeback(kernel_in))
    ref = chunked.state_passing(states, dA_cumsum, ref_in.seq_idx, initial_states=initial, out_dtype=out_dtype,
                                profile=profile, **writeback(ref_in))
    assert_bits_equal(got, ref.exiting, what=f"state_passing exiting states (provider vs reference, profile {profile})")
    assert_storage_equal(kernel_in.cache_base, storage_bytes(ref_in.cache_base),
                         what="cache storage after state_passing writeback (provider vs reference)")
    compared, not_compared = ["exiting states", "cache storage"], []
    state_passing_indexed, missing = stage_hook(ctx.provider, "state_passing_indexed")
    if eligibility(ctx.case)[0] and state_passing_indexed is None:
        not_compared.append(f"indexed entering states and cache storage: {missing}")
    elif eligibility(ctx.case)[0]:
        idx_in = ctx.inputs()
        entering = torch.empty_like(ref.entering)
        state_passing_indexed(
            states.clone(), dA_cumsum.clone(), state_cache=idx_in.state_cache,
            init_slot_index=idx_in.initial_state_indices[:1], has_initial_state=idx_in.has_initial_states[:1],
            final_slot_index=idx_in.final_state_indices[:1], out=entering,
        )
        assert_bits_equal(entering, ref.entering,
                          what="state_passing_indexed entering states (provider vs reference)")
        assert_storage_equal(idx_in.cache_base, storage_bytes(ref_in.cache_base),
                             what="cache storage after indexed state passing (provider vs reference)")
        compared += ["indexed entering states", "indexed cache storage"]
    stats = {"profile": profile, "compared": compared}
    if not_compared:
        stats["not compared"] = not_compared
    return stats


def _gather_exact(ctx) -> dict:
    from reference import snapshot

    gather_initial_states, _ = stage_hook(ctx.provider, "gather_initial_states")
    inputs = ctx.inputs()
    got = gather_initial_states(inputs.state_cache, inputs.initial_state_indices, inputs.has_initial_states)
    want = snapshot.gather_initial_states(inputs.state_cache, inputs.initial_state_indices, inputs.has_initial_states)
    assert_bits_equal(got, want, what="provider's stages.gather_initial_states vs torch.where snapshot")
    assert_storage_equal(inputs.cache_base, storage_bytes(ctx.inputs().cache_base),
                         what="cache storage after the gather (it only reads)")
    return {"rows": int(got.shape[0])}


# Interpreter seconds per state element of every chunk (measured, docs/checks.md#tiers): the state-passing kernel
# walks each chunk's H x P x N states in fixed blocks, whatever the chunk size.
STATE_PASSING_SECONDS_PER_STATE = 4.4e-7


def _state_passing_seconds(case) -> float:
    return STATE_PASSING_SECONDS_PER_STATE * count_chunks(case.shape.chunk_size, case.sequences) * \
        case.shape.state_elements


register(
    Check(
        name="state_passing_exact",
        doc="stages.state_passing (and stages.state_passing_indexed) teacher-forced == reference.chunked."
            "state_passing (bits)",
        run=_state_passing_exact,
        needs_paths=frozenset(),
        provider_applies=_offers("state_passing"),
        cpu_seconds=_state_passing_seconds,
    )
)
register(
    Check(
        name="gather_exact",
        doc="stages.gather_initial_states == reference torch.where snapshot (bits)",
        run=_gather_exact,
        needs_paths=frozenset(),
        provider_applies=_offers("gather_initial_states"),
        cpu_calls=0.02,
    )
)
