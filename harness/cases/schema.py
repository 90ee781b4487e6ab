"""The ``ssd-case/1`` schema as a JSON Schema document, and a small validator for the subset of JSON Schema it uses.

The same dict is written to ``cases/schema/ssd-case-1.schema.json`` for editors and interpreted here by our own
code: ``jsonschema`` is not installed on the GPU runner, so it is never a runtime dependency (a CPU-only test checks
that both agree). Structural rules live here; combinations the schema cannot express (a slot out of range, ngroups
not dividing nheads, ...) are checked by ``harness.cases.loader``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from harness.cases.model import (
    D_MODES,
    EXPECT_KINDS,
    FAILURE_KINDS,
    FINAL_STATE_MODES,
    INDEX_DTYPES,
    INDEX_LAYOUTS,
    IO_DTYPES,
    PATHS,
    SCHEMA_ID,
    STATE_DTYPES,
)

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "cases" / "schema" / "ssd-case-1.schema.json"
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
FAMILY_PATTERN = r"^[a-z0-9_]+$"
CHECK_PATTERN = r"^[a-z0-9_]+$"
# A provider as ``--provider`` names it: module:attr, both possibly dotted (harness.checks.providers).
PROVIDER_SPEC_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$"


class CaseError(ValueError):
    """A case file that cannot be used: which file, where in it, what was expected and what was found."""

    def __init__(self, file: str | Path, key_path: str, expected: str, found: str):
        self.file = str(file)
        self.key_path = key_path
        self.expected = expected
        self.found = found
        super().__init__(f"{self.file}: {key_path}: expected {expected}, found {found}")


class SchemaViolation(Exception):
    """Raised by ``validate`` without a file name; the loader turns it into a ``CaseError``."""

    def __init__(self, key_path: str, expected: str, found: str):
        super().__init__(key_path, expected, found)
        self.key_path, self.expected, self.found = key_path, expected, found


def _int(minimum: int | None = None, maximum: int | None = None, *, doc: str) -> dict:
    node: dict[str, Any] = {"type": "integer", "description": doc}
    if minimum is not None:
        node["minimum"] = minimum
    if maximum is not None:
        node["maximum"] = maximum
    return node


def _obj(properties: dict, required: tuple[str, ...] = (), *, doc: str) -> dict:
    node: dict[str, Any] = {
        "type": "object", "description": doc, "properties": properties, "additionalProperties": False,
    }
    if required:
        node["required"] = list(required)
    return node


# Every count, length, offset and index of a case is at most INT32_MAX: the call passes token offsets, chunk offsets
# and slot ids in int32 tensors (Mamba2's metadata, and the default index dtype), so no larger value can be a valid
# call. Bounding each integer here also turns a 400-digit number into an error naming its key. Whether the tensors a
# case implies fit a device is checked from their products (harness.cases.limits).
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def _count(minimum: int, *, doc: str) -> dict:
    return _int(minimum, INT32_MAX, doc=doc)


_NUMBER = {"type": "number"}  # an array item or anyOf branch: not a property, so no description of its own


def _enum(values: tuple[str, ...], *, doc: str) -> dict:
    return {"enum": list(values), "description": doc}


def _bool(doc: str) -> dict:
    return {"type": "boolean", "description": doc}


def _number(minimum: float | None = None, *, doc: str) -> dict:
    node: dict[str, Any] = {"type": "number", "description": doc}
    if minimum is not None:
        node["minimum"] = minimum
    return node


# Every property carries a ``description`` (editors show it; tests/test_docs.py requires it). Defaults named here
# are the loader's (harness.cases.loader._case_from_dict) and the builder's (harness.cases.model.InputKnobs); the
# field reference with the rejected combinations is docs/cases.md.
CASE_PROPERTIES: dict[str, Any] = {
    "id": {
        "type": "string", "pattern": ID_PATTERN,
        "description": "Unique across every case file collected together; the pytest item is <file>::<id>::<check>.",
    },
    "description": {
        "type": "string",
        "description": "Free text for readers of the file; the harness does not interpret it. Default: empty.",
    },
    "family": {
        "type": "string", "pattern": FAMILY_PATTERN,
        "description": "Group name carried into reports (JSON, JUnit property, harness times --by family). "
                       "Default: the id up to its first '-'.",
    },
    "seed": _int(0, 2**63 - 1, doc="Every tensor is drawn on the CPU from generators seeded by this and the tensor's "
                                   "name, then copied to the device."),
    "shape": _obj(
        {
            "nheads": _count(1, doc="H: SSM heads."),
            "headdim": _count(1, doc="P: channels per head."),
            "dstate": _count(1, doc="N: state size per channel."),
            "ngroups": _count(1, doc="G: B/C groups; must divide nheads (head h uses group h // (nheads // ngroups))."),
            "chunk_size": _count(16, doc="Q: tokens per chunk; a power of two >= 16."),
        },
        ("nheads", "headdim", "dstate", "ngroups", "chunk_size"),
        doc="Model dimensions of the call.",
    ),
    "dtype": _obj(
        {
            "io": _enum(IO_DTYPES, doc="dtype of x, B, C, z and out (dt, A, D, dt_bias are always float32)."),
            "state": _enum(STATE_DTYPES, doc="dtype of the state cache (and of the provider's state workspace)."),
        },
        ("io", "state"),
        doc="Tensor dtypes.",
    ),
    "options": _obj(
        {
            "D": _enum(D_MODES, doc="Skip connection D: none, per_head (H,) or per_channel (H, P). Default: none."),
            "z": _bool("Pass a gate z (T, H, P): out *= z * sigmoid(z). Default: false."),
            "dt_bias": _bool("Pass dt_bias (H,), added to dt before softplus. Default: false."),
            "dt_softplus": _bool("Apply softplus to dt (+ dt_bias). Default: false."),
            "dt_limit": {
                "type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2,
                "description": "[low, high] clamp of the processed dt, low <= high (.inf allowed). "
                               "Default: [0.0, .inf] (no clamp).",
            },
        },
        doc="Optional inputs and dt processing. Default: every option off.",
    ),
    "sequences": {
        "type": "array",
        "minItems": 1,
        "description": "The batch, in order: one entry per sequence.",
        "items": _obj(
            {
                "context": _count(0, doc="Tokens already processed (in the cache); sets the chunk alignment."),
                "tokens": _count(1, doc="New tokens of this call."),
                "init_slot": _int(INT32_MIN, INT32_MAX, doc="Cache slot the initial state is read from; in "
                                      "[0, cache.slots) even when has_state is false (the slot then holds NaN)."),
                "has_state": _bool("false: the initial state is masked (must act as zeros) and its slot holds NaN."),
                "final_slot": _int(INT32_MIN, INT32_MAX, doc="Slot the final state is written to; required with "
                                       "call.final_state direct and forbidden otherwise; negative: padded sequence, "
                                       "nothing is written."),
            },
            ("context", "tokens", "init_slot", "has_state"),
            doc="One sequence of the batch.",
        ),
    },
    "cache": _obj(
        {
            "slots": _count(1, doc="Slots of the paged state cache (slots, H, P, N)."),
            "row_pad": _count(0, doc="Extra elements after each slot row: stride(0) = H*P*N + row_pad. Default: 0."),
            "offset": _count(0, doc="Storage offset (elements) of slot 0 in the backing storage. Default: 0."),
            "fill": {
                "anyOf": [{"const": "nan"}, _NUMBER],
                "description": "Value of every storage element outside the slot rows (gaps, bytes before the "
                               "offset): 'nan' or a finite number representable in the state dtype. Default: nan.",
            },
        },
        ("slots",),
        doc="Layout of the state cache's backing storage.",
    ),
    "indices": _obj(
        {
            "layout": _enum(INDEX_LAYOUTS, doc="contiguous: (batch,) tensors; block_table: columns of a "
                                               "(rows_before + batch, columns) table (strided, possibly unaligned)."),
            "dtype": _enum(INDEX_DTYPES, doc="dtype of the slot index tensors. Default: int32."),
            "columns": _count(1, doc="block_table only (required): columns of the table, i.e. the index stride."),
            "init_column": _count(0, doc="block_table only (required): column holding the initial slots."),
            "final_column": _count(0, doc="block_table only: column holding the final slots; required with "
                                        "call.final_state direct, forbidden otherwise."),
            "rows_before": _count(0, doc="block_table only: table rows before the batch's rows (shifts the column "
                                       "view's address). Default: 0."),
        },
        ("layout",),
        doc="How the slot index tensors are laid out. Default: {layout: contiguous, dtype: int32}.",
    ),
    "call": _obj(
        {
            "final_state": _enum(FINAL_STATE_MODES, doc="direct: write final states into final_slot, return None; "
                                                        "returned: return (batch, H, P, N); checkpoint: return "
                                                        "(nchunks, H, P, N) chunk-end states. Default: direct."),
            "path": _enum(PATHS, doc="Initial-state path passed to ssd_prefill; indexed only for one sequence with "
                                     "direct writeback. Default: auto."),
        },
        doc="How ssd_prefill is called. Default: {final_state: direct, path: auto}.",
    ),
    "checks": {
        "type": "array",
        "minItems": 1,
        "uniqueItems": True,
        "items": {"type": "string", "pattern": CHECK_PATTERN},
        "description": "Registered check names, or [all]: every check that applies to the case. A named check that "
                       "does not apply is skipped with the reason. Default: [all].",
    },
    "expect": {
        "anyOf": [
            {"const": "pass"},
            _obj({"xfail": {"type": "string", "minLength": 1,
                            "description": "Why the case fails, with an issue or commit reference."},
                  "providers": {
                      "type": "array", "minItems": 1, "uniqueItems": True,
                      "items": {"type": "string", "pattern": PROVIDER_SPEC_PATTERN},
                      "description": "The providers the xfail applies to, as --provider names them (module:attr, "
                                     "e.g. peers.vllm_ssd:provider); with any other provider the case must pass. "
                                     "Default: every provider.",
                  },
                  "fails_with": {
                      "type": "array", "minItems": 1, "uniqueItems": True,
                      "items": {"enum": list(FAILURE_KINDS)},
                      "description": "The kinds of failure the xfail excuses: mismatch (a check's wrong result), "
                                     "exception (the provider raised), exit (its process died or exited), "
                                     "timeout (it ran past the item time limit). Any other kind is an error as "
                                     "under pass. Default: [mismatch].",
                  }},
                 ("xfail",), doc="A known failure."),
        ],
        "description": "pass, or {xfail: reason} (optionally for some providers only: {xfail: reason, providers: "
                       "[module:attr, ...]}): failures of the kinds in fails_with (default: a mismatch) then count "
                       "as expected, any other failure is an error, and a pass fails (strict). Default: pass.",
    },
    "inputs": _obj(
        {
            "dt_offset": _number(doc="Centre of dt: the pre-softplus value (or dt_bias centre) with softplus, "
                                     "log(dt) without. Default: -3.0."),
            "dt_scale": _number(0, doc="Spread of dt's normal noise. Default: 0.5."),
            "x_scale": _number(0, doc="x = randn * x_scale. Default: 1.0."),
            "bc_scale": _number(0, doc="B, C = randn * bc_scale. Default: 1.0."),
            "state_scale": _number(0, doc="Slot rows = randn * state_scale. Default: 1.0."),
            "A_min": _number(0, doc="A = -uniform(A_min, A_max) per head; A_min > 0. Default: 1.0."),
            "A_max": _number(0, doc="Upper end of -A; A_max >= A_min. Default: 16.0."),
        },
        doc="How the builder draws tensors; omitted knobs keep their defaults (changing a default changes every "
            "case's tensors).",
    ),
    "tiers": _obj({"cpu": _bool("true: every item of the case runs on the CPU interpreter tier; false: none does "
                                "(each is skipped there with the reason).")},
                  ("cpu",),
                  doc="Which tiers run the case. Without it, each item runs on the CPU tier when its estimated "
                      "interpreter time is within the limit (harness.checks.tiers, docs/checks.md#tiers); the GPU "
                      "tier runs every item."),
}
CASE_REQUIRED = ("id", "seed", "shape", "dtype", "sequences", "cache")
assert set(EXPECT_KINDS) == {"pass", "xfail"}  # the expect node above spells both forms

_SCHEMA_PROPERTY = {
    "const": SCHEMA_ID,
    "description": "The schema id, always ssd-case/1 (checked before anything else in the file).",
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://ssd-harness.invalid/schema/ssd-case-1.schema.json",
    "title": "Mamba2 SSD prefill harness case (ssd-case/1)",
    "description": "One case per file, or a list of cases under 'cases:'. Field reference: docs/cases.md.",
    "type": "object",
    "if": {"required": ["cases"]},
    "then": {"$ref": "#/$defs/case_list_file"},
    "else": {"$ref": "#/$defs/case_file"},
    "$defs": {
        "case": _obj(CASE_PROPERTIES, CASE_REQUIRED, doc="One case (an item of a case list)."),
        "case_file": _obj({"schema": _SCHEMA_PROPERTY, **CASE_PROPERTIES}, ("schema", *CASE_REQUIRED),
                          doc="A file holding one case."),
        "case_list_file": _obj(
            {
                "schema": _SCHEMA_PROPERTY,
                "description": {"type": "string", "description": "Free text about the file's cases."},
                "cases": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/case"},
                          "description": "The cases of this file (each without its own schema key)."},
            },
            ("schema", "cases"),
            doc="A file holding a list of cases.",
        ),
    },
}


def write_schema_file(path: Path = SCHEMA_FILE) -> Path:
    """Write ``schema_json()`` to ``path`` (the shipped file by default): ``python -m harness schema``."""
    path.write_text(schema_json())
    return path


def schema_json() -> str:
    """The text of ``cases/schema/ssd-case-1.schema.json`` (stable: sorted keys, trailing newline)."""
    return json.dumps(SCHEMA, indent=2, sort_keys=True) + "\n"


# Longer found values are shortened in messages (a 400-digit number, a pasted blob): the start and the length say
# what was found without burying the key path.
_SHOWN_CHARS = 40


def describe(value: Any) -> str:
    """How a found value is shown in an error: YAML spelling for scalars, the kind for collections."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, int):
        digits = len(str(abs(value)))
        return repr(value) if digits <= _SHOWN_CHARS else f"an integer of {digits} digits"
    if isinstance(value, str):
        if len(value) <= _SHOWN_CHARS:
            return repr(value)
        return f"a string of {len(value)} characters, {value[:_SHOWN_CHARS]!r}..."
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    return type(value).__name__


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "array":
        return isinstance(value, list)
    if kind == "object":
        return isinstance(value, dict)
    raise ValueError(f"schema uses unsupported type {kind!r}")


def _resolve(node: dict) -> dict:
    ref = node.get("$ref")
    if ref is None:
        return node
    prefix = "#/$defs/"
    if not ref.startswith(prefix):
        raise ValueError(f"schema uses unsupported $ref {ref!r}")
    return SCHEMA["$defs"][ref[len(prefix):]]


def expected_text(node: dict) -> str:
    """What a schema node accepts, in words."""
    node = _resolve(node)
    if "const" in node:
        return repr(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(str(v) for v in node["enum"])
    if "anyOf" in node:
        return " or ".join(expected_text(b) for b in node["anyOf"])
    kind = node.get("type")
    if kind == "integer" or kind == "number":
        word = "an integer" if kind == "integer" else "a number"
        lo, hi = node.get("minimum"), node.get("maximum")
        if lo is not None and hi is not None:
            return f"{word} in [{_bound(lo)}, {_bound(hi)}]"
        if lo is not None:
            return f"{word} >= {_bound(lo)}"
        return word
    if kind == "boolean":
        return "true or false"
    if kind == "string":
        if "pattern" in node:
            return f"a string matching {node['pattern']}"
        if node.get("minLength"):
            return "a non-empty string"
        return "a string"
    if kind == "array":
        lo, hi = node.get("minItems"), node.get("maxItems")
        what = expected_text(node["items"]) if "items" in node else "items"
        if lo is not None and lo == hi:
            return f"a list of {lo} items, each {what}"
        if lo:
            return f"a list of at least {lo} item{'s' if lo != 1 else ''}, each {what}"
        return f"a list, each item {what}"
    if kind == "object":
        required = node.get("required")
        return f"a mapping with {', '.join(required)}" if required else "a mapping"
    raise ValueError(f"schema node without a type: {node}")


def _bound(value: int | float) -> str:
    """A schema bound in words: the int32 and int64 limits as powers of two, other values as written."""
    for bits in (31, 63):
        if value == 2**bits - 1:
            return f"2^{bits} - 1"
        if value == -(2**bits):
            return f"-2^{bits}"
    return str(value)


def _range_text(node: dict, value: int | float) -> str:
    """What a number out of its node's range should have been: the side it crossed."""
    word = "an integer" if node["type"] == "integer" else "a number"
    lo, hi = node.get("minimum"), node.get("maximum")
    if lo is not None and not value >= lo:
        return f"{word} >= {_bound(lo)}"
    return f"{word} <= {_bound(hi)}"


def _fits_a_float(value: int | float) -> bool:
    """Whether ``float(value)`` succeeds: Python ints are unbounded, a 64-bit float stops near 1.8e308."""
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def validate(value: Any, node: dict | None = None, path: str = "") -> None:
    """Validate ``value`` against ``node`` (default: the whole file schema); raise ``SchemaViolation`` at the first
    problem, in a stable order: type, unknown keys, missing keys, then each property in schema order."""
    node = _resolve(SCHEMA if node is None else node)
    where = path or "(top level)"
    if "if" in node:
        if not isinstance(value, dict):
            raise SchemaViolation(where, "a mapping", describe(value))
        cond = node["if"]
        if set(cond) != {"required"}:
            raise ValueError("schema 'if' supports only 'required'")
        branch = node["then"] if all(k in value for k in cond["required"]) else node["else"]
        validate(value, branch, path)
        return
    if "anyOf" in node:
        branches = [_resolve(b) for b in node["anyOf"]]
        # A value whose type matches exactly one branch gets that branch's precise message.
        typed = [b for b in branches if "type" in b and _type_ok(value, b["type"])]
        if len(typed) == 1 and not any("const" in b and b["const"] == value for b in branches):
            validate(value, typed[0], path)
            return
        for b in branches:
            try:
                validate(value, b, path)
                return
            except SchemaViolation:
                continue
        raise SchemaViolation(where, expected_text(node), describe(value))
    if "const" in node:
        if type(value) is not type(node["const"]) or value != node["const"]:
            raise SchemaViolation(where, expected_text(node), describe(value))
        return
    if "enum" in node:
        if not any(type(value) is type(v) and value == v for v in node["enum"]):
            raise SchemaViolation(where, expected_text(node), describe(value))
        return
    kind = node["type"]
    if not _type_ok(value, kind):
        raise SchemaViolation(where, expected_text(node), describe(value))
    if kind in ("integer", "number"):
        if kind == "number" and not _fits_a_float(value):
            raise SchemaViolation(where, f"{expected_text(node)} that a 64-bit float can hold", describe(value))
        lo, hi = node.get("minimum"), node.get("maximum")
        if (lo is not None and not value >= lo) or (hi is not None and not value <= hi):
            raise SchemaViolation(where, _range_text(node, value), describe(value))
    elif kind == "string":
        if len(value) < node.get("minLength", 0) or ("pattern" in node and not re.search(node["pattern"], value)):
            raise SchemaViolation(where, expected_text(node), describe(value))
    elif kind == "array":
        if len(value) < node.get("minItems", 0) or len(value) > node.get("maxItems", len(value)):
            raise SchemaViolation(where, expected_text(node), describe(value))
        for i, item in enumerate(value):
            if "items" in node:
                validate(item, node["items"], f"{path}[{i}]")
        if node.get("uniqueItems"):
            # Hashable items (strings, numbers) go in a set: a long list stays linear, not quadratic.
            hashed: set = set()
            others: list = []
            for i, item in enumerate(value):
                bucket = hashed if isinstance(item, Hashable) else others
                if item in bucket:
                    raise SchemaViolation(f"{path}[{i}]", "no repeated items", f"{describe(item)} again")
                if bucket is hashed:
                    hashed.add(item)
                else:
                    others.append(item)
    elif kind == "object":
        props = node.get("properties", {})
        if node.get("additionalProperties") is False:
            for key in value:
                if key not in props:
                    raise SchemaViolation(
                        _join(path, str(key)), "one of the keys " + ", ".join(props), f"unknown key {key!r}"
                    )
        for key in node.get("required", ()):
            if key not in value:
                raise SchemaViolation(_join(path, key), expected_text(props[key]) + " (required)", "no such key")
        for key, sub in props.items():
            if key in value:
                validate(value[key], sub, _join(path, key))
