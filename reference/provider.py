"""A pure-PyTorch provider (``--provider reference:provider``): the chunked reference with snapshot semantics."""

from __future__ import annotations

import math

from reference.chunked import chunked_ssd


class ReferenceProvider:
    """Provider interface (docs/provider.md) over ``chunked_ssd``; snapshot path only."""

    name = "reference"
    supported_paths = frozenset({"snapshot"})

    def ssd_prefill(self, x, dt, A, B, C, *, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx,
                    out, D=None, z=None, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf), state_cache,
                    initial_state_indices, has_initial_states, final_state_indices=None,
                    return_intermediate_states=False, path="auto"):
        if path == "indexed":
            raise ValueError("path='indexed': the reference provider has no indexed path (snapshot only)")
        if path not in ("auto", "snapshot"):
            raise ValueError(f"path: expected one of auto, snapshot, indexed; found {path!r}")
        return chunked_ssd(x, dt, A, B, C, chunk_size=chunk_size, cu_seqlens=cu_seqlens,
                           cu_chunk_seqlens=cu_chunk_seqlens, last_chunk_indices=last_chunk_indices, seq_idx=seq_idx,
                           out=out, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit,
                           state_cache=state_cache, initial_state_indices=initial_state_indices,
                           has_initial_states=has_initial_states, final_state_indices=final_state_indices,
                           return_intermediate_states=return_intermediate_states)


provider = ReferenceProvider()
