"""Load ``ssd-case/1`` YAML files into ``Case`` objects, rejecting anything malformed or impossible.

Every rejection is a ``CaseError`` naming the file, the key path, what was expected and what was found, raised when
the file is collected (docs/cases.md). ``dump_case`` writes YAML that loads back to an equal ``Case``.

Each file is read once (at most MAX_FILE_BYTES of UTF-8) and parsed once; what YAML itself cannot express wrongly
(a key that is a list, a number too long to read or overflowing a float) is refused while parsing, with its line;
the schema and the combination and size rules (harness.cases.limits) then name the key.
"""

from __future__ import annotations

import codecs
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
import yaml

from harness.cases.files import case_files
from harness.cases.limits import check_input_ranges, check_sizes
from harness.cases.model import (
    SCHEMA_ID,
    TORCH_DTYPES,
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
    default_family,
)
from harness.cases.schema import CaseError, SchemaViolation, describe, validate

# A case file is read whole and parsed into Python objects (~30 bytes of memory per byte of YAML, 1-2 s of CPU per
# MB), by every pytest worker at collection. The largest generated file is ~60 KB; 1 MiB leaves room for ~2,000
# cases in one file and keeps the worst file to about a second, where a stray 50 MB file would cost each worker over
# a minute and 1.5 GB. A larger corpus is split into several files.
MAX_FILE_BYTES = 2**20
_MAX_INT_CHARS = 4300  # Python's default limit on reading a decimal integer (sys.get_int_max_str_digits)


class _ValueProblem(yaml.constructor.ConstructorError):
    """A scalar or key YAML reads but no case can hold, with what was expected and found (not YAML's wording)."""

    def __init__(self, expected: str, found: str, mark):
        super().__init__(None, None, f"expected {expected}, found {found}", mark)
        self.expected, self.found = expected, found


def _strict(base: type) -> type:
    """A loader on ``base`` that refuses repeated mapping keys (PyYAML silently keeps the last one), keys that are
    lists or mappings, merge keys (``<<``), integers too long for Python to read, and floats that overflow to
    infinity."""

    def construct_mapping(loader, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                kind = "a list" if isinstance(key_node, yaml.SequenceNode) else "a mapping"
                raise _ValueProblem("a key that is a name or a number", f"{kind} as a key", key_node.start_mark)
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor``: keys that the file does not show
                raise _ValueProblem("every key written out where it applies (YAML merge keys are not read: each "
                                    "case states its own keys, so the file shows what runs)",
                                    f"the merge key {key_node.value!r}", key_node.start_mark)
            key = loader.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} repeated (first on line {seen[key] + 1})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line
        mapping = base.construct_mapping(loader, node, deep=deep)
        loader.mapping_lines[id(mapping)] = node.start_mark.line  # where a case starts, for reports (_load)
        return mapping

    def construct_int(loader, node: yaml.ScalarNode) -> int:
        # Python refuses to read longer decimal integers, and a long base-60 literal (1:2:3:...) costs quadratic
        # time to build; no key takes an integer anywhere near this long.
        if len(node.value) > _MAX_INT_CHARS:
            raise _ValueProblem(f"an integer of at most {_MAX_INT_CHARS} characters",
                                f"an integer of {len(node.value)} characters", node.start_mark)
        return yaml.constructor.SafeConstructor.construct_yaml_int(loader, node)

    def construct_float(loader, node: yaml.ScalarNode) -> float:
        value = yaml.constructor.SafeConstructor.construct_yaml_float(loader, node)
        if math.isinf(value) and "inf" not in node.value.lower():
            raise _ValueProblem("a number a 64-bit float can hold (.inf for infinity)",
                                f"{describe(node.value)}, which overflows to infinity", node.start_mark)
        return value

    def __init__(loader, stream) -> None:
        base.__init__(loader, stream)
        loader.mapping_lines = {}  # id of each mapping constructed -> its 0-based first line

    loader = type(f"Strict{base.__name__}", (base,), {"__init__": __init__})
    loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    loader.add_constructor("tag:yaml.org,2002:float", construct_float)
    return loader


# libyaml's parser, where PyYAML has it, reads every file once: parsing the corpus in pure Python took ~1 s of each
# pytest worker's start-up (every worker collects every case). The pure-Python parser words syntax errors better
# (tests/malformed/expected.yaml), so a file libyaml cannot parse is parsed again in Python for the message only.
_StrictLoader = _strict(yaml.SafeLoader)
_FastStrictLoader = _strict(getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _read_text(path: Path) -> str:
    """The file's text: at most MAX_FILE_BYTES of UTF-8 (a byte-order mark allowed)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
            size = os.fstat(fh.fileno()).st_size
    except OSError as e:
        raise CaseError(path, "(file)", "a readable file", f"{type(e).__name__}: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise CaseError(path, "(file)", f"a case file of at most {MAX_FILE_BYTES:,} bytes (split the cases into "
                        "several files: every pytest worker reads every file)", f"{max(size, len(data)):,} bytes")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_start = data.rfind(b"\n", 0, e.start) + 1
        line = data.count(b"\n", 0, e.start) + 1
        raise CaseError(path, f"line {line}", "UTF-8 text",
                        f"byte 0x{data[e.start]:02x}, not UTF-8 (column {e.start - line_start + 1})") from None


def _load(text: str, loader_class: type) -> tuple[Any, dict[int, int]]:
    """What ``yaml.load`` returns, and the 0-based line where each mapping in it starts, by ``id`` of the dict (all
    of them live as long as the data does)."""
    loader = loader_class(text)
    try:
        return loader.get_single_data(), loader.mapping_lines
    finally:
        loader.dispose()


def _parse_yaml(path: Path, text: str) -> tuple[Any, dict[int, int]]:
    """The file's data and the line of each of its mappings (``_load``)."""
    try:
        return _load(text, _FastStrictLoader)
    except yaml.YAMLError as e:
        first: yaml.YAMLError = e
    except RecursionError:  # the pure-Python parser (where PyYAML lacks libyaml) recurses once per nesting level
        raise CaseError(path, "(file)", "YAML nested at most a few hundred levels deep",
                        "nesting too deep to read") from None
    # Every error libyaml reports is checked by the pure-Python parser, which words it better and is the judge: a
    # process that re-imports ``yaml`` (pytester restores sys.modules between in-process runs) keeps the first
    # import's C extension, whose parser then refuses good files ("could not determine a constructor for the tag
    # None"). Only the error path parses twice.
    try:
        return _load(text, _StrictLoader)
    except yaml.YAMLError as e:
        raise _yaml_error(path, text, e) from None
    except RecursionError:
        raise _yaml_error(path, text, first) from None  # nesting past Python's recursion limit: libyaml's words


def _yaml_error(path: Path, text: str, e: yaml.YAMLError) -> CaseError:
    # The pure-Python reader gives a character index into ``text`` (libyaml's own reader errors are shown as is).
    if isinstance(e, yaml.reader.ReaderError) and isinstance(e.character, int) and e.character >= 0:
        line = text.count("\n", 0, e.position) + 1
        column = e.position - (text.rfind("\n", 0, e.position) + 1) + 1
        return CaseError(path, f"line {line}", "valid YAML",
                         f"character U+{e.character:04X}, {e.reason} (column {column})")
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}" if mark is not None else "(file)"
        column = f" (column {mark.column + 1})" if mark is not None else ""
        if isinstance(e, _ValueProblem):
            return CaseError(path, where, e.expected, f"{e.found}{column}")
        return CaseError(path, where, "valid YAML", f"{e.problem or e}{column}")
    return CaseError(path, "(file)", "valid YAML", str(e))


def _float_or_nan_str(value: Any) -> str | float:
    if isinstance(value, str) or (isinstance(value, float) and math.isnan(value)):
        return "nan"
    return float(value)


def _case_from_dict(data: dict, source: Path, index: int, line: int = 0) -> Case:
    """Build a Case from a structurally valid mapping (defaults filled in), found at ``line`` (0-based) of
    ``source``. Combinations are checked afterwards."""
    options = data.get("options", {})
    shape = Shape(**data["shape"])
    sequences = tuple(
        SequenceSpec(
            context=s["context"],
            tokens=s["tokens"],
            init_slot=s["init_slot"],
            has_state=s["has_state"],
            final_slot=s.get("final_slot"),
        )
        for s in data["sequences"]
    )
    cache = data["cache"]
    indices = data.get("indices", {"layout": "contiguous"})
    block = indices["layout"] == "block_table"
    expect = data.get("expect", "pass")
    tiers = data.get("tiers")
    return Case(
        id=data["id"],
        description=data.get("description", ""),
        seed=data["seed"],
        shape=shape,
        dtype=Dtypes(**data["dtype"]),
        options=Options(
            D=options.get("D", "none"),
            z=options.get("z", False),
            dt_bias=options.get("dt_bias", False),
            dt_softplus=options.get("dt_softplus", False),
            dt_limit=tuple(float(v) for v in options.get("dt_limit", (0.0, math.inf))),
        ),
        sequences=sequences,
        cache=CacheSpec(
            slots=cache["slots"],
            row_pad=cache.get("row_pad", 0),
            offset=cache.get("offset", 0),
            fill=_float_or_nan_str(cache.get("fill", "nan")),
        ),
        indices=IndicesSpec(
            layout=indices["layout"],
            dtype=indices.get("dtype", "int32"),
            columns=indices.get("columns"),
            init_column=indices.get("init_column"),
            final_column=indices.get("final_column"),
            rows_before=indices.get("rows_before", 0 if block else None),
        ),
        call=CallSpec(**data.get("call", {})),
        checks=tuple(data.get("checks", ("all",))),
        expect=_expect(expect),
        inputs=InputKnobs(**{k: float(v) for k, v in data.get("inputs", {}).items()}),
        tiers=Tiers(cpu=tiers["cpu"]) if tiers is not None else Tiers(),
        family=data.get("family", default_family(data["id"])),
        source=source,
        index_in_file=index,
        line=line,
    )


def _expect(data: str | dict) -> Expect:
    if data == "pass":
        return Expect("pass")
    providers = data.get("providers")
    fails_with = tuple(data.get("fails_with", Expect.fails_with))
    return Expect("xfail", data["xfail"], tuple(providers) if providers is not None else None, fails_with)


def check_combinations(case: Case, data: dict) -> None:
    """Reject combinations the schema cannot express. Raises ``SchemaViolation`` (key paths relative to the case).

    ``data`` is the raw mapping, used to tell a key that is absent from one set to its default.
    """
    sh = case.shape
    if sh.chunk_size & (sh.chunk_size - 1):
        raise SchemaViolation("shape.chunk_size", "a power of two >= 16", describe(sh.chunk_size))
    if sh.nheads % sh.ngroups:
        raise SchemaViolation("shape.ngroups", f"a divisor of nheads ({sh.nheads})", describe(sh.ngroups))

    lo, hi = case.options.dt_limit
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise SchemaViolation("options.dt_limit", "[low, high] with low <= high", f"[{describe(lo)}, {describe(hi)}]")

    slots = case.cache.slots
    direct = case.call.final_state == "direct"
    masked_slots: dict[int, int] = {}  # slot -> first masked sequence reading it
    stateful_slots: dict[int, int] = {}
    final_owner: dict[int, int] = {}
    for b, s in enumerate(case.sequences):
        at = f"sequences[{b}]"
        if not 0 <= s.init_slot < slots:
            why = "has_state is true" if s.has_state else "a masked sequence still names a slot, which holds NaN"
            raise SchemaViolation(f"{at}.init_slot", f"a slot in [0, {slots}) ({why})", describe(s.init_slot))
        own, other = (stateful_slots, masked_slots) if s.has_state else (masked_slots, stateful_slots)
        if s.init_slot in other:
            raise SchemaViolation(
                f"{at}.init_slot",
                f"a slot not also read with has_state {'false' if s.has_state else 'true'} by "
                f"sequences[{other[s.init_slot]}] (a masked slot holds NaN, a stateful one a state)",
                describe(s.init_slot),
            )
        own.setdefault(s.init_slot, b)
        if direct:
            if s.final_slot is None:
                raise SchemaViolation(
                    f"{at}.final_slot", "an integer (required with call.final_state direct)", "no such key"
                )
            if s.final_slot >= slots:
                raise SchemaViolation(
                    f"{at}.final_slot", f"a slot < {slots} (negative: write nothing)", describe(s.final_slot)
                )
            if s.final_slot >= 0:
                if s.final_slot in final_owner:
                    raise SchemaViolation(
                        f"{at}.final_slot",
                        f"a slot no other sequence writes (sequences[{final_owner[s.final_slot]}] writes it)",
                        describe(s.final_slot),
                    )
                final_owner[s.final_slot] = b
        elif s.final_slot is not None:
            raise SchemaViolation(
                f"{at}.final_slot",
                f"no final_slot (call.final_state is {case.call.final_state!r}: nothing is written to the cache)",
                describe(s.final_slot),
            )

    if case.cache.fill != "nan":
        fill = case.cache.fill
        representable = math.isfinite(fill) and bool(
            torch.isfinite(torch.tensor(fill, dtype=TORCH_DTYPES[case.dtype.state]))
        )
        if not representable:
            raise SchemaViolation(
                "cache.fill", f"'nan' or a finite number representable in {case.dtype.state}", describe(fill)
            )

    _check_indices(case, data.get("indices", {}))

    if case.call.path == "indexed":
        eligible = case.indexed_eligible()
        if not eligible:
            raise SchemaViolation("call.path", f"auto or snapshot (indexed is ineligible: {eligible.reason})",
                                  "'indexed'")

    knobs = case.inputs
    for name, value in vars(knobs).items():
        if not math.isfinite(value):
            raise SchemaViolation(f"inputs.{name}", "a finite number (inputs are drawn from it)", describe(value))
    if knobs.A_max < knobs.A_min:
        raise SchemaViolation("inputs.A_max", f"a number >= A_min ({knobs.A_min})", describe(knobs.A_max))
    if knobs.A_min <= 0:
        raise SchemaViolation("inputs.A_min", "a number > 0 (A = -uniform(A_min, A_max) must be negative)",
                              describe(knobs.A_min))


def _check_indices(case: Case, raw: dict) -> None:
    idx = case.indices
    direct = case.call.final_state == "direct"
    table_keys = ("columns", "init_column", "final_column", "rows_before")
    if idx.layout == "contiguous":
        for key in table_keys:
            if key in raw:
                raise SchemaViolation(f"indices.{key}", f"no {key} with layout contiguous", describe(raw[key]))
        return
    for key in ("columns", "init_column") + (("final_column",) if direct else ()):
        if key not in raw:
            raise SchemaViolation(f"indices.{key}", "an integer (required with layout block_table)", "no such key")
    if not direct and "final_column" in raw:
        raise SchemaViolation(
            "indices.final_column",
            f"no final_column (call.final_state is {case.call.final_state!r}: there are no final indices)",
            describe(raw["final_column"]),
        )
    for key in ("init_column", "final_column"):
        col = getattr(idx, key)
        if col is not None and col >= idx.columns:
            raise SchemaViolation(f"indices.{key}", f"a column in [0, {idx.columns})", describe(col))
    if direct and idx.init_column == idx.final_column:
        if any(s.init_slot != s.final_slot for s in case.sequences):
            raise SchemaViolation(
                "indices.final_column",
                f"a column other than init_column ({idx.init_column}) unless every sequence has "
                "init_slot == final_slot (one column holds one slot per sequence)",
                describe(idx.final_column),
            )


def _case_error(path: Path, prefix: str, v: SchemaViolation) -> CaseError:
    key = v.key_path if not prefix else (f"{prefix}.{v.key_path}" if v.key_path != "(top level)" else prefix)
    return CaseError(path, key, v.expected, v.found)


def load_case_file(path: str | Path) -> list[Case]:
    """All cases of one file (a single case, or a list under ``cases:``), validated."""
    return _load_file(Path(path))[0]


def _load_file(path: Path) -> tuple[list[Case], bool]:
    """The file's cases and whether they were listed under ``cases:`` (for key paths in errors)."""
    data, lines = _parse_yaml(path, _read_text(path))
    if not isinstance(data, dict):
        raise CaseError(path, "(top level)", "a mapping", describe(data))
    # The schema id comes first: a file of another schema should not be judged by this one's keys.
    if "schema" not in data:
        raise CaseError(path, "schema", repr(SCHEMA_ID), "no such key")
    if data["schema"] != SCHEMA_ID:
        raise CaseError(path, "schema", repr(SCHEMA_ID), describe(data["schema"]))
    try:
        validate(data)
    except SchemaViolation as v:
        raise _case_error(path, "", v) from None
    items = [(data, "")] if "cases" not in data else [(c, f"cases[{i}]") for i, c in enumerate(data["cases"])]
    cases: list[Case] = []
    first_index: dict[str, int] = {}
    for i, (item, prefix) in enumerate(items):
        case = _case_from_dict(item, path, i, lines.get(id(item), 0))
        try:
            check_combinations(case, item)
            check_sizes(case)
            check_input_ranges(case)
        except SchemaViolation as v:
            raise _case_error(path, prefix, v) from None
        if case.id in first_index:
            raise CaseError(
                path, _join(prefix, "id"), "an id unique across the corpus",
                f"{case.id!r} again (also cases[{first_index[case.id]}])",
            )
        first_index[case.id] = i
        cases.append(case)
    return cases, "cases" in data


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


@dataclass
class LoadedFiles:
    """The cases of every good file, and one error per bad file."""

    cases: list[Case]
    errors: list[CaseError]


def load_each(files: Iterable[str | Path]) -> LoadedFiles:
    """Load each file once; a bad file becomes its error and the others still load. An id already used by an earlier
    file makes the later file bad (as pytest collects it: the first file's cases keep their id)."""
    cases: list[Case] = []
    errors: list[CaseError] = []
    seen: dict[str, Case] = {}
    for f in map(Path, files):
        try:
            file_cases, listed = _load_file(f)
            for case in file_cases:
                if case.id in seen:
                    key = f"cases[{case.index_in_file}].id" if listed else "id"
                    raise CaseError(
                        f, key, "an id unique across the corpus",
                        f"{case.id!r}, already used in {seen[case.id].source}",
                    )
        except CaseError as exc:
            errors.append(exc)
            continue
        seen.update((case.id, case) for case in file_cases)
        cases.extend(file_cases)
    return LoadedFiles(cases, errors)


def load_cases(paths: Iterable[str | Path]) -> list[Case]:
    """Cases from files and directories (``harness.cases.files``); ids must be unique across all of them. Raises the
    first bad file's ``CaseError``."""
    loaded = load_each(case_files(paths))
    if loaded.errors:
        raise loaded.errors[0]
    return loaded.cases


def case_to_dict(case: Case, with_schema: bool = True) -> dict:
    """The mapping ``dump_case`` writes: every key explicit except inputs at their defaults, a derived family and
    tiers left to the CPU tier's estimate."""
    out: dict[str, Any] = {"schema": SCHEMA_ID} if with_schema else {}
    out["id"] = case.id
    if case.family != default_family(case.id):
        out["family"] = case.family
    out["description"] = case.description
    out["seed"] = case.seed
    sh = case.shape
    out["shape"] = {
        "nheads": sh.nheads, "headdim": sh.headdim, "dstate": sh.dstate, "ngroups": sh.ngroups,
        "chunk_size": sh.chunk_size,
    }
    out["dtype"] = {"io": case.dtype.io, "state": case.dtype.state}
    o = case.options
    out["options"] = {"D": o.D, "z": o.z, "dt_bias": o.dt_bias, "dt_softplus": o.dt_softplus,
                      "dt_limit": list(o.dt_limit)}
    seqs = []
    for s in case.sequences:
        d = {"context": s.context, "tokens": s.tokens, "init_slot": s.init_slot, "has_state": s.has_state}
        if s.final_slot is not None:
            d["final_slot"] = s.final_slot
        seqs.append(d)
    out["sequences"] = seqs
    c = case.cache
    out["cache"] = {"slots": c.slots, "row_pad": c.row_pad, "offset": c.offset, "fill": c.fill}
    idx = case.indices
    out["indices"] = {"layout": idx.layout, "dtype": idx.dtype}
    if idx.layout == "block_table":
        out["indices"].update(columns=idx.columns, init_column=idx.init_column)
        if idx.final_column is not None:
            out["indices"]["final_column"] = idx.final_column
        out["indices"]["rows_before"] = idx.rows_before
    out["call"] = {"final_state": case.call.final_state, "path": case.call.path}
    out["checks"] = list(case.checks)
    out["expect"] = _expect_to_dict(case.expect)
    knobs = {k: v for k, v in vars(case.inputs).items() if v != getattr(InputKnobs(), k)}
    if knobs:
        out["inputs"] = knobs
    if case.tiers.cpu is not None:
        out["tiers"] = {"cpu": case.tiers.cpu}
    return out


def _expect_to_dict(expect: Expect) -> str | dict:
    if expect.kind == "pass":
        return "pass"
    out: dict[str, Any] = {"xfail": expect.reason}
    if expect.providers is not None:
        out["providers"] = list(expect.providers)
    if expect.fails_with != Expect.fails_with:
        out["fails_with"] = list(expect.fails_with)
    return out


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120, allow_unicode=False)


def dump_case(case: Case) -> str:
    """A one-case YAML file that loads back to a Case equal to ``case``."""
    return _dump(case_to_dict(case))


def dump_case_list(cases: Iterable[Case], description: str) -> str:
    """A YAML file holding ``cases`` under ``cases:`` (the generator's one-file-per-family form)."""
    return _dump({"schema": SCHEMA_ID, "description": description, "cases": [case_to_dict(c, False) for c in cases]})
