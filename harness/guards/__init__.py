"""Guards around kernel calls: destructive autotuning (``autotune``), new compiles after warmup (``recompile``) and
their interpreter-side twin, specialization keys (``specialization``)."""

from harness.guards.autotune import (
    DestructiveAutotuning,
    FakeBench,
    NothingTuned,
    check_autotune_safe,
    fresh_autotune_state,
)
from harness.guards.recompile import RecompileError, guard_no_recompile, no_recompile
from harness.guards.specialization import MissingSpecialization, SpecKey, expect_warmed, specialization_key

__all__ = [
    "DestructiveAutotuning", "FakeBench", "NothingTuned", "check_autotune_safe", "fresh_autotune_state",
    "RecompileError", "guard_no_recompile", "no_recompile",
    "MissingSpecialization", "SpecKey", "expect_warmed", "specialization_key",
]
