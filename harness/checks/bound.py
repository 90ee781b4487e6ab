"""``reference_bound``: the provider's output and final (or chunk-end) states vs the fp64 sequential reference,
within ``harness.bounds``' derived bound (docs/exactness.md, bounded). Reports max ulp and relative error."""

from __future__ import annotations

from collections import Counter
from typing import Callable

from harness.checks.base import Check
from harness.checks.calls import Call, shared_call
from harness.checks.registry import register
from harness.compare import Mismatch, assert_within_bound
from kernels.environment import arithmetic_profile


def ground_truth_for(inputs, exit_offsets=None):
    """fp64 sequential (out (T,H,P), finals (Bt,H,P,N)[, chunk ends (C,H,P,N)]), the magnitude shadows and the
    chunk-end shadow (None without exit offsets) of a case's inputs, from the state the cache holds now (call it
    before the provider overwrites the initial states). One scan of the three recurrences."""
    from reference import sequential, snapshot

    case = inputs.case
    o = case.options
    initial = snapshot.gather_initial_states(inputs.state_cache, inputs.initial_state_indices,
                                             inputs.has_initial_states)
    truth = sequential.ground_truth(
        inputs.x, inputs.dt, inputs.A, inputs.B, inputs.C, cu_seqlens=inputs.cu_seqlens,
        chunk_size=case.shape.chunk_size, D=inputs.D, z=inputs.z, dt_bias=inputs.dt_bias,
        dt_softplus=o.dt_softplus, dt_limit=o.dt_limit, initial_states=initial, exit_offsets=exit_offsets)
    values = (truth.out, truth.final_states) + ((truth.chunk_end,) if exit_offsets is not None else ())
    return values, truth.shadows, truth.chunk_end_shadow


def _merge(stats: dict, what: str, measured) -> None:
    stats[what] = measured.as_dict()
    ulps = (stats.get("max_ulp", 0), measured.max_ulp)
    stats["max_ulp"] = None if None in ulps else max(ulps)  # None: a non-finite element has no ulp distance
    stats["max_rel_err"] = max(stats.get("max_rel_err", 0.0), measured.max_rel_err)
    stats["max_bound_use"] = max(stats.get("max_bound_use", 0.0), measured.max_bound_use)


def reference_judge(ctx) -> Callable[[Call], dict]:
    """``judge(call, under="")``: judges one finished call of the case (``harness.checks.calls.Call``) against the fp64
    sequential reference within the derived bound, raising ``Mismatch`` outside it and returning the measured stats.
    The reference and its bounds are computed once per case context (``CheckContext.reference_judge``), from the
    case's inputs before any call (the cache still holds the initial states), so every call of the case that a
    check judges (``reference_bound``'s, ``every_config``'s) is judged against one truth."""
    if ctx.reference_judge is None:
        ctx.reference_judge = _make_judge(ctx)
    return ctx.reference_judge


def _make_judge(ctx) -> Callable[..., dict]:
    from harness import bounds

    case = ctx.case
    pristine = ctx.inputs()
    mode = case.call.final_state
    exit_offsets = pristine.cu_chunk_seqlens[1:] if mode == "checkpoint" else None
    truth, shadows, chunk_shadow = ground_truth_for(pristine, exit_offsets)
    backend = arithmetic_profile(ctx.device)
    terms = bounds.input_error_terms(
        pristine.dt, pristine.A, cu_chunk_seqlens=pristine.cu_chunk_seqlens, seq_idx=pristine.seq_idx,
        dt_bias=pristine.dt_bias, dt_softplus=case.options.dt_softplus, dt_limit=case.options.dt_limit,
        z=pristine.z, backend=backend,
    )
    dims = dict(io_dtype=case.dtype.io_torch, state_dtype=case.dtype.state_torch, chunk_size=case.shape.chunk_size,
                dstate=case.shape.dstate, backend=backend, **terms.as_kwargs())
    out_bound = bounds.ssd_output_bound(shadows.out, truth[0], shadows=shadows, **dims)
    if mode == "checkpoint":
        state_bound = bounds.final_state_bound(chunk_shadow, truth[2], **dims)
    else:
        state_bound = bounds.final_state_bound(shadows.final_states, truth[1], shadows=shadows, **dims)

    def judge(call: Call, under: str = "") -> dict:
        """``under``: what the call ran under (a forced config), named in a failure's first line."""
        of = f" ({under})" if under else ""
        stats: dict = {"backend": backend}
        _merge(stats, "out", assert_within_bound(call.inputs.out, truth[0], out_bound,
                                                 what=f"out vs fp64 sequential reference{of}"))
        if mode == "checkpoint":
            _merge(stats, "chunk_end_states", assert_within_bound(
                call.returned, truth[2], state_bound,
                what=f"checkpoint chunk-end states vs fp64 sequential reference{of}"))
            return stats
        if mode == "returned":
            _merge(stats, "final_states", assert_within_bound(
                call.returned, truth[1], state_bound,
                what=f"returned final states vs fp64 sequential reference{of}"))
            return stats
        # direct: each written slot vs the sequence that owns it (a slot two sequences write has no single truth).
        slots = [s.final_slot for s in case.sequences]
        owners = Counter(s for s in slots if s is not None and s >= 0)
        checked = []
        for b, slot in enumerate(slots):
            if slot is None or slot < 0 or owners[slot] != 1:
                continue
            _merge(stats, f"final_state[{b}]->slot {slot}", assert_within_bound(
                call.inputs.state_cache[slot], truth[1][b], state_bound[b],
                what=f"final state of sequence {b} in slot {slot} vs fp64 sequential reference{of}"))
            checked.append(slot)
        stats["final_slots_checked"] = checked
        if call.returned is not None:
            raise Mismatch(f"direct writeback returned a tensor {tuple(call.returned.shape)}; expected None",
                           count=-1)
        return stats

    return judge


def _reference_bound(ctx) -> dict:
    judge = reference_judge(ctx)  # before the call: the truth starts from the initial states in the cache
    return judge(shared_call(ctx, "provider"))


register(
    Check(
        name="reference_bound",
        doc="out and final/chunk-end states vs the fp64 sequential reference within the derived bound",
        run=_reference_bound,
        shared_calls=('case',),
        cpu_calls=0.0,
    )
)
