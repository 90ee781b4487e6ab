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
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.cases.model import TORCH_DTYPES, Case, count_chunks
from harness.cases.schema import INT32_MAX, SchemaViolation

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


def _bytes(n: int) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} bytes"
