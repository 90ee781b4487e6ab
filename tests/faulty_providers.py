"""Providers that fault the way a kernel under test can: each wraps a working provider (``tests.broken_providers``'
wrapper) and faults on the calls of one case of ``TINY_CASES``, ``tiny-batch`` (the only one with two groups), so
that every other case must still run and pass. The ``*_on_batch`` / ``*_across_chunks`` ones fault on a region of
the fuzzer's search space instead (every call with two or more sequences; every call where a sequence crosses a
chunk boundary), for the fuzzer to find and shrink.

Use as ``--provider tests.faulty_providers:<name>`` (around ``reference:provider``: the search for faults needs no
Triton interpreter). ``SSD_TEST_PID_FILE``: when set, a provider that hangs or crashes first appends its process id
there, so a test can check that the process was stopped.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from tests.broken_providers import _Broken

FAULTING_CASE = "tiny-batch"
CRASH_ONCE_MARKER_ENV = "SSD_TEST_CRASH_ONCE_MARKER"
PID_FILE_ENV = "SSD_TEST_PID_FILE"
STICKY_MESSAGE = "CUDA error: an illegal memory access was encountered"


def _is_faulting_case(B) -> bool:
    return B.shape[-2] == 2  # ngroups: 2 in tiny-batch alone


def _in_faulting_case(kwargs) -> bool:
    return _is_faulting_case(kwargs["B"])


def _batch_of_two_or_more(kwargs) -> bool:
    return kwargs["has_initial_states"].shape[0] >= 2


def _crosses_a_chunk_boundary(kwargs) -> bool:
    """Some sequence spans two or more chunks: more chunks than sequences (chunks never hold two sequences)."""
    return kwargs["seq_idx"].numel() > kwargs["has_initial_states"].shape[0]


def _note_pid() -> None:
    path = os.environ.get(PID_FILE_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n")


def _segfault() -> None:
    """A real SIGSEGV: read address 0 (after noting the process, for tests that check it was replaced)."""
    _note_pid()
    ctypes.string_at(0)


def _hang() -> None:
    """Never return (after noting the process)."""
    _note_pid()
    while True:
        time.sleep(3600)


class _Faulty(_Broken):
    """Faults on every call inside ``region`` (a predicate on the call's keyword arguments: by default the calls of
    ``tiny-batch``), works everywhere else."""

    region = staticmethod(_in_faulting_case)

    def __init__(self):
        super().__init__(base="reference:provider")

    def call(self, *args, **kwargs):
        if self.region(kwargs):
            self.fault()
        return self.inner.ssd_prefill(*args, **kwargs)

    def fault(self) -> None:
        raise NotImplementedError


class ExitsZero(_Faulty):
    breakage = "calls sys.exit(0) inside ssd_prefill"

    def fault(self) -> None:
        sys.exit(0)


class Segfaults(_Faulty):
    breakage = "reads address 0 (a real SIGSEGV)"

    fault = staticmethod(_segfault)


class Hangs(_Faulty):
    breakage = "never returns"

    fault = staticmethod(_hang)


class ExitsHard(_Faulty):
    breakage = "ends its process with os._exit(3), past every handler"

    def fault(self) -> None:
        os._exit(3)


class CrashesOnce(_Broken):
    breakage = "the first call of all (in any process) kills its process with SIGSEGV; every later call works"

    def __init__(self):
        super().__init__(base="reference:provider")

    def call(self, *args, **kwargs):
        marker = os.environ[CRASH_ONCE_MARKER_ENV]  # a file that outlives the process: "once" across restarts
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return self.inner.ssd_prefill(*args, **kwargs)
        os.close(fd)
        os.kill(os.getpid(), signal.SIGSEGV)
        return None


_POISONED = {"cause": ""}  # this process's "device context": once poisoned, every later call fails


class StickyDeviceError(_Faulty):
    breakage = ("one case hits an illegal memory access that, like a real one, leaves the process's device context "
                "unusable: every later call in that process fails with the same error")

    def call(self, *args, **kwargs):
        if _POISONED["cause"]:
            raise RuntimeError(_POISONED["cause"])
        return super().call(*args, **kwargs)

    def fault(self) -> None:
        _POISONED["cause"] = STICKY_MESSAGE
        raise RuntimeError(STICKY_MESSAGE)


class RaisesKeyboardInterrupt(_Faulty):
    breakage = "raises KeyboardInterrupt from inside the call"

    def fault(self) -> None:
        raise KeyboardInterrupt


exits_zero = ExitsZero()
segfaults = Segfaults()
hangs = Hangs()
exits_hard = ExitsHard()
crashes_once = CrashesOnce()
sticky_device_error = StickyDeviceError()
raises_keyboard_interrupt = RaisesKeyboardInterrupt()


# ---- faults on a region of the search space (the fuzzer's cases)


class _Regional(_Faulty):
    region = staticmethod(_batch_of_two_or_more)


class SegfaultsOnBatch(_Regional):
    breakage = "reads address 0 (a real SIGSEGV) on every call with two or more sequences"
    fault = staticmethod(_segfault)


class HangsAcrossChunks(_Regional):
    breakage = "never returns from a call where a sequence crosses a chunk boundary"
    region = staticmethod(_crosses_a_chunk_boundary)
    fault = staticmethod(_hang)


class RaisesAcrossChunks(_Regional):
    breakage = "raises IndexError on a call where a sequence crosses a chunk boundary"
    region = staticmethod(_crosses_a_chunk_boundary)

    def fault(self) -> None:
        raise IndexError("chunk index out of range (a sequence crosses a chunk boundary)")


class StickyOnBatch(StickyDeviceError):
    breakage = ("an illegal memory access on a call with two or more sequences that, like a real one, leaves the "
                "process's device context unusable: every later call in that process fails with the same error")
    region = staticmethod(_batch_of_two_or_more)


class Slow(_Broken):
    breakage = "none: every call works, and takes SLOW_SECONDS longer than it needs"

    def __init__(self):
        super().__init__(base="reference:provider")

    def call(self, *args, **kwargs):
        time.sleep(SLOW_SECONDS)
        return self.inner.ssd_prefill(*args, **kwargs)


class SlowOnceAcrossChunks(_Regional):
    breakage = ("none in the end: the first call on a case whose sequence crosses a chunk boundary takes an hour (as "
                "a first call that compiles on a busy host can pass the limit); every later call, in any process, "
                "works")
    region = staticmethod(_crosses_a_chunk_boundary)
    # The folder (the test names it) where the first slow call leaves its mark: what survives the child's end. One
    # slow call shows the point; each further one would cost the search another time limit.
    MARKS_ENV = "SSD_TEST_SLOW_ONCE_MARKS"

    def call(self, *args, **kwargs):
        if self.region(kwargs):
            mark = os.path.join(os.environ[self.MARKS_ENV], "slow-once")
            if not os.path.exists(mark):
                open(mark, "w").close()
                time.sleep(3600)
        return self.inner.ssd_prefill(*args, **kwargs)


SLOW_SECONDS = 0.3  # past Hypothesis' default deadline (0.2 s) for every example
segfaults_on_batch = SegfaultsOnBatch()
hangs_across_chunks = HangsAcrossChunks()
raises_across_chunks = RaisesAcrossChunks()
sticky_on_batch = StickyOnBatch()
slow = Slow()
slow_once_across_chunks = SlowOnceAcrossChunks()


class LaunchesUnwarmed(_Broken):
    """Not a fault of the results: our kernels, plus one launch per call without ``D`` (on copies, result
    discarded), a specialization that a case with ``D`` does not warm. The recompile guard must fail it."""

    breakage = "launches a kernel specialization outside the case's model request"

    def warmup(self, requests):
        """Our kernels' warmup hook: it warms each case's model configuration, which has ``D``."""
        return self.inner.warmup(requests)

    def call(self, *args, out, state_cache, **kwargs):
        if kwargs.get("D") is not None:
            self.inner.ssd_prefill(*args, **{**kwargs, "D": None}, out=out.clone(), state_cache=state_cache.clone())
        return self.inner.ssd_prefill(*args, out=out, state_cache=state_cache, **kwargs)


launches_unwarmed = LaunchesUnwarmed()


class IllegalMemoryAccess(_Broken):
    """Our kernels, plus, on the faulting case, a real Triton kernel that stores far outside any allocation: on a
    GPU a true illegal memory access, which leaves the process's CUDA context unusable (every later CUDA call in it
    fails). GPU only; the interpreter would write into this process's own memory."""

    breakage = "a Triton store at a wild address on one case (a real illegal memory access on the GPU)"

    def __init__(self):
        super().__init__(base="kernels:provider")

    def call(self, x, dt, A, B, *args, **kwargs):
        if _is_faulting_case(B):
            if not x.is_cuda:
                raise RuntimeError("tests.faulty_providers:illegal_memory_access is for CUDA devices only")
            _wild_store[(1,)](x)
            import torch

            torch.cuda.synchronize(x.device)  # the fault surfaces in this call, as a real kernel's would at its sync
        return self.inner.ssd_prefill(x, dt, A, B, *args, **kwargs)


def _make_wild_store():
    import triton
    import triton.language as tl

    @triton.jit
    def wild_store(ptr):
        tl.store(ptr + (1 << 40), tl.load(ptr))

    return wild_store


class _Lazy:
    """Compiles the wild-store kernel at first use, so importing this module needs no Triton."""

    def __getitem__(self, grid):
        global _wild_store
        _wild_store = _make_wild_store()
        return _wild_store[grid]


_wild_store = _Lazy()
illegal_memory_access = IllegalMemoryAccess()


class ReportsThreads(_Faulty):
    """Not a fault of a kernel: raises on the faulting case with its process's torch thread count, OMP_NUM_THREADS and
    CUDA_DEVICE_MAX_CONNECTIONS, so a test can see what a supervised child was given."""

    def fault(self) -> None:
        import torch

        omp, queues = os.environ.get("OMP_NUM_THREADS"), os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
        raise RuntimeError(f"torch threads={torch.get_num_threads()} OMP_NUM_THREADS={omp} "
                           f"CUDA_DEVICE_MAX_CONNECTIONS={queues}")


reports_threads = ReportsThreads()


class ReportsWhere(_Faulty):
    """Not a fault of a kernel: on the faulting case prints a line to standard output and one to standard error,
    then raises with its working directory, so a test can see where a supervised child runs and writes."""

    def fault(self) -> None:
        print("reports_where: standard output", flush=True)
        print("reports_where: standard error", file=sys.stderr, flush=True)
        raise RuntimeError(f"cwd={os.getcwd()}")


reports_where = ReportsWhere()
