"""What one pytest process keeps in its config's stash and more than one of ssd_pytest's modules reads."""

from __future__ import annotations

import pytest

DEVICE = pytest.StashKey[str]()  # where kernels run: "cuda" or "cpu" (in the xdist controller: its workers' device)
PHASES = pytest.StashKey[dict]()  # this process's start-up phases (harness.timeline)
LEDGER = pytest.StashKey[object]()  # this process's compile ledger (None in the xdist controller)
CASE_WORKERS = pytest.StashKey[int | None]()  # xdist controller: its case workers' count, None without roles
