"""Snapshot semantics of the baseline path: copy the initial states out of the paged cache before anything can
overwrite them, and write final states back into their slots afterwards."""

from __future__ import annotations

import torch


def gather_initial_states(state_cache: torch.Tensor, initial_state_indices: torch.Tensor,
                          has_initial_states: torch.Tensor) -> torch.Tensor:
    """state_cache (slots,H,P,N) (padded stride(0) / storage offset allowed), indices (Bt,) int32/int64 (views ok),
    has_initial_states (Bt,) bool -> dense (Bt,H,P,N) copy in the cache dtype.

    ``torch.where`` picks zeros for masked sequences, so a masked slot's contents (even NaN) never leak: multiplying by
    a 0/1 mask instead would turn NaN into NaN.
    """
    idx = initial_state_indices.to(torch.long)
    gathered = state_cache[idx]
    mask = has_initial_states.to(torch.bool)[:, None, None, None].to(gathered.device)
    return torch.where(mask, gathered, torch.zeros((), dtype=gathered.dtype, device=gathered.device))


def write_final_states(state_cache: torch.Tensor, final_state_indices: torch.Tensor,
                       final_states: torch.Tensor) -> None:
    """state_cache[final_state_indices[b]] = final_states[b] (Bt,H,P,N) for every b whose slot is >= 0.

    A negative slot marks a padded sequence: nothing is written. Every other byte of the cache storage is untouched.
    """
    slots = [int(v) for v in final_state_indices.tolist()]
    for b, slot in enumerate(slots):
        if slot >= 0:
            state_cache[slot].copy_(final_states[b])
