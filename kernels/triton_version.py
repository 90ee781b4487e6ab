"""The one check of the running Triton against the versions whose internals this repository was verified with.

Both the kernels (``kernels.triton_internals``: programmatic launch, specialization keys) and the harness
(``harness.triton_autotuner``, ``harness.triton_launches``) use Triton beyond its public API; each gate asks this
module, so one range (``VERIFIED``) is widened in one place once every user of an internal is checked against a new
version. Triton is imported only when a check runs: this module sits below the kernels and the harness alike.
"""

from __future__ import annotations

VERIFIED = ((3, 4), (3, 9))  # (major, minor) range, both ends included


class UnsupportedTriton(RuntimeError):
    """The running Triton is not one whose internals the caller was checked against."""


def triton_version(text: str | None = None) -> tuple[int, int]:
    """(major, minor) of ``text`` (a version string), by default the running Triton's ``__version__``."""
    if text is None:
        import triton

        text = triton.__version__
    major, minor = text.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def version_problem(what: str, text: str | None = None) -> str | None:
    """None inside ``VERIFIED``; otherwise why ``what`` (a module and the internals it relies on) is not trusted."""
    if text is None:
        import triton

        text = triton.__version__
    lo, hi = VERIFIED
    if lo <= triton_version(text) <= hi:
        return None
    return (f"Triton {text}: {what} verified for Triton {lo[0]}.{lo[1]} .. {hi[0]}.{hi[1]}; check it against this "
            "version, then widen VERIFIED (kernels/triton_version.py)")


def require_verified(what: str) -> None:
    """Raise ``UnsupportedTriton`` (``version_problem``'s reason) outside ``VERIFIED``."""
    problem = version_problem(what)
    if problem is not None:
        raise UnsupportedTriton(problem)
