"""Kernel-level exact checks of our own kernels (docs/checks.md): state passing teacher-forced on the kernels' own
chunk states and dA_cumsum vs ``reference.chunked.state_passing`` under the device's arithmetic profile, and the
fused gather vs the ``torch.where`` snapshot. They test ``kernels/``, so they apply only when the provider is ours."""

from __future__ import annotations

import torch

from harness.checks.base import Check
from harness.checks.paths import eligibility
from harness.checks.registry import register
from harness.compare import assert_bits_equal, assert_storage_equal, storage_bytes
from kernels.environment import arithmetic_profile


def _ours(provider, provider_spec: str) -> tuple[bool, str]:
    module = type(provider).__module__.split(".")[0]
    if module == "kernels" or provider_spec.split(":")[0].split(".")[0] == "kernels":
        return True, ""
    return False, f"kernel-level check of kernels/; provider {provider_spec or module!r} is not kernels:provider"


def _teacher_inputs(inputs):
    """The kernels' own dA_cumsum (H,C,Q) and chunk states (C,H,P,N) fp32 for these inputs."""
    from kernels.chunk_cumsum import chunk_cumsum
    from kernels.chunk_state import chunk_state

    o = inputs.case.options
    dA_cumsum, dt_out = chunk_cumsum(
        inputs.dt, inputs.A, inputs.case.shape.chunk_size, inputs.cu_chunk_seqlens,
        dt_bias=inputs.dt_bias, dt_softplus=o.dt_softplus, dt_limit=o.dt_limit,
    )
    return dA_cumsum, chunk_state(inputs.B, inputs.x, dt_out, dA_cumsum, inputs.cu_chunk_seqlens)


def _state_passing_exact(ctx) -> dict:
    from kernels.state_passing import state_passing
    from reference import chunked, snapshot

    profile = arithmetic_profile(ctx.device)
    kernel_in, ref_in = ctx.inputs(), ctx.inputs()
    dA_cumsum, states = _teacher_inputs(kernel_in)
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

    got = state_passing(states, dA_cumsum, kernel_in.seq_idx, initial_states=initial, out_dtype=out_dtype,
                        profile=profile, **writeback(kernel_in))
    ref = chunked.state_passing(states, dA_cumsum, ref_in.seq_idx, initial_states=initial, out_dtype=out_dtype,
                                profile=profile, **writeback(ref_in))
    assert_bits_equal(got, ref.exiting, what=f"state_passing exiting states (kernel vs reference, profile {profile})")
    assert_storage_equal(kernel_in.cache_base, storage_bytes(ref_in.cache_base),
                         what="cache storage after state_passing writeback (kernel vs reference)")
    compared = ["exiting states", "cache storage"]
    if eligibility(ctx.case)[0]:
        from kernels.state_passing_indexed import state_passing_indexed

        idx_in = ctx.inputs()
        entering = torch.empty_like(ref.entering)
        state_passing_indexed(
            states, dA_cumsum, state_cache=idx_in.state_cache,
            init_slot_index=idx_in.initial_state_indices[:1], has_initial_state=idx_in.has_initial_states[:1],
            final_slot_index=idx_in.final_state_indices[:1], out=entering,
        )
        assert_bits_equal(entering, ref.entering, what="state_passing_indexed entering states (kernel vs reference)")
        assert_storage_equal(idx_in.cache_base, storage_bytes(ref_in.cache_base),
                             what="cache storage after indexed state passing (kernel vs reference)")
        compared += ["indexed entering states", "indexed cache storage"]
    return {"profile": profile, "compared": compared}


def _gather_exact(ctx) -> dict:
    from kernels.gather import gather_initial_states
    from reference import snapshot

    inputs = ctx.inputs()
    got = gather_initial_states(inputs.state_cache, inputs.initial_state_indices, inputs.has_initial_states)
    want = snapshot.gather_initial_states(inputs.state_cache, inputs.initial_state_indices, inputs.has_initial_states)
    assert_bits_equal(got, want, what="fused gather vs torch.where snapshot")
    return {"rows": int(got.shape[0])}


register(
    Check(
        name="state_passing_exact",
        doc="kernels.state_passing (and the indexed twin) teacher-forced == reference.chunked.state_passing (bits)",
        run=_state_passing_exact,
        needs_paths=frozenset(),
        provider_applies=_ours,
    )
)
register(
    Check(
        name="gather_exact",
        doc="kernels.gather.gather_initial_states == reference torch.where snapshot (bits)",
        run=_gather_exact,
        needs_paths=frozenset(),
        provider_applies=_ours,
    )
)
