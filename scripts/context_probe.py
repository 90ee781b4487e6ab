"""How long N processes take to create their CUDA contexts at once (driver API only, no torch): whether the driver
makes contexts one at a time across processes. Prints, per N, the wall time and each process's seconds."""

from __future__ import annotations

import ctypes
import os
import sys
import time


def create() -> float:
    began = time.monotonic()
    driver = ctypes.CDLL("libcuda.so.1")
    device, context = ctypes.c_int(0), ctypes.c_void_p()
    assert driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(device), 0) == 0
    assert driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0
    return time.monotonic() - began


def together(n: int) -> None:
    read, write = os.pipe()
    began = time.monotonic()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                os.write(write, f"{create():.3f}\n".encode())
            finally:
                os._exit(0)  # never back into the parent's loop, whatever happened
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)
    wall = time.monotonic() - began
    os.close(write)
    times = sorted(float(t) for t in os.read(read, 1 << 16).split())
    if len(times) < n:
        sys.exit(f"{n - len(times)} of {n} processes could not create a context (no CUDA driver here?)")
    median = times[len(times) // 2]
    print(f"{n:>3} at once: wall {wall:.2f} s; each {times[0]:.2f}..{times[-1]:.2f} s, median {median:.2f}", flush=True)


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [1, 16, 32]:
        together(n)
