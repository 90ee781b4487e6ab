"""How long CUDA processes take to exit together, and whether freeing their cached memory first helps.

At the end of a suite xdist asks every worker (16 per GPU, each holding GiBs of cached device memory) to exit at
once, and the time between the last worker finishing and the controller's end goes into those exits
(docs/gpu-runs.md, run 25). Each mode starts N processes that hold memory the way a worker does (freed tensors
stay in torch's caching allocator), waits until all are ready, then tells them to go and times until every one has
exited:
  plain        exit as a worker does;
  early_free   ``torch.cuda.empty_cache()`` before they are ready (as a worker could when its last item is done,
               while others still run), then exit;
  os_exit      ``os._exit(0)`` (skips the interpreter's shutdown).
Usage: python scripts/exit_probe.py [N] [GPUS]; prints one line per mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import os, sys, time
import torch
mode, ready, go = sys.argv[1], sys.argv[2], sys.argv[3]
held = [torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda") for _ in range(8)]
a = torch.randn(2048, 2048, device="cuda")
(a @ a).sum().item()
del held  # back to the caching allocator, still reserved, as in a worker after its items
if mode == "early_free":
    torch.cuda.empty_cache()
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
if mode == "os_exit":
    os._exit(0)
"""


def trial(mode: str, processes: int, gpus: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        go = os.path.join(tmp, "go")
        ready = [os.path.join(tmp, f"ready{k}") for k in range(processes)]
        children = [subprocess.Popen([sys.executable, "-c", CHILD, mode, ready[k], go],
                                     env={**os.environ, "CUDA_VISIBLE_DEVICES": str(k % gpus)})
                    for k in range(processes)]
        while not all(os.path.exists(r) for r in ready):
            if any(c.poll() not in (None, 0) for c in children):
                raise RuntimeError(f"{mode}: a child failed")
            time.sleep(0.01)
        start = time.perf_counter()
        open(go, "w").close()
        codes = [c.wait() for c in children]
        seconds = time.perf_counter() - start
    if any(codes):
        raise RuntimeError(f"{mode}: exit codes {codes}")
    return seconds


def main() -> None:
    processes = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    gpus = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for n in (1, processes):
        for mode in ("plain", "early_free", "os_exit"):
            seconds = trial(mode, n, gpus)
            print(f"{n:>3} processes on {min(n, gpus)} GPU(s)  {mode:<11} all exited after {seconds:.2f} s", flush=True)


if __name__ == "__main__":
    main()
