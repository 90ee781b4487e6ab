"""Generate the checked-in case corpus (``cases/corpus/``) as covering arrays over the axes of the indexed-path issue.

Deterministic: no timestamps, no unseeded randomness, stable order; running it twice writes identical bytes.
Run: ``python -m harness.cases.generate [out_dir]`` (default ``cases/corpus``).

Families (one file each):
- ``direct``: one sequence, direct writeback (indexed-eligible), pairwise over every axis, all io x state dtype x
  shape triples;
- ``multi``: 2-3 sequences with direct writeback (ineligible): crossed slots a->b, b->a, a 3-cycle, a shared initial
  slot, masked and padded (negative final slot) sequences;
- ``fallback``: checkpoint and returned-state calls of 1-3 sequences;
- ``index_layouts``: every index dtype x stride class (1, 16, other) x pointer alignment, for the gather warmup;
- ``serving``: the serving shape with the workloads of the PR (4224-token prefix + 32, mixed 32/600/1600).
"""

from __future__ import annotations

import random
import sys
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.cases.covering import covering_rows
from harness.cases.loader import check_combinations, dump_case_list
from harness.cases.model import (
    SHORT_DTYPE,
    CacheSpec,
    CallSpec,
    Case,
    Dtypes,
    Expect,
    IndicesSpec,
    InputKnobs,
    Options,
    SequenceSpec,
    Shape,
    Tiers,
)

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "cases" / "corpus"

SHAPES = {
    "h3p5n16g3": Shape(3, 5, 16, 3, 64),
    "h11p19n32g1": Shape(11, 19, 32, 1, 64),
    "h4p16n64g2": Shape(4, 16, 64, 2, 128),
    "h8p64n128g2": Shape(8, 64, 128, 2, 128),
    "h2p32n256g1": Shape(2, 32, 256, 1, 256),
    "serving": Shape(64, 64, 128, 1, 256),
}
DTYPES = ("float16", "bfloat16", "float32")

# Context and token counts, symbolic in the chunk size.
CONTEXTS = ("0", "1", "chunk-1", "chunk", "4224")
TOKENS = ("1", "32", "chunk", "2chunk+5", "600", "1600")


def resolve_count(symbol: str, chunk: int) -> int:
    return {"chunk-1": chunk - 1, "chunk": chunk, "2chunk+5": 2 * chunk + 5}.get(symbol) or int(symbol)


# Index layouts: (dtype, block-table (columns, rows_before, init_column, final_column) or None for contiguous).
# Column byte offsets decide pointer alignment: (rows_before * columns + column) * itemsize % 16.
INDEX_LAYOUTS: dict[str, tuple[str, tuple[int, int, int, int] | None]] = {
    "c32": ("int32", None),
    "c64": ("int64", None),
    "bt32_aligned": ("int32", (8, 2, 0, 4)),  # offsets 64, 80
    "bt32_unaligned": ("int32", (5, 1, 1, 2)),  # 24, 28
    "bt32_stride16": ("int32", (16, 0, 0, 5)),  # 0 (aligned), 20 (unaligned)
    "bt64_aligned": ("int64", (4, 1, 0, 2)),  # 32, 48
    "bt64_unaligned": ("int64", (3, 1, 0, 2)),  # 24, 40
    "bt64_stride16": ("int64", (16, 1, 1, 2)),  # 136 (unaligned), 144 (aligned)
}

FINITE_FILL = -7.25  # exact in fp16, bf16 and fp32
DT_LIMITS = {"none": (0.0, float("inf")), "clamp": (0.01, 0.1)}
SHUFFLED_SLOTS = 16


def _seed(case_id: str) -> int:
    return zlib.crc32(case_id.encode()) & 0x7FFFFFFF


def _indices(layout: str, direct: bool) -> IndicesSpec:
    dtype, table = INDEX_LAYOUTS[layout]
    if table is None:
        return IndicesSpec("contiguous", dtype)
    columns, rows_before, init_col, final_col = table
    return IndicesSpec("block_table", dtype, columns, init_col, final_col if direct else None, rows_before)


def _slot_numbers(count: int, numbering: str, case_id: str) -> tuple[int, list[int]]:
    """Cache size and physical slot numbers for ``count`` logical slots; one slot more than used stays untouched."""
    if numbering == "compact":
        return count + 1, list(range(count))
    rng = random.Random(_seed(case_id))
    return SHUFFLED_SLOTS, rng.sample(range(SHUFFLED_SLOTS), count)


def _options(row: dict) -> Options:
    return Options(
        D=row["D"], z=row["z"], dt_bias=row["dt_bias"], dt_softplus=row["softplus"], dt_limit=DT_LIMITS[row["dt_limit"]]
    )


def _cache(row: dict, slots: int) -> CacheSpec:
    return CacheSpec(slots, row["row_pad"], row["offset"], "nan" if row["fill"] == "nan" else FINITE_FILL)


def _finish(case: Case) -> Case:
    """Check the combination with the loader's own rules (a generator bug fails here)."""
    check_combinations(case, {"indices": {k: v for k, v in vars(case.indices).items() if v is not None}})
    return case


def _case(family: str, n: int, row: dict, shape_name: str, sequences, slots: int, final_state: str, text: str) -> Case:
    shape = SHAPES[shape_name]
    case_id = (
        f"{family}-{n:03d}-{SHORT_DTYPE[row['io']]}-{SHORT_DTYPE[row['state']]}-{shape_name}"
    )
    return _finish(
        Case(
            id=case_id,
            description=text,
            seed=_seed(case_id),
            shape=shape,
            dtype=Dtypes(row["io"], row["state"]),
            options=_options(row),
            sequences=tuple(sequences),
            cache=_cache(row, slots),
            indices=_indices(row["index"], final_state == "direct"),
            call=CallSpec(final_state, "auto"),
            checks=("all",),
            expect=Expect(),
            inputs=InputKnobs(),
            tiers=Tiers(),
            family=family,
        )
    )


def _common_axes(shapes: tuple[str, ...]) -> dict[str, tuple]:
    return {
        "io": DTYPES,
        "state": DTYPES,
        "shape": shapes,
        "index": tuple(INDEX_LAYOUTS),
        "row_pad": (0, 64, 3),
        "offset": (0, 8, 5),
        "fill": ("nan", "finite"),
        "numbering": ("compact", "shuffled"),
        "D": ("none", "per_head", "per_channel"),
        "z": (False, True),
        "dt_bias": (False, True),
        "softplus": (False, True),
        "dt_limit": tuple(DT_LIMITS),
    }


def _describe(row: dict, keys: tuple[str, ...]) -> str:
    return "; ".join(f"{k}={row[k]}" for k in keys)


# --- single sequence, direct writeback (indexed-eligible) ---

ARRANGEMENTS = ("inplace", "distinct", "masked", "negative_final")


def _single_sequence(row: dict, case_id_hint: str) -> tuple[list[SequenceSpec], int]:
    chunk = SHAPES[row["shape"]].chunk_size
    context = resolve_count(row["context"], chunk)
    tokens = resolve_count(row["tokens"], chunk)
    slots, (a, b) = _slot_numbers(2, row["numbering"], case_id_hint)
    arrangement = row["arrangement"]
    init, final = {"inplace": (a, a), "distinct": (a, b), "masked": (a, a), "negative_final": (a, -1)}[arrangement]
    return [SequenceSpec(context, tokens, init, arrangement != "masked", final)], slots


def _single_valid(row: dict) -> bool:
    # A masked sequence is a new one (no cached context), as vLLM sets has_initial_state = context > 0.
    if "arrangement" in row and "context" in row:
        if (row["arrangement"] == "masked") != (row["context"] == "0"):
            return False
    return True


def direct_family() -> list[Case]:
    family = "direct"
    axes = {
        **_common_axes(tuple(SHAPES)),
        "arrangement": ARRANGEMENTS,
        "context": CONTEXTS,
        "tokens": TOKENS,
    }
    rows = covering_rows(axes, groups=[("io", "state", "shape")], valid=_single_valid)
    cases = []
    for n, row in enumerate(rows):
        hint = f"{family}-{n:03d}"
        seqs, slots = _single_sequence(row, hint)
        text = "one sequence, direct writeback (indexed-eligible): " + _describe(
            row, ("arrangement", "context", "tokens", "index", "row_pad", "offset", "fill", "numbering")
        )
        cases.append(_case(family, n, row, row["shape"], seqs, slots, "direct", text))
    return cases


# --- several sequences with direct writeback (snapshot path only) ---

# Logical slot patterns: (init, has_state, final) per sequence; logical slot numbers map to physical ones.
MULTI_PATTERNS = {
    "crossed2": [(0, True, 1), (1, True, 0)],  # a->b, b->a: each reads the slot the other writes
    "cycle3": [(0, True, 1), (1, True, 2), (2, True, 0)],
    "shared_init": [(0, True, 1), (0, True, 2)],  # two sequences continue from one cached prefix
    "mixed3": [(0, True, 0), (1, False, 1), (2, True, -1)],  # in place, masked new sequence, padded
}
TOKEN_MIXES = {"short": ("32", "1", "5"), "chunky": ("chunk", "2chunk+5", "1"), "serving": ("32", "600", "1600")}
CONTEXT_MIXES = {"unaligned": ("1", "chunk-1", "4224"), "aligned": ("chunk", "4224", "chunk")}


def _multi_sequences(row: dict, pattern: list[tuple[int, bool, int]], hint: str) -> tuple[list[SequenceSpec], int]:
    chunk = SHAPES[row["shape"]].chunk_size
    logical = sorted({s for init, _, final in pattern for s in (init, final) if s >= 0})
    slots, physical = _slot_numbers(len(logical), row["numbering"], hint)
    phys = dict(zip(logical, physical, strict=True))
    seqs = []
    for b, (init, has_state, final) in enumerate(pattern):
        context = resolve_count(CONTEXT_MIXES[row["contexts"]][b], chunk) if has_state else 0
        tokens = resolve_count(TOKEN_MIXES[row["tokens"]][b], chunk)
        seqs.append(SequenceSpec(context, tokens, phys[init], has_state, phys[final] if final >= 0 else final))
    return seqs, slots


def multi_family() -> list[Case]:
    axes = {
        **_common_axes(tuple(SHAPES)),
        "pattern": tuple(MULTI_PATTERNS),
        "contexts": tuple(CONTEXT_MIXES),
        "tokens": tuple(TOKEN_MIXES),
    }
    cases = []
    for n, row in enumerate(covering_rows(axes)):
        hint = f"multi-{n:03d}"
        seqs, slots = _multi_sequences(row, MULTI_PATTERNS[row["pattern"]], hint)
        text = "several sequences, direct writeback (snapshot path): " + _describe(
            row, ("pattern", "contexts", "tokens", "index", "row_pad", "offset", "fill", "numbering")
        )
        cases.append(_case("multi", n, row, row["shape"], seqs, slots, "direct", text))
    return cases


# --- checkpoint and returned final states (nothing written to the cache) ---

FALLBACK_PATTERNS = {
    "single": [(0, True, -1)],
    "single_masked": [(0, False, -1)],
    "pair": [(0, True, -1), (1, False, -1)],
    "shared_init3": [(0, True, -1), (0, True, -1), (1, True, -1)],
}


def fallback_family() -> list[Case]:
    axes = {
        **_common_axes(tuple(SHAPES)),
        "call": ("checkpoint", "returned"),
        "pattern": tuple(FALLBACK_PATTERNS),
        "contexts": tuple(CONTEXT_MIXES),
        "tokens": tuple(TOKEN_MIXES),
    }
    cases = []
    for n, row in enumerate(covering_rows(axes)):
        hint = f"fallback-{n:03d}"
        seqs, slots = _multi_sequences(row, FALLBACK_PATTERNS[row["pattern"]], hint)
        seqs = [replace(s, final_slot=None) for s in seqs]
        text = f"{row['call']} final states (ineligible for indexed): " + _describe(
            row, ("pattern", "contexts", "tokens", "index", "row_pad", "offset", "fill", "numbering")
        )
        cases.append(_case("fallback", n, row, row["shape"], seqs, slots, row["call"], text))
    return cases


# --- index layouts for the gather warmup: dtype x stride class x alignment (direct and checkpoint alternate) ---


def _layout_spec(dtype: str, stride: str, aligned: bool, direct: bool) -> IndicesSpec:
    """Block-table (or contiguous) indices whose column views have the requested stride class and alignment."""
    if stride == "1":
        if aligned:
            return IndicesSpec("contiguous", dtype)
        return IndicesSpec("block_table", dtype, 1, 0, 0 if direct else None, 1)  # offset of one element
    item = 4 if dtype == "int32" else 8
    if stride == "16":
        cols = (16 // item, 32 // item) if aligned else (1, 3)
        return IndicesSpec("block_table", dtype, 16, cols[0], cols[1] if direct else None, 0)
    if dtype == "int32":  # stride 6
        cols = (0, 4) if aligned else (1, 2)
        return IndicesSpec("block_table", dtype, 6, cols[0], cols[1] if direct else None, 0)
    if aligned:  # int64, stride 3
        return IndicesSpec("block_table", dtype, 3, 0, 2 if direct else None, 0)
    return IndicesSpec("block_table", dtype, 3, 0, 2 if direct else None, 1)


def index_layouts_family() -> list[Case]:
    cases = []
    n = 0
    for dtype in ("int32", "int64"):
        for stride in ("1", "16", "other"):
            for aligned in (True, False):
                for call in (("direct", "checkpoint")[n % 2],):
                    direct = call == "direct"
                    idx = _layout_spec(dtype, stride, aligned, direct)
                    in_place = idx.init_column is not None and idx.init_column == idx.final_column
                    io, state = DTYPES[n % 3], DTYPES[(n // 3) % 3]
                    # Interpreter-sized, and every item runs on the CPU tier (tiers.cpu: true): the gather
                    # warmup's layouts are checked on both tiers.
                    shape_name = ("h3p5n16g3", "h4p16n64g2")[(n // 2) % 2]
                    chunk = SHAPES[shape_name].chunk_size
                    if in_place:
                        seqs = [SequenceSpec(chunk - 1, 5, 2, True, 2), SequenceSpec(1, 12, 0, True, 0)]
                    else:
                        seqs = [SequenceSpec(chunk - 1, 5, 2, True, 0), SequenceSpec(1, 12, 0, True, 2)]
                    if not direct:
                        seqs = [replace(s, final_slot=None) for s in seqs]
                    alignment = "aligned" if aligned else "unaligned"
                    case_id = f"index_layouts-{n:03d}-{dtype}-stride{stride}-{alignment}-{call}"
                    text = (
                        f"gather warmup: {dtype} indices, stride class {stride}, "
                        f"{'16-byte aligned' if aligned else 'unaligned'} column pointers, {call} call"
                    )
                    cases.append(
                        _finish(
                            Case(
                                id=case_id, description=text, seed=_seed(case_id), shape=SHAPES[shape_name],
                                dtype=Dtypes(io, state), options=Options(D="per_head", z=n % 2 == 0),
                                sequences=tuple(seqs), cache=CacheSpec(4, 16, 8, "nan"), indices=idx,
                                call=CallSpec(call, "auto"), checks=("all",), expect=Expect(), inputs=InputKnobs(),
                                tiers=Tiers(cpu=True), family="index_layouts",
                            )
                        )
                    )
                    n += 1
    return cases


# --- the serving workloads of the PR ---


def serving_family() -> list[Case]:
    """Granite-like serving shape: 4224-token cached prefix + 32 (B=1, direct) and the mixed prefill (B=3)."""
    shape = SHAPES["serving"]
    workloads: list[tuple[str, str, str, list[SequenceSpec], str]] = []
    for io, state in (("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float16", "float16"),
                      ("float32", "float32")):
        workloads.append(("short", io, state, [SequenceSpec(4224, 32, 5, True, 5)], "direct"))
    workloads += [
        ("short_new", "bfloat16", "bfloat16", [SequenceSpec(0, 32, 9, False, 9)], "direct"),
        ("long", "bfloat16", "bfloat16", [SequenceSpec(4224, 1600, 3, True, 11)], "direct"),
        ("mixed", "bfloat16", "bfloat16",
         [SequenceSpec(4224, 32, 1, True), SequenceSpec(4224, 600, 7, True), SequenceSpec(4224, 1600, 12, True)],
         "checkpoint"),
        ("mixed", "bfloat16", "bfloat16",
         [SequenceSpec(4224, 128, 1, True, 4), SequenceSpec(4224, 32, 4, True, 1), SequenceSpec(0, 600, 6, False, 6)],
         "direct"),
        ("mixed", "bfloat16", "float32",
         [SequenceSpec(4224, 32, 1, True), SequenceSpec(4224, 1600, 7, True)], "returned"),
    ]
    cases = []
    for n, (name, io, state, seqs, call) in enumerate(workloads):
        case_id = f"serving-{n:03d}-{name}-{call}-{SHORT_DTYPE[io]}-{SHORT_DTYPE[state]}"
        text = f"serving shape, {name} workload ({'+'.join(str(s.tokens) for s in seqs)} new tokens), {call} call"
        cases.append(
            _finish(
                Case(
                    id=case_id, description=text, seed=_seed(case_id), shape=shape, dtype=Dtypes(io, state),
                    options=Options(D="per_head", z=True, dt_bias=True, dt_softplus=True),
                    sequences=tuple(seqs), cache=CacheSpec(16, 0, 0, "nan"),
                    indices=IndicesSpec("block_table", "int32", 4, 0, 1 if call == "direct" else None, 0),
                    call=CallSpec(call, "auto"), checks=("all",), expect=Expect(), inputs=InputKnobs(),
                    tiers=Tiers(), family="serving",
                )
            )
        )
    return cases


FAMILIES = {
    "direct": (direct_family, "One sequence with direct writeback (indexed-eligible): pairwise over all axes, all "
                              "dtype x shape triples."),
    "multi": (multi_family, "Several sequences with direct writeback (snapshot path): crossed, cyclic, shared slots."),
    "fallback": (fallback_family, "Checkpoint and returned final states (ineligible for the indexed path)."),
    "index_layouts": (index_layouts_family, "Index dtype x stride class x pointer alignment (gather warmup)."),
    "serving": (serving_family, "The serving shape with the workloads of the PR."),
}


def corpus() -> dict[str, list[Case]]:
    """Every family's cases, in a stable order."""
    return {name: make() for name, (make, _) in FAMILIES.items()}


def generate_corpus(out_dir: str | Path = DEFAULT_OUT) -> list[Path]:
    """Write one YAML file per family into ``out_dir``; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = "# Generated by `python -m harness.cases.generate`; do not edit (regenerate instead).\n"
    written = []
    for name, cases in corpus().items():
        path = out_dir / f"{name}.yaml"
        path.write_text(header + dump_case_list(cases, FAMILIES[name][1]))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else DEFAULT_OUT
    paths = generate_corpus(out)
    total: dict[str, Any] = {}
    from harness.cases.loader import load_cases

    cases = load_cases(paths)
    total["cases"] = len(cases)
    from harness.checks.tiers import cpu_tier_items

    total["cpu"], total["items"] = cpu_tier_items(cases)
    print(f"wrote {len(paths)} files to {out}: {total['cases']} cases, {total['items']} items, {total['cpu']} of them "
          f"in the CPU tier")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
