"""The case model: frozen dataclasses mirroring the YAML schema ``ssd-case/1`` (docs/cases.md).

A ``Case`` says everything needed to rebuild the same tensors and the same call: shape, dtypes, options, the
sequences of the batch with their cache slots, the cache and index layouts, the call mode, the checks to run and
what to expect. ``harness.cases.loader`` builds these from YAML (validating first); ``harness.cases.builder``
turns one into tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import torch

from harness.varlen import VarlenMetadata, build_varlen_metadata
from kernels import interface

SCHEMA_ID = "ssd-case/1"

IO_DTYPES = ("float16", "bfloat16", "float32")
STATE_DTYPES = ("float16", "bfloat16", "float32")
D_MODES = ("none", "per_head", "per_channel")
INDEX_LAYOUTS = ("contiguous", "block_table")
FINAL_STATE_MODES = ("direct", "returned", "checkpoint")
PATHS = ("auto", "snapshot", "indexed")
EXPECT_KINDS = ("pass", "xfail")
# How an item can fail, as ``expect.fails_with`` names it: a check's verdict (a mismatch), or a fault of the provider:
# it raised, its process died or exited, or it ran past the item time limit (harness.isolation).
FAILURE_KINDS = ("mismatch", "exception", "exit", "timeout")

TORCH_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "int32": torch.int32,
    "int64": torch.int64,
}
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "int32": "i32", "int64": "i64"}
# The slot-index dtypes ssd_prefill accepts (the interface's, ``kernels.interface``), by their YAML names.
INDEX_DTYPES = tuple(name for name, dtype in TORCH_DTYPES.items() if dtype in interface.INDEX_DTYPES)

# The interpreter's unit of work (the CPU tier, docs/checks.md#tiers): one head of one chunk, up to this many chunk
# rows and state columns. The chunk-scan kernel walks a chunk in 64-row blocks and the state in blocks of at most
# 128 columns, so a (chunk, head) of chunk_size 256 and dstate 256 is 4 x 2 blocks.
CPU_BLOCK_ROWS = 64
CPU_BLOCK_STATE = 128


@dataclass(frozen=True)
class Shape:
    nheads: int
    headdim: int
    dstate: int
    ngroups: int
    chunk_size: int

    @property
    def state_elements(self) -> int:
        """Elements of one cache slot: H * P * N."""
        return self.nheads * self.headdim * self.dstate


@dataclass(frozen=True)
class Dtypes:
    io: str  # x, B, C, z, out
    state: str  # cache and workspace

    @property
    def io_torch(self) -> torch.dtype:
        return TORCH_DTYPES[self.io]

    @property
    def state_torch(self) -> torch.dtype:
        return TORCH_DTYPES[self.state]


@dataclass(frozen=True)
class Options:
    D: str = "none"
    z: bool = False
    dt_bias: bool = False
    dt_softplus: bool = False
    dt_limit: tuple[float, float] = (0.0, math.inf)


@dataclass(frozen=True)
class SequenceSpec:
    context: int  # tokens already in the cache (sets the chunk alignment)
    tokens: int  # new tokens of this call
    init_slot: int  # cache slot the initial state is read from (masked when has_state is false)
    has_state: bool
    final_slot: int | None = None  # direct writeback target; negative: padded sequence, write nothing


@dataclass(frozen=True)
class CacheSpec:
    slots: int
    row_pad: int = 0  # extra elements after each slot row, so stride(0) = H*P*N + row_pad
    offset: int = 0  # storage offset (elements) of slot 0
    fill: str | float = "nan"  # value of the storage outside the slot rows: "nan" or a finite float


@dataclass(frozen=True)
class IndicesSpec:
    layout: str = "contiguous"
    dtype: str = "int32"
    # block_table only: indices are columns of a (rows_before + batch, columns) table.
    columns: int | None = None
    init_column: int | None = None
    final_column: int | None = None
    rows_before: int | None = None

    def column_byte_offset(self, column: int) -> int:
        """Byte offset of ``table[rows_before, column]`` from the table's start (alignment of the column view)."""
        item = TORCH_DTYPES[self.dtype].itemsize
        return ((self.rows_before or 0) * (self.columns or 1) + column) * item


@dataclass(frozen=True)
class CallSpec:
    final_state: str = "direct"
    path: str = "auto"


@dataclass(frozen=True)
class Expect:
    """What a case's items should do. ``providers``: the ``--provider`` specs (``module:attr``, spelled as the run
    names them) an xfail applies to; every other provider must pass. ``None``: the xfail applies to every
    provider."""

    kind: str = "pass"
    reason: str | None = None  # required for xfail: why, with an issue or commit reference
    providers: tuple[str, ...] | None = None  # xfail only
    # xfail only: the kinds of failure (FAILURE_KINDS) the xfail excuses; any other is an error as under pass, so a
    # known wrong result cannot hide a crash or a hang.
    fails_with: tuple[str, ...] = ("mismatch",)

    def fails_for(self, provider_spec: str) -> bool:
        """Whether the case's items are expected to fail when ``provider_spec`` is the provider under test."""
        return self.kind == "xfail" and (self.providers is None or provider_spec in self.providers)


@dataclass(frozen=True)
class InputKnobs:
    """How the builder draws tensors. Defaults are part of the schema: changing one changes every case's tensors.

    dt before bias/softplus: ``dt_offset + dt_scale * randn`` with softplus, ``exp(dt_offset + dt_scale * randn)``
    without (positive, about exp(dt_offset)). A = ``-uniform(A_min, A_max)`` per head (Mamba2's A_init_range).
    """

    dt_offset: float = -3.0
    dt_scale: float = 0.5
    x_scale: float = 1.0
    bc_scale: float = 1.0
    state_scale: float = 1.0
    A_min: float = 1.0
    A_max: float = 16.0


@dataclass(frozen=True)
class Tiers:
    """``cpu``: None (the YAML leaves it out): the CPU tier runs the items its estimate admits
    (``harness.checks.tiers``: every item of a small case, the cheap items of a larger one); True: every item runs
    there; False: none does."""

    cpu: bool | None = None


@dataclass(frozen=True)
class Eligibility:
    """Whether the indexed path applies; falsy when not, with the reason (never use a bare tuple: always truthy)."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok

    def __iter__(self):
        return iter((self.ok, self.reason))


def default_family(case_id: str) -> str:
    """The family of a case without an explicit ``family:``: its id up to the first '-'."""
    return case_id.split("-", 1)[0]


def count_chunks(chunk_size: int, sequences: tuple[SequenceSpec, ...]) -> int:
    """Chunks of the batch (docs/domain.md), without validating: a partial first chunk up to the next boundary."""
    total = 0
    for s in sequences:
        first = min(chunk_size - s.context % chunk_size, s.tokens)
        total += 1 + -(-(s.tokens - first) // chunk_size)
    return total


def cpu_block_factors(shape: Shape, sequences: tuple[SequenceSpec, ...]) -> tuple[int, int, int, int]:
    """(chunks, heads, row blocks per chunk, state blocks per head): ``cpu_blocks`` is their product."""
    return (count_chunks(shape.chunk_size, sequences), shape.nheads, -(-shape.chunk_size // CPU_BLOCK_ROWS),
            -(-shape.dstate // CPU_BLOCK_STATE))


def cpu_blocks(shape: Shape, sequences: tuple[SequenceSpec, ...]) -> int:
    """Interpreter blocks of one call: chunks x heads x ceil(chunk_size / CPU_BLOCK_ROWS) x ceil(dstate /
    CPU_BLOCK_STATE). The interpreter runs every Triton program as numpy code, so a call's time grows with these
    (docs/checks.md#tiers)."""
    return math.prod(cpu_block_factors(shape, sequences))


@dataclass(frozen=True)
class Case:
    id: str
    description: str
    seed: int
    shape: Shape
    dtype: Dtypes
    options: Options
    sequences: tuple[SequenceSpec, ...]
    cache: CacheSpec
    indices: IndicesSpec
    call: CallSpec
    checks: tuple[str, ...]
    expect: Expect
    inputs: InputKnobs
    tiers: Tiers
    family: str
    # Where the case came from; not part of its meaning, so not compared.
    source: Path | None = field(default=None, compare=False)
    index_in_file: int = field(default=0, compare=False)
    line: int = field(default=0, compare=False)  # 0-based: where the case's mapping starts in ``source``

    @classmethod
    def create(cls, id: str, *, shape: Shape, dtype: Dtypes | tuple[str, str],
               sequences: Iterable[SequenceSpec | tuple], seed: int = 0, cache: CacheSpec | None = None,
               **fields) -> "Case":
        """A case with the schema's default for every field not given (what the loader fills in for a key a YAML
        file leaves out): no description, default options, contiguous int32 indices, a direct call on path auto,
        all checks, expected to pass, default input knobs, the CPU tier by estimated cost (``Tiers()``) and the
        family from the id. ``dtype`` may be ``(io, state)``; a sequence may be ``SequenceSpec``'s fields as a
        tuple; ``cache`` defaults to a compact cache with one slot past the highest slot the sequences name.
        ``fields``: any other ``Case`` field."""
        sequences = tuple(s if isinstance(s, SequenceSpec) else SequenceSpec(*s) for s in sequences)
        if cache is None:
            slots = [s.init_slot for s in sequences] + [s.final_slot for s in sequences if s.final_slot is not None]
            cache = CacheSpec(slots=max(slots) + 1)
        defaults = dict(description="", options=Options(), indices=IndicesSpec(), call=CallSpec(), checks=("all",),
                        expect=Expect(), inputs=InputKnobs(), tiers=Tiers(),
                        family=default_family(id))
        return cls(id=id, seed=seed, shape=shape, dtype=dtype if isinstance(dtype, Dtypes) else Dtypes(*dtype),
                   sequences=sequences, cache=cache, **{**defaults, **fields})

    @property
    def batch(self) -> int:
        return len(self.sequences)

    @property
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.sequences)

    def cpu_blocks(self) -> int:
        """Interpreter blocks of one call of this case (``cpu_blocks``)."""
        return cpu_blocks(self.shape, self.sequences)

    def indexed_eligible(self) -> Eligibility:
        """Indexed path rule (docs/domain.md): one sequence, direct writeback, no intermediate states.

        The rule is the interface's (``kernels.interface.indexed_ineligibility``), applied to the call the harness
        makes for this case: its mode, its batch, and the workspace in the cache dtype (the harness passes none).
        """
        state = self.dtype.state_torch
        reason = interface.indexed_ineligibility(interface.CallShape(
            batch=self.batch, direct=self.call.final_state == "direct",
            intermediate=self.call.final_state == "checkpoint", cache_dtype=state, state_dtype=state))
        return Eligibility(reason is None, reason or "")

    def metadata(self) -> VarlenMetadata:
        return build_varlen_metadata(
            [s.context for s in self.sequences], [s.tokens for s in self.sequences], self.shape.chunk_size
        )

    def cache_guard(self) -> int:
        """Elements of ``cache.fill`` the builder puts before the ``cache.offset`` ones, so that the row of the
        most negative final slot of a direct call, ``slot * stride(0)`` elements from slot 0 (where a provider that
        does not skip padded sequences stores their final state), lies inside the cache's storage: the storage
        checks then see such a store byte for byte, instead of it landing in memory outside the allocation
        (silently, or as a fault, depending on what is there). 0 when no direct-call final slot is negative or the
        offset already holds that row. A multiple of 16 bytes, so the cache's pointer keeps its alignment class
        (what Triton specializes on)."""
        if self.call.final_state != "direct":
            return 0
        lowest = min((s.final_slot for s in self.sequences if s.final_slot is not None), default=0)
        if lowest >= 0:
            return 0
        sh = self.shape
        needed = -lowest * (sh.nheads * sh.headdim * sh.dstate + self.cache.row_pad) - self.cache.offset
        per_16_bytes = 16 // self.dtype.state_torch.itemsize
        return max(0, -(-needed // per_16_bytes) * per_16_bytes)

    def summary(self) -> str:
        """One line: what a kernel engineer needs to picture the case."""
        sh, o = self.shape, self.options
        seqs = []
        for s in self.sequences:
            init = str(s.init_slot) if s.has_state else f"({s.init_slot} masked)"
            final = "" if s.final_slot is None else f"->{s.final_slot}"
            seqs.append(f"{s.context}+{s.tokens} {init}{final}")
        idx = self.indices
        if idx.layout == "block_table":
            fc = "-" if idx.final_column is None else idx.final_column
            layout = f"bt[{idx.rows_before}:,{idx.init_column}/{fc}] of {idx.columns} cols"
        else:
            layout = "contiguous"
        flags = (("z", o.z), ("dt_bias", o.dt_bias), ("softplus", o.dt_softplus))
        opts = [f"D={o.D}"] + [name for name, on in flags if on]
        if o.dt_limit != (0.0, math.inf):
            opts.append(f"dt_limit=({o.dt_limit[0]:g},{o.dt_limit[1]:g})")
        return (
            f"{self.id}: H{sh.nheads} P{sh.headdim} N{sh.dstate} G{sh.ngroups} Q{sh.chunk_size} "
            f"io={SHORT_DTYPE[self.dtype.io]} state={SHORT_DTYPE[self.dtype.state]} "
            f"seqs=[{', '.join(seqs)}] cache={self.cache.slots} slots pad {self.cache.row_pad} "
            f"off {self.cache.offset} fill {self.cache.fill} idx={SHORT_DTYPE[idx.dtype]} {layout} "
            f"call={self.call.final_state}/{self.call.path} {' '.join(opts)} seed={self.seed}"
        )
