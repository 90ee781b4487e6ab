"""YAML test cases: the model, the schema and loader, the input builder and the corpus generator (docs/cases.md).

The names below load on first use: ``harness.cases.files`` (which files are cases) is read by the xdist controller,
which must not import torch (the model and loader do) before it has started the workers.
"""

import importlib

_WHERE = {
    "dump_case": "harness.cases.loader", "dump_case_list": "harness.cases.loader",
    "load_case_file": "harness.cases.loader", "load_cases": "harness.cases.loader",
    "Case": "harness.cases.model", "Eligibility": "harness.cases.model", "SCHEMA_ID": "harness.cases.model",
    "CaseError": "harness.cases.schema",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'harness.cases' has no attribute {name!r}")
