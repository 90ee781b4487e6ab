"""YAML test cases: the model, the schema and loader, the input builder and the corpus generator (docs/cases.md)."""

from harness.cases.loader import dump_case, dump_case_list, load_case_file, load_cases
from harness.cases.model import SCHEMA_ID, Case, Eligibility
from harness.cases.schema import CaseError

__all__ = [
    "Case", "CaseError", "Eligibility", "SCHEMA_ID", "dump_case", "dump_case_list", "load_case_file", "load_cases",
]
