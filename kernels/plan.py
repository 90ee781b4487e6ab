"""Which kernels one ``ssd_prefill`` call launches, in which order: a pure function of the call's facts (``plan``),
read by ``kernels.ssd`` as numbered steps.

Every plan computes the same bits: where two stages run in one kernel, each program runs its own stage's tile code
under its stage's blocks (``kernels.chunk_state_bmm``, ``kernels.chunk_cumsum_gather``); where a kernel runs beside
the one before it (programmatic dependent launch, ``kernels/backend.py``), it reads nothing that kernel writes. What a
plan changes is the number of launches and how they share the GPU.

The shipped rule (``plan``) runs the fewest kernels the call's configs and layout allow. ``unfused=True`` is the one
other plan: every stage in a kernel of its own, launched alone, so that ``harness bench --stages`` can time and sweep
each stage's configs apart (chunk state's and bmm's, the cumsum's and the gather's).
"""

from __future__ import annotations

from dataclasses import dataclass

# From this many chunks in a call the states run as two kernels (chunk state, then a state passing kernel with one
# program per block of a head's state) instead of the fused chunk state + state passing kernel, whose few programs
# each walk every chunk (docs/decisions.md).
PAIR_FROM_CHUNKS = 8

PATHS = ("snapshot", "indexed")
# Where the snapshot path's dense copy of the initial states is made; None on the indexed path, whose state passing
# reads the initial state from the cache by slot.
GATHERS = ("in_cumsum", "beside_cumsum", "alone", "torch")
# How chunk states are computed and passed on: "fused", one kernel (``kernels.chunk_state_passing``) that never
# stores them; "pair", chunk state's kernel, then the state passing kernel of the path (batched on the snapshot
# path, indexed on the indexed path).
STATES = ("fused", "pair")
# Where bmm (C^T B) runs: "in_chunk_state", its programs in chunk state's kernel (``kernels.chunk_state_bmm``);
# "before_chunk_state", its own kernel, chunk state's kernel beside it; "after_states", its own kernel beside the
# fused states kernel; "alone", its own kernel after the cumsum, beside nothing.
BMMS = ("in_chunk_state", "before_chunk_state", "after_states", "alone")


@dataclass(frozen=True)
class Plan:
    """What one call launches. ``chunk_state_bmm`` is the config of the kernel that runs chunk state's and bmm's
    programs, where ``bmm == "in_chunk_state"``."""

    path: str
    gather: str | None
    states: str
    bmm: str
    chunk_state_bmm: dict | None = None

    def __post_init__(self):
        assert self.path in PATHS, self.path
        assert (self.gather is None) == (self.path == "indexed"), (self.path, self.gather)
        assert self.gather is None or self.gather in GATHERS, self.gather
        assert self.states in STATES and self.bmm in BMMS, (self.states, self.bmm)
        assert (self.chunk_state_bmm is not None) == (self.bmm == "in_chunk_state"), self
        assert self.bmm != "after_states" or self.states == "fused", self
        assert self.bmm not in ("in_chunk_state", "before_chunk_state") or self.states == "pair", self

    @property
    def signals_after_cumsum(self) -> bool:
        """The cumsum's kernel lets the gather's start early (the gather reads only the cache)."""
        return self.gather == "beside_cumsum"

    @property
    def kernels(self) -> tuple[str, ...]:
        """The launches, in order (the entry points' names in ``kernels``; the torch copy is not a kernel)."""
        names = ["chunk_cumsum_gather" if self.gather == "in_cumsum" else "chunk_cumsum"]
        if self.gather in ("beside_cumsum", "alone"):
            names.append("gather_initial_states")
        if self.bmm == "alone":
            names.append("bmm_chunk")
        if self.states == "fused":
            names.append("chunk_state_passing")
            if self.bmm == "after_states":
                names.append("bmm_chunk")
        else:
            if self.bmm == "before_chunk_state":
                names.append("bmm_chunk")
            names.append("chunk_state_bmm" if self.bmm == "in_chunk_state" else "chunk_state")
            names.append("state_passing_indexed" if self.path == "indexed" else "state_passing_batched")
        names.append("chunk_scan")
        return tuple(names)


def states_pair(nchunks: int) -> bool:
    """Whether a call of ``nchunks`` chunks computes its states as a pair of kernels (known from the shape)."""
    return nchunks >= PAIR_FROM_CHUNKS


def plan(*, path: str, copy: str | None, nchunks: int, cache_rows_aligned: bool, chunk_state_bmm: dict | None,
         unfused: bool = False) -> Plan:
    """The plan for one call: ``path`` as chosen (``kernels.interface.choose_path``); ``copy`` the snapshot copy
    chosen ("fused": Triton's gather kernel, "torch"; None on the indexed path); ``cache_rows_aligned``: every cache
    row 16-byte aligned (``kernels.chunk_cumsum_gather.fuses``); ``chunk_state_bmm``: the one config under which
    chunk state's and bmm's programs can share a kernel at this shape and chunk count, or None
    (``kernels.chunk_state_bmm.chunk_state_bmm_config``). ``unfused``: every stage alone (module docstring)."""
    assert (copy is None) == (path == "indexed"), (path, copy)
    states = "pair" if states_pair(nchunks) else "fused"
    if unfused:
        gather = None if copy is None else ("torch" if copy == "torch" else "alone")
        return Plan(path, gather, states, "alone")
    if copy is None:
        gather = None
    elif copy == "torch":
        gather = "torch"
    else:
        gather = "in_cumsum" if cache_rows_aligned else "beside_cumsum"
    if states == "fused":
        return Plan(path, gather, states, "after_states")
    if chunk_state_bmm is not None:
        return Plan(path, gather, states, "in_chunk_state", chunk_state_bmm)
    return Plan(path, gather, states, "before_chunk_state")
