"""Selecting a provider (docs/provider.md): ``module:attr`` names any object with ``name`` and ``ssd_prefill``."""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

from harness import DEFAULT_PROVIDER

REPO_ROOT = Path(__file__).resolve().parents[2]

ALL_PATHS = frozenset({"snapshot", "indexed"})


class ProviderError(ValueError):
    """The ``--provider`` spec does not name a usable provider."""


def load_provider(spec: str = DEFAULT_PROVIDER):
    """Import ``module`` and return its ``attr`` (dotted attributes allowed). Raises ``ProviderError`` with the
    cause."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ProviderError(f"--provider: expected module:attr, found {spec!r}")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ProviderError(f"--provider {spec}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ProviderError(f"--provider {spec}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(getattr(obj, "ssd_prefill", None)):
        raise ProviderError(f"--provider {spec}: {attr!r} has no callable ssd_prefill")
    return obj


def check_provider_spec(spec: str) -> None:
    """Raise ``ProviderError`` when ``spec`` cannot name a provider (its form, or a module that does not exist),
    without importing the module: a process that only supervises the one importing it learns of a typo at once."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ProviderError(f"--provider: expected module:attr, found {spec!r}")
    try:
        found = importlib.util.find_spec(module_name)
    except (ImportError, ValueError) as exc:
        raise ProviderError(f"--provider {spec}: cannot import {module_name!r}: {exc}") from exc
    if found is None:
        raise ProviderError(f"--provider {spec}: cannot import {module_name!r}: No module named {module_name!r}")


def pythonpath_entry(spec: str) -> str:
    """The ``PYTHONPATH`` entry the provider's top-level module is imported from, or "" when it is found elsewhere
    (this repository, site-packages, the working folder) or not at all. A repro line printed for such a provider
    must carry that entry: a shell without this run's environment would not find the module. Located with
    ``find_spec`` of the top-level name, which imports nothing."""
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if not entries:
        return ""
    top = spec.partition(":")[0].split(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return ""
    if found is None:
        return ""
    if found.submodule_search_locations:
        homes = [Path(p).parent for p in found.submodule_search_locations]
    elif found.origin and found.has_location:
        homes = [Path(found.origin).parent]
    else:
        return ""
    homes = {h.resolve() for h in homes}
    return next((e for e in entries if Path(e).resolve() in homes and Path(e).resolve() != REPO_ROOT), "")


def supported_paths(provider) -> frozenset[str]:
    """The paths a provider implements. A provider that does not say is taken at the interface's word (both)."""
    paths = getattr(provider, "supported_paths", None)
    return ALL_PATHS if paths is None else frozenset(paths)


def provider_name(provider) -> str:
    return str(getattr(provider, "name", type(provider).__name__))
