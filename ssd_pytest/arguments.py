"""The plugin's path options given as ``--option PATH`` (two arguments), where pytest took PATH for a test path
when it chose its rootdir and configuration file.

pytest settles its rootdir and configuration file before any plugin's options are known, from the arguments that
name existing paths: an unknown option's separate value is one of them. ``--ssd-report /tmp/r.json`` is harmless the
first time (the file does not exist yet) and, once a run has written it, moves the next run's rootdir to ``/tmp``,
where no configuration file is found: the project's pytest settings (testpaths, markers, warning filters) silently
stop applying and the collection starts from the working directory. ``--option=PATH`` is one argument, which pytest
never takes for a path. Where such a value moved the rootdir away from the directory pytest runs in, or left it
without the configuration file found above that directory, the run stops with a usage error that says so, before
anything runs. (Where test paths are given too, pytest finds the configuration file from them, and nothing changes.)
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

PATH_OPTIONS = ("--ssd-report", "--durations-from")
# The files pytest reads its configuration from (its own list), looked for from the directory it runs in upwards.
CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")


def misread_path_values(args: list[str], invocation_dir: Path) -> list[tuple[str, str]]:
    """(option, value) for each of ``PATH_OPTIONS`` written as two arguments whose value names an existing path
    outside ``invocation_dir``: pytest counted it among the paths that decide the rootdir."""
    found = []
    for option, value in zip(args, args[1:], strict=False):
        if option in PATH_OPTIONS and not value.startswith("-"):
            path = (invocation_dir / value).resolve()
            if path.exists() and not path.is_relative_to(invocation_dir.resolve()):
                found.append((option, value))
    return found


def rootdir_misled(invocation_dir: Path, rootpath: Path, inipath: Path | None) -> bool:
    """Whether pytest's rootdir is not the directory it runs in or one of its parents, or it found no configuration
    file where one lies at or above that directory."""
    here = invocation_dir.resolve()
    if not here.is_relative_to(rootpath.resolve()):
        return True
    return inipath is None and any((d / name).is_file() for d in (here, *here.parents) for name in CONFIG_FILES)


def refuse_misread_path_values(config: pytest.Config) -> None:
    """The usage error for ``misread_path_values`` among the command line's arguments and ``PYTEST_ADDOPTS``'s,
    where they misled the rootdir (``rootdir_misled``)."""
    args = [*shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *map(str, config.invocation_params.args)]
    here = Path(config.invocation_params.dir)
    found = misread_path_values(args, here)
    if found and rootdir_misled(here, Path(config.rootpath), config.inipath):
        option, value = found[0]
        raise pytest.UsageError(
            f"{option} {value}: pytest chooses its rootdir and configuration file before this plugin's options are "
            f"known, and took the existing {value} for a test path: rootdir {config.rootpath}, configuration file "
            f"{config.inipath or 'none'}, not those of {here}, so this project's pytest settings would not apply. "
            f"Write it as one argument: {option}={value}")
