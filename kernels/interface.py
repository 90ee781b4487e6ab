"""The parts of ``ssd_prefill``'s contract that need no kernel: the dtypes it accepts for slot indices, masks and
states, and which path (snapshot or indexed) a call takes.

Imports torch only (no triton), so that the case model can take its index dtypes and indexed-path rule from here
before the backend is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Slot indices (initial_state_indices, final_state_indices) and the varlen metadata tensors.
INDEX_DTYPES = (torch.int32, torch.int64)
# has_initial_states: a bool mask or any integer (nonzero: the sequence has an initial state).
MASK_DTYPES = (torch.bool, torch.uint8, torch.int8) + INDEX_DTYPES
# The state cache and the state workspace.
STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kernel_slots(t: torch.Tensor) -> torch.Tensor:
    """Slot indices as every kernel reads them: int32. int32 passes as it is (a strided or unaligned view too); int64
    is copied, so that no kernel compiles a binary per index dtype. Slots must fit in int32 (a larger one wraps, as
    any cast does): a cache of 2**31 rows or more is not supported. A copy is a kernel of its own: make it before a
    chain of kernels that start beside each other (``kernels.ssd.ssd_prefill`` does, before its first launch), not
    between two of them."""
    return t if t.dtype == torch.int32 else t.to(torch.int32)


def kernel_mask(t: torch.Tensor) -> torch.Tensor:
    """``has_initial_states`` as every kernel reads it: bytes, nonzero where a sequence has an initial state. A bool,
    uint8 or int8 mask is viewed as uint8 (same width, no copy); a wider integer one is compared with 0."""
    if t.dtype == torch.uint8:
        return t
    if t.dtype in (torch.bool, torch.int8):
        return t.view(torch.uint8)
    return (t != 0).view(torch.uint8)


PATHS = ("snapshot", "indexed", "auto")
GATHERS = ("auto", "fused", "torch")


@dataclass(frozen=True)
class CallShape:
    """What the path choice depends on."""

    batch: int
    direct: bool  # final_state_indices given: write final states into the cache
    intermediate: bool  # return_intermediate_states: checkpoint mode
    cache_dtype: torch.dtype
    state_dtype: torch.dtype
    on_cuda: bool = False  # only ``auto`` reads it: eligibility itself does not depend on the device

    @property
    def mode(self) -> str:
        return "checkpoint" if self.intermediate else ("direct" if self.direct else "returned")


def indexed_ineligibility(call: CallShape) -> str | None:
    """Why the indexed path cannot run this call, or None when it can.

    The indexed path reads one sequence's initial state from the cache by slot and writes its final state back in
    place, with the workspace in the cache dtype: so one sequence, direct writeback, no intermediate states, and a
    workspace dtype equal to the cache dtype."""
    if call.batch != 1:
        return f"the indexed path needs exactly one sequence, this call has {call.batch} sequences"
    if call.intermediate:
        return "the indexed path cannot return intermediate states (return_intermediate_states=True, checkpoint mode)"
    if not call.direct:
        return "the indexed path needs direct final-state writeback (final_state_indices), this call returns them"
    if call.cache_dtype != call.state_dtype:
        return (f"the indexed path needs the cache dtype ({call.cache_dtype}) to equal the state workspace dtype "
                f"({call.state_dtype})")
    return None


def choose_path(path: str, call: CallShape) -> str:
    """``snapshot`` or ``indexed``. An explicit ``indexed`` on an ineligible call raises ValueError naming the reason;
    ``auto`` takes indexed only on CUDA (the interpreter may run it when asked for explicitly)."""
    if path not in PATHS:
        raise ValueError(f"path: expected one of {', '.join(PATHS)}, found {path!r}")
    reason = indexed_ineligibility(call)
    if path == "indexed":
        if reason is not None:
            raise ValueError(f"path='indexed': {reason}")
        return "indexed"
    if path == "auto" and reason is None and call.on_cuda:
        return "indexed"
    return "snapshot"


def choose_gather(gather: str, on_cuda: bool) -> str:
    """``fused`` (the Triton gather kernel) or ``torch`` (the same copy in PyTorch ops); ``auto`` is fused on CUDA
    only."""
    if gather not in GATHERS:
        raise ValueError(f"gather: expected one of {', '.join(GATHERS)}, found {gather!r}")
    if gather == "auto":
        return "fused" if on_cuda else "torch"
    return gather
