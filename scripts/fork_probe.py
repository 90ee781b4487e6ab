"""Where a process's CUDA driver gets initialized on the way to an xdist worker's start, and whether a child forked
after torch's import can use the GPU (``harness.isolation.forking``). Prints one line per stage, then the fork test."""

from __future__ import annotations

import os
import sys
import time

from harness.isolation import forking


def state(stage: str) -> None:
    print(f"{stage:<28} driver state {forking._cuda_driver_state()!s:<6} hazard: {forking.fork_hazard() or '-'}",
          flush=True)


state("start")
import torch  # noqa: E402

state("import torch")
import pytest  # noqa: E402, F401

state("import pytest")
import ssd_pytest.plugin  # noqa: E402, F401

state("import ssd_pytest.plugin")
began = time.monotonic()
pid = os.fork()
if pid == 0:
    try:
        x = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        print(f"forked child: cuda sum {float(x.sum()):.0f} after {time.monotonic() - began:.2f} s", flush=True)
        os._exit(0)
    except BaseException as exc:  # noqa: BLE001
        print(f"forked child failed: {type(exc).__name__}: {exc}", flush=True)
        os._exit(1)
_, status = os.waitpid(pid, 0)
print(f"forked child exit status {os.waitstatus_to_exitcode(status)}", flush=True)
state("after the fork")
torch.cuda.init()
state("torch.cuda.init() in parent")
sys.exit(0)
