"""Name -> Check. Check modules register themselves on import; ``harness.checks`` imports them all."""

from __future__ import annotations

from harness.checks.base import Check

_CHECKS: dict[str, Check] = {}
ALL = "all"


def register(check: Check) -> Check:
    if check.name in _CHECKS or check.name == ALL:
        raise ValueError(f"check {check.name!r} registered twice (or named 'all')")
    _CHECKS[check.name] = check
    return check


def get_check(name: str) -> Check:
    try:
        return _CHECKS[name]
    except KeyError:
        raise KeyError(f"unknown check {name!r}; known: {', '.join(sorted(_CHECKS))}") from None


def check_names() -> list[str]:
    """Registered checks in registration order (the order items are collected in)."""
    return list(_CHECKS)


def selected_checks(case) -> list[tuple[str, bool]]:
    """(check name, explicitly named) for every item this case produces.

    ``checks: [all]`` expands to the checks whose ``case_applies`` holds for the case; a check named explicitly is
    always kept, so if it does not apply it becomes a skip with the reason rather than vanishing. Unknown names
    raise ``ValueError`` naming the case and the known checks.
    """
    names = list(case.checks)
    if names == [ALL]:
        return [(n, False) for n, c in _CHECKS.items() if c.case_applies(case)[0]]
    if ALL in names:
        raise ValueError(f"case {case.id}: checks: 'all' cannot be combined with named checks, found {names}")
    unknown = [n for n in names if n not in _CHECKS]
    if unknown:
        raise ValueError(f"case {case.id}: checks: unknown {unknown}; known: {', '.join(sorted(_CHECKS))}")
    return [(n, True) for n in dict.fromkeys(names)]
