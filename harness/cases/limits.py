"""Whether a case could run on any device at all, judged from its numbers before anything is allocated.

A case fixes the shape and dtype of every tensor of its call and of the chunked algorithm that computes it (the
kernels and the reference's five-stage mirror allocate the same intermediates: dt and its cumulative sum per chunk,
C^T B per chunk, the chunk states and the states passed between chunks). Two rules follow from what no device runs:

- At most INT32_MAX tokens in all: ``cu_seqlens`` and the chunk offsets are int32 tensors (Mamba2's metadata), so a
  larger batch cannot be described to a kernel.
- At most DEVICE_BYTES_MAX bytes for those tensors together: more memory than any single accelerator has (the
  largest hold 288 GB). The tensors counted are a subset of what a run holds at once, so a case over the limit
  certainly cannot run; one under it may still exceed a smaller device, which the run then reports as that case's
  error.

One tensor of more than INT32_MAX elements is allowed: it fits large devices, and whether a kernel indexes it with
64-bit offsets is what such a case tests. Each count of a case is bounded by the schema (harness.cases.schema).

Two more rules, one per moment:

- At validation, ``check_input_ranges``: the builder draws x, B, C and the slot rows as float32 ``randn`` times a
  scale and rounds them to their dtype; a scale whose draws overflow that dtype gives infinities, not the inputs the
  case describes, so every result of the case would be NaN. Draws are taken to reach RANDN_REACH standard
  deviations (beyond it: a chance of about 1e-15 per element); dt without softplus is ``exp`` of its draw, in float32.
- At run time, ``device_fit_problem``: the same tensors against the memory of the device the run has (a GPU's, or
  for the CPU the host's, within its cgroup limit), before anything is allocated: a case over it can never run
  there, and allocating it would only hand the verdict to the allocator or the OOM killer.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

from harness.cases.model import TORCH_DTYPES, Case, count_chunks
from harness.cases.schema import INT32_MAX, SchemaViolation, describe

DEVICE_BYTES_MAX = 512 * 2**30


@dataclass(frozen=True)
class Factor:
    label: str  # what the number is, in the tensor's formula
    value: int
    key: str  # the case key that sets it


@dataclass(frozen=True)
class TensorSize:
    """A tensor's element count as a sum of products of the case's numbers (most tensors: one product)."""

    name: str
    dtype: str
    terms: tuple[tuple[Factor, ...], ...]

    @property
    def elements(self) -> int:
        return sum(_product(term) for term in self.terms)

    @property
    def bytes(self) -> int:
        return self.elements * TORCH_DTYPES[self.dtype].itemsize

    def blame(self) -> str:
        """The key to change: the largest factor of the largest term."""
        return max(max(self.terms, key=_product), key=lambda f: f.value).key

    def formula(self) -> str:
        """How the element count is made, terms that add nothing (a zero offset or padding) left out."""
        terms = [term for term in self.terms if _product(term)] or list(self.terms[:1])
        labels = " + ".join(" x ".join(f.label for f in term) for term in terms)
        values = " + ".join(" x ".join(str(f.value) for f in term) for term in terms)
        return f"{labels} = {values}"


def _product(term: tuple[Factor, ...]) -> int:
    product = 1
    for factor in term:
        product *= factor.value
    return product


def _token_key(case: Case) -> str:
    """The sequence with the most tokens: the one to shorten when the batch is too long."""
    longest = max(range(case.batch), key=lambda b: case.sequences[b].tokens)
    return f"sequences[{longest}].tokens"


def _lowest_final_slot_key(case: Case) -> str:
    """The sequence with the most negative final slot: the one that sets the cache's guard (``Case.cache_guard``)."""
    slots = [(s.final_slot, b) for b, s in enumerate(case.sequences) if s.final_slot is not None]
    return f"sequences[{min(slots)[1]}].final_slot" if slots else "sequences"


def tensor_sizes(case: Case) -> list[TensorSize]:
    """The large tensors a run of ``case`` holds at once (small per-head and per-sequence vectors left out)."""
    sh, io, state = case.shape, case.dtype.io, case.dtype.state
    tokens = Factor("tokens", case.total_tokens, _token_key(case))
    chunks = Factor("chunks", count_chunks(sh.chunk_size, case.sequences), _token_key(case))
    heads = Factor("nheads", sh.nheads, "shape.nheads")
    headdim = Factor("headdim", sh.headdim, "shape.headdim")
    dstate = Factor("dstate", sh.dstate, "shape.dstate")
    groups = Factor("ngroups", sh.ngroups, "shape.ngroups")
    chunk = Factor("chunk_size", sh.chunk_size, "shape.chunk_size")
    slots = Factor("slots", case.cache.slots, "cache.slots")
    cache = case.cache
    sizes = [
        TensorSize("x", io, ((tokens, heads, headdim),)),
        TensorSize("out", io, ((tokens, heads, headdim),)),
        TensorSize("dt", "float32", ((tokens, heads),)),
        TensorSize("B", io, ((tokens, groups, dstate),)),
        TensorSize("C", io, ((tokens, groups, dstate),)),
        TensorSize("state_cache", state, (
            (Factor("negative-slot guard", case.cache_guard(), _lowest_final_slot_key(case)),),
            (Factor("offset", cache.offset, "cache.offset"),),
            (slots, heads, headdim, dstate),
            (slots, Factor("row_pad", cache.row_pad, "cache.row_pad")),
        )),
        TensorSize("dt per chunk", "float32", ((heads, chunks, chunk),)),
        TensorSize("dA_cumsum", "float32", ((heads, chunks, chunk),)),
        TensorSize("CB", "float32", ((chunks, groups, chunk, chunk),)),
        TensorSize("chunk states", "float32", ((chunks, heads, headdim, dstate),)),
        TensorSize("passed states", state, ((chunks, heads, headdim, dstate),)),
    ]
    if case.options.z:
        sizes.append(TensorSize("z", io, ((tokens, heads, headdim),)))
    idx = case.indices
    if idx.layout == "block_table":
        rows = (Factor("rows_before", idx.rows_before, "indices.rows_before"),
                Factor("sequences", case.batch, "sequences"))
        columns = Factor("columns", idx.columns, "indices.columns")
        sizes.append(TensorSize("index table", idx.dtype, ((rows[0], columns), (rows[1], columns))))
    return sizes


def check_sizes(case: Case) -> None:
    """Reject a case no device could run. Raises ``SchemaViolation`` (key paths relative to the case)."""
    total = 0
    for b, s in enumerate(case.sequences):
        total += s.tokens
        if total > INT32_MAX:
            raise SchemaViolation(
                f"sequences[{b}].tokens", "at most 2^31 - 1 tokens in all (cu_seqlens and chunk offsets are int32)",
                f"{case.total_tokens} tokens in all",
            )
    sizes = tensor_sizes(case)
    need = sum(t.bytes for t in sizes)
    if need > DEVICE_BYTES_MAX:
        largest = max(sizes, key=lambda t: t.bytes)
        raise SchemaViolation(
            largest.blame(),
            f"tensors that fit one device (at most {_bytes(DEVICE_BYTES_MAX)} in all)",
            f"{_bytes(need)} in all; {largest.name} ({largest.formula()}, {largest.dtype}) alone "
            f"{_bytes(largest.bytes)}",
        )


RANDN_REACH = 8.0


def check_input_ranges(case: Case) -> None:
    """Reject input scales whose draws overflow their dtype. Raises ``SchemaViolation`` (key paths relative to the
    case)."""
    k = case.inputs
    io, state = case.dtype.io, case.dtype.state
    for key, scale, dtype, what in (("x_scale", k.x_scale, io, "x"), ("bc_scale", k.bc_scale, io, "B and C"),
                                    ("state_scale", k.state_scale, state, "the slot rows")):
        largest = torch.finfo(TORCH_DTYPES[dtype]).max
        most = largest / RANDN_REACH
        if scale > most:
            raise SchemaViolation(
                f"inputs.{key}", f"at most {most:.4g} ({what} = randn x {key} in {dtype}: {RANDN_REACH:g} standard "
                f"deviations of randn must stay below {dtype}'s largest value, {largest:.4g})", describe(scale))
    if not case.options.dt_softplus:
        reach = k.dt_offset + RANDN_REACH * k.dt_scale
        most = math.log(torch.finfo(torch.float32).max)
        if reach > most:
            key = "dt_offset" if k.dt_offset > RANDN_REACH * k.dt_scale else "dt_scale"
            raise SchemaViolation(
                f"inputs.{key}", f"dt_offset + {RANDN_REACH:g} x dt_scale at most {most:.4g} (without dt_softplus dt = "
                "exp(dt_offset + dt_scale x randn) in float32, which overflows above that)",
                f"dt_offset {describe(k.dt_offset)}, dt_scale {describe(k.dt_scale)}")


def device_fit_problem(case: Case, device: str) -> str:
    """"" when the tensors of ``tensor_sizes`` fit the memory of ``device`` ("cpu" or "cuda"); else one line naming
    the case's file and id, the key to change, the memory needed and the memory the device has."""
    sizes = tensor_sizes(case)
    need = sum(t.bytes for t in sizes)
    has, what = device_memory(device)
    if need <= has:
        return ""
    largest = max(sizes, key=lambda t: t.bytes)
    return (f"{case.source}: case {case.id}: {largest.blame()}: expected tensors that fit this device's memory "
            f"({what}: {_bytes(has)}), found {_bytes(need)} in all; {largest.name} ({largest.formula()}, "
            f"{largest.dtype}) alone {_bytes(largest.bytes)}; refused before allocating")


@functools.lru_cache(maxsize=None)
def device_memory(device: str) -> tuple[int, str]:
    """(bytes, what they are) of the memory a run on ``device`` can use at most."""
    if device == "cuda":
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return props.total_memory, f"cuda:{index} {props.name} memory"
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_memory_limit()
    if limit is not None and limit < physical:
        return limit, "host memory within this cgroup's limit (cpu)"
    return physical, "host memory (cpu)"


def _cgroup_memory_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = open(path, encoding="ascii").read().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} bytes"
