"""Which files are case files: one rule for the CLI and the pytest plugin.

A case file ends in ``.yaml`` or ``.yml`` and is
- under a ``cases/`` folder of the repository (or of another root the caller names, such as pytest's rootdir), or
- named itself (on the command line), or
- under a named folder, unless that folder is the repository or one of its parents (the repository holds YAML that
  is not a case: CI files, tool configs) or the file is under the repository's ``tests/`` (fixtures such as the
  deliberately malformed files, which are cases only when named one by one).

Folders are searched recursively, skipping what pytest's default ``norecursedirs`` skips (hidden folders, build
outputs, virtual environments), so both front ends see the same files. Only regular files (or links to one) are case
files: opening a FIFO named ``*.yaml`` blocks until something writes to it, and a device or socket is not a file
to parse. pytest's collection skips them too; ``special_files`` lists them so that the CLI says what it skipped.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path
from typing import Iterable

CASE_SUFFIXES = (".yaml", ".yml")
REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "tests"
# pytest's default norecursedirs; a folder holding pyvenv.cfg is a virtual environment, which pytest skips too.
SKIPPED_FOLDERS = ("*.egg", ".*", "_darcs", "build", "CVS", "dist", "node_modules", "venv", "{arch}", "__pycache__")


def is_case_file(path: str | Path, named: Iterable[str | Path] = (), roots: Iterable[str | Path] = ()) -> bool:
    """Whether ``path`` is a case file, given the paths ``named`` on the command line and extra ``roots`` whose
    ``cases/`` folder holds cases (the repository's always does)."""
    path = Path(path)
    if path.suffix not in CASE_SUFFIXES:
        return False
    resolved = path.resolve()
    for root in {REPO_ROOT, *(Path(r).resolve() for r in roots)}:
        if root / "cases" in resolved.parents:
            return True
    for arg in named:
        arg = Path(arg).resolve()
        if arg == resolved:
            return True
        if (arg.is_dir() and arg in resolved.parents and arg != REPO_ROOT and arg not in REPO_ROOT.parents
                and FIXTURES not in resolved.parents):
            return True
    return False


def case_files(paths: Iterable[str | Path], roots: Iterable[str | Path] = ()) -> list[Path]:
    """The case files among ``paths``: each named case file, then the case files under each named folder in sorted
    order; each file once. Paths that do not exist and named files that are not case files are left out (callers
    report them: ``not_case_files``). One path alone (a ``str`` or ``Path``) counts as a list of it, not as the
    characters of a string."""
    named = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    resolved_named = [p.resolve() for p in named]
    roots = list(roots)
    out: list[Path] = []
    seen: set[Path] = set()
    for p in named:
        candidates = [f for f in (sorted(_walk(p)) if p.is_dir() else [p]) if f.is_file()]
        for f in candidates:
            key = f.resolve()
            if key not in seen and is_case_file(f, resolved_named, roots):
                seen.add(key)
                out.append(f)
    return out


def special_files(paths: Iterable[str | Path], roots: Iterable[str | Path] = ()) -> list[tuple[Path, str]]:
    """The paths ``case_files`` leaves out because they are not regular files although named like case files, each
    with what it is ("a FIFO", "a socket", ...): (path, kind) in the order ``case_files`` would have read them."""
    named = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]
    resolved_named = [p.resolve() for p in named]
    out: list[tuple[Path, str]] = []
    for p in named:
        for f in sorted(_walk(p)) if p.is_dir() else [p]:
            kind = _special_kind(f)
            if kind and is_case_file(f, resolved_named, roots):
                out.append((f, kind))
    return out


def describe_special(path: Path, kind: str) -> str:
    """The line both front ends print for a skipped ``special_files`` entry."""
    return f"skipped {path}: not a regular file ({kind}); case files are read from regular files only"


_SPECIAL_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"))


def _special_kind(path: Path) -> str:
    """"" for a regular file, a folder or a path that does not exist (or a dangling link); else what it is."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return ""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return ""
    return next((what for test, what in _SPECIAL_KINDS if test(mode)), "not a regular file")


def not_case_files(paths: Iterable[str | Path]) -> list[Path]:
    """Named files that are not case files (a case file ends in .yaml or .yml)."""
    return [Path(p) for p in paths if Path(p).is_file() and Path(p).suffix not in CASE_SUFFIXES]


def _walk(folder: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not _skipped(Path(dirpath) / d)]
        for name in filenames:
            if name.endswith(CASE_SUFFIXES):
                yield Path(dirpath) / name


def _skipped(folder: Path) -> bool:
    if any(fnmatch.fnmatch(folder.name, pattern) for pattern in SKIPPED_FOLDERS):
        return True
    return (folder / "pyvenv.cfg").is_file()
