"""Starting the supervised child by ``fork`` instead of a fresh interpreter, at one moment where that is safe.

A spawned child imports torch again, most of its start-up on the CPU, and 16 children doing it at once beside 16 busy
pytest workers compete for the same cores. A forked child shares its parent's imported modules. ``fork`` copies only
the calling thread, which is safe only

- before the CUDA driver is initialized in the parent (a forked child cannot use the parent's driver state), and
- before torch's first parallel CPU op in the parent (libgomp's OpenMP pool is not fork-safe: the child hangs at its
  first parallel region with more than one thread; with one it never uses the pool). Nothing in a process can tell
  whether that op has run, so the caller vouches for it: forking is for a process's start (``spare.prefork``),
  right after torch is imported. Where code the caller does not know ran first (a test suite's conftest files), a
  fork is made only for a child that will run one OpenMP thread.

``fork_hazard()`` says what makes a fork unsafe now ("" when nothing known does). The child of a fork runs
``run_in_child`` and never returns into the parent's code (``os._exit``).
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import subprocess
import sys
import time

CUDA_ERROR_NOT_INITIALIZED = 3
EXIT_WHEN_CHILD_CODE_RAISES = 70
_WAIT_STEP_SECONDS = 0.005


def _cuda_driver_state() -> int | None:
    """None where this process has not loaded the CUDA driver (it has nothing to initialize), else what
    cuDeviceGetCount answers: CUDA_ERROR_NOT_INITIALIZED before ``cuInit``, 0 after it. Loading the library here
    when it is already mapped initializes nothing."""
    try:
        with open("/proc/self/maps") as maps:
            if "libcuda.so" not in maps.read():
                return None
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count = ctypes.c_int(0)
    return driver.cuDeviceGetCount(ctypes.byref(count))


def fork_hazard(code_ran_before: bool = False) -> str:
    """Why forking this process now would give a broken child, in one line; "" when nothing known does (the OpenMP
    condition is the caller's: see the module docstring; ``code_ran_before``: the caller cannot vouch for it)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return f"fork is used on Linux only (this is {sys.platform})"
    driver = _cuda_driver_state()
    if driver is not None and driver != CUDA_ERROR_NOT_INITIALIZED:
        return (f"the CUDA driver is initialized in this process (cuDeviceGetCount returned {driver}), and a forked "
                "child cannot use it")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "torch has initialized CUDA in this process"
    if code_ran_before and torch is not None and torch.get_num_threads() > 1:
        return (f"the child would run {torch.get_num_threads()} OpenMP threads, and code that ran here before may "
                "have started torch's OpenMP pool, which a forked child cannot use")
    return ""


class ForkedProcess:
    """A forked child, with the part of ``subprocess.Popen``'s interface the supervisor uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout)
            time.sleep(_WAIT_STEP_SECONDS)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


def fork_child(run_in_child, keep_fds: tuple[int, ...]) -> ForkedProcess:
    """Fork; in the child, in a session of its own, with standard input from /dev/null and every descriptor but 0-2
    and ``keep_fds`` closed (the parent's other pipes must see their end of file when the parent closes them), run
    ``run_in_child()`` and exit with what it returns. Call only when ``fork_hazard()`` is ""."""
    pid = os.fork()
    if pid:
        return ForkedProcess(pid)
    code = EXIT_WHEN_CHILD_CODE_RAISES
    try:
        # The parent's objects stay alive in the child, untouched: a collection that finalized one (a file object
        # whose descriptor was closed below) could close a descriptor the child has reused since.
        gc.freeze()
        os.setsid()
        for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(number, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _close_fds_except(keep_fds)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        # What the provider prints goes to the descriptors, as in a spawned child, not into the parent's stream
        # objects (pytest's capture buffers, whose contents only the parent reads).
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 - the process's stream until its exit
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        code = run_in_child()
    except BaseException:  # noqa: BLE001 - nothing in the child may return into the parent's stack
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001
            pass
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                pass
        os._exit(code)


def _close_fds_except(keep: tuple[int, ...]) -> None:
    low = 3
    for fd in sorted(set(f for f in keep if f >= 3)):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _max_fd())


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (ValueError, OSError):
        return 4096
