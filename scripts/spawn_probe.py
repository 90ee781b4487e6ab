"""Where an xdist worker's spawn goes: xdist starts its gateways one after another, so the last worker starts only
after every other one has (docs/gpu-runs.md, run 26). This times a bare interpreter, the site start-up, and execnet
popen gateways made in sequence the way xdist makes them (one at a time, each with its remote-info round trip).
Usage: python scripts/spawn_probe.py [GATEWAYS]."""

from __future__ import annotations

import subprocess
import sys
import time


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True)
    return time.perf_counter() - start


def main() -> None:
    gateways = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    bare = sorted(timed([sys.executable, "-S", "-c", "pass"]) for _ in range(5))
    site = sorted(timed([sys.executable, "-c", "pass"]) for _ in range(5))
    print(f"interpreter without site: median {bare[2] * 1e3:.0f} ms; with site: median {site[2] * 1e3:.0f} ms")
    import execnet

    group = execnet.Group()
    times = []
    for _ in range(gateways):
        start = time.perf_counter()
        gateway = group.makegateway("execmodel=main_thread_only//popen")
        gateway._rinfo()
        times.append(time.perf_counter() - start)
    group.terminate(10)
    print(f"{gateways} execnet popen gateways in sequence: " + " ".join(f"{t * 1e3:.0f}" for t in times) + " ms")


if __name__ == "__main__":
    main()
