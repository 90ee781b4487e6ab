"""Named correctness checks (docs/checks.md), shared by the pytest plugin, the CLI and the fuzzer.

Importing this package registers every check. ``run_check`` is the one way to run one against a provider.
"""

from harness.checks.base import Check, CheckContext, CheckResult, NotApplicable, Status
from harness.checks.providers import DEFAULT_PROVIDER, ProviderError, load_provider, supported_paths
from harness.checks.registry import check_names, get_check, register, selected_checks
from harness.checks.runner import repro_line, run_check

# Registration side effects, in the order items are collected (not alphabetical: isort must leave the order).
# isort: off
from harness.checks import paths as _paths  # noqa: F401
from harness.checks import storage as _storage  # noqa: F401
from harness.checks import states as _states  # noqa: F401
from harness.checks import independence as _independence  # noqa: F401
from harness.checks import bound as _bound  # noqa: F401
from harness.checks import kernel_exact as _kernel_exact  # noqa: F401
from harness.checks import autotune as _autotune  # noqa: F401
from harness.checks import configs as _configs  # noqa: F401
# isort: on

__all__ = [
    "Check",
    "CheckContext",
    "CheckResult",
    "DEFAULT_PROVIDER",
    "NotApplicable",
    "ProviderError",
    "Status",
    "check_names",
    "get_check",
    "load_provider",
    "register",
    "repro_line",
    "run_check",
    "selected_checks",
    "supported_paths",
]
