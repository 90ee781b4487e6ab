"""Each stage of one call of ours as a launch of its own: the provider hook ``stage_launches``
(docs/provider.md#optional-hooks), which ``harness bench --stages`` times stage by stage, ours
alone and against a peer's.

The call runs once (``workspace_out`` keeps its intermediates); each closure then launches one stage through the
stage's entry point on those intermediates, with the call's arguments, and returns what it wrote. Every launch of a
closure does the same work on the same inputs: the snapshot path's chunk scan reads the gathered copy, not the cache
its final states went to; where a call's initial and final slots were one, the indexed state passing would read
what the launch before wrote (other values, the same work). Launched alone, a stage neither waits for another nor
lets one start early (no programmatic-launch flag is passed): its time is its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels import (
    bmm_chunk,
    chunk_cumsum,
    chunk_cumsum_gather,
    chunk_scan,
    chunk_state,
    chunk_state_bmm,
    chunk_state_passing,
    gather,
    state_passing_batched,
    state_passing_indexed,
)


def stage_launches(ssd_prefill: Callable, **call) -> dict[str, Callable[[], torch.Tensor]]:
    """Stage name (``harness.kernel_profile.STAGES``'s names) -> a closure launching that stage alone on the
    intermediates of ``ssd_prefill(**call)``, returning the tensor the stage wrote. The snapshot path has
    ``gather``, ``chunk_state_passing`` (chunk state and state passing in one kernel), or from
    ``kernels.plan.PAIR_FROM_CHUNKS`` chunks ``chunk_state`` and ``state_passing`` (the batched kernel); the indexed
    path ``chunk_state_passing`` reading the initial state by slot, or from that many chunks ``chunk_state`` and
    ``gather_state_passing`` (state passing that does the gather's copy too); both
    ``chunk_cumsum``, ``bmm_chunk`` and ``chunk_scan``. Where the call ran chunk state's and bmm's programs in one
    kernel (``kernels.chunk_state_bmm``), ``chunk_state_bmm`` (returning the chunk states) stands for both; where
    the cumsum's kernel also made the gather's copy (``kernels.chunk_cumsum_gather``), ``chunk_cumsum_gather``
    (returning dA_cumsum) stands for ``chunk_cumsum`` and ``gather``."""
    ws: dict = {}
    ssd_prefill(**call, workspace_out=ws)
    x, B, C, Q, cu, seq_idx = call["x"], call["B"], call["C"], call["chunk_size"], call["cu_chunk_seqlens"], \
        call["seq_idx"]
    dA, dt_out, states, cache = ws["dA_cumsum"], ws["dt_out"], ws["states"], call["state_cache"]
    CB = bmm_chunk.bmm_chunk(C, B, Q, cu)
    dt_options = dict(dt_bias=call.get("dt_bias"), dt_softplus=call.get("dt_softplus", False),
                      dt_limit=call.get("dt_limit", (0.0, float("inf"))))
    if ws["cumsum_gather"]:  # the cumsum's and the gather's programs in one kernel
        launches = {"chunk_cumsum_gather": lambda: chunk_cumsum_gather.chunk_cumsum_gather(
            call["dt"], call["A"], Q, cu, cache, call["initial_state_indices"], call["has_initial_states"],
            **dt_options)[0]}
    else:
        launches = {"chunk_cumsum": lambda: chunk_cumsum.chunk_cumsum(call["dt"], call["A"], Q, cu, **dt_options)[0]}
    if ws["chunk_state_bmm"] is not None:  # chunk state's and bmm's programs in one kernel, under the call's config
        config = ws["chunk_state_bmm"]
        launches["chunk_state_bmm"] = lambda: chunk_state_bmm.chunk_state_bmm(B, x, C, dt_out, dA, cu, config)[0]
    else:
        launches["bmm_chunk"] = lambda: bmm_chunk.bmm_chunk(C, B, Q, cu)
        if ws["chunk_states"] is not None:  # chunk state ran as a kernel of its own
            launches["chunk_state"] = lambda: chunk_state.chunk_state(B, x, dt_out, dA, cu)
    if ws["path"] == "indexed" and ws["chunk_states"] is None:
        def by_slot():  # the fused kernel reading the initial state by slot
            chunk_state_passing.chunk_state_passing(
                B, x, dt_out, dA, cu, seq_idx, out=states, state_cache=cache,
                initial_state_indices=call["initial_state_indices"][:1],
                has_initial_states=call["has_initial_states"][:1], final_state_indices=call["final_state_indices"][:1],
                last_chunk_indices=call["last_chunk_indices"][:1])
            return states

        launches["chunk_state_passing"] = by_slot
    elif ws["path"] == "indexed":
        def passing():
            state_passing_indexed.state_passing_indexed(
                ws["chunk_states"], dA, state_cache=cache, init_slot_index=call["initial_state_indices"][:1],
                has_initial_state=call["has_initial_states"][:1], final_slot_index=call["final_state_indices"][:1],
                out=states)
            return states

        launches["gather_state_passing"] = passing  # the gather's copy is this kernel's work too
    else:
        # The snapshot copy the call made, unless the cumsum's kernel made it: the fused Triton gather or the same
        # copy in PyTorch ops.
        copy = gather.gather_initial_states if ws["gather"] == "fused" else gather.gather_initial_states_torch
        if not ws["cumsum_gather"]:
            launches["gather"] = lambda: copy(cache, call["initial_state_indices"], call["has_initial_states"])
        # Every launch reads the gathered copy, so writing the final slots again does the same work.
        if ws["chunk_states"] is not None:
            def batched():
                state_passing_batched.state_passing_batched(
                    ws["chunk_states"], dA, call["last_chunk_indices"], initial_states=ws["initial_states"],
                    out=states, state_cache=cache, final_state_indices=call.get("final_state_indices"))
                return states

            launches["state_passing"] = batched
        else:
            def state_and_passing():
                chunk_state_passing.chunk_state_passing(
                    B, x, dt_out, dA, cu, seq_idx, out=states, initial_states=ws["initial_states"],
                    state_cache=cache, final_state_indices=call.get("final_state_indices"),
                    last_chunk_indices=call["last_chunk_indices"])
                return states

            launches["chunk_state_passing"] = state_and_passing

    def scan():
        chunk_scan.chunk_scan(CB, x, dt_out, dA, C, states, cu, seq_idx, out=call["out"], D=call.get("D"),
                              z=call.get("z"), initial_states=ws["initial_states"],
                              states_are_entering=ws["path"] == "indexed")
        return call["out"]

    launches["chunk_scan"] = scan
    return launches
