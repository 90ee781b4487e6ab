"""Selecting a provider (docs/provider.md): ``module:attr`` names any object with ``name`` and ``ssd_prefill``."""

from __future__ import annotations

import importlib
import importlib.util

from harness import DEFAULT_PROVIDER

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


def supported_paths(provider) -> frozenset[str]:
    """The paths a provider implements. A provider that does not say is taken at the interface's word (both)."""
    paths = getattr(provider, "supported_paths", None)
    return ALL_PATHS if paths is None else frozenset(paths)


def provider_name(provider) -> str:
    return str(getattr(provider, "name", type(provider).__name__))
