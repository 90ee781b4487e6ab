"""Which backend runs the Triton kernels: the GPU (``cuda``) or Triton's interpreter on CPU tensors.

Triton reads ``TRITON_INTERPRET`` when it is imported and when ``@triton.jit`` decorates a kernel, so ``configure``
must run before any kernel module is imported (``kernels.environment`` and ``kernels.interface`` import no triton and
may come first). The pytest plugin and the CLI call it first thing.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import os
import re
import sys

DEVICES = ("auto", "cuda", "cpu")

# Triton's interpreter up to 3.6 turns the one-element numpy array that holds a run-time integer into a Python int
# with int(array), which numpy 2.4 made a TypeError ("only 0-dimensional arrays can be converted to Python
# scalars"): every kernel that loops over a run-time integer then fails. Later Triton converts the element itself.
INTERPRETER_NUMPY_BELOW = (2, 4)
LAST_TRITON_WITH_THE_LIMIT = (3, 6)
CPU_INSTALL = "pip install -e '.[cpu]'"  # in the checkout; the extra pins triton 3.6.0 and numpy < 2.4 (pyproject)


def _check_requested(requested: str) -> None:
    if requested not in DEVICES:
        raise ValueError(f"device: expected one of {', '.join(DEVICES)}, found {requested!r}")


def resolve_device(requested: str = "auto") -> str:
    """``auto`` is ``cuda`` when a GPU is visible, else ``cpu`` (the interpreter). Decided by torch: the process that
    runs kernels must be able to use the GPU."""
    import torch  # here, not at the top: the xdist controller never imports torch (``gpus_for_workers``)

    _check_requested(requested)
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but torch sees no CUDA device")
    return requested


def gpus_for_workers(requested: str = "auto") -> list[str]:
    """The GPU ids to pin xdist workers to, decided without importing torch: the controller does this before any
    worker starts, and every second it spends importing torch and counting devices delays every worker.
    ``CUDA_VISIBLE_DEVICES`` when set, else the driver's count through NVML; none for ``cpu``. Each worker still
    resolves its own device through torch (``configure``), so a machine whose torch cannot use its GPUs fails there
    with the reason, or (``auto``) runs the interpreter."""
    _check_requested(requested)
    if requested == "cpu":
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        gpus = [g.strip() for g in listed.split(",") if g.strip()]
    else:
        gpus = [str(i) for i in range(nvml_device_count())]
    if requested == "cuda" and not gpus:
        raise ValueError("device: 'cuda' requested but the NVIDIA driver reports no GPU "
                         f"(CUDA_VISIBLE_DEVICES={listed!r})")
    return gpus


@contextlib.contextmanager
def _nvml(library: str):
    """The NVIDIA driver's NVML library, initialized for the block; None where there is no driver."""
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        yield None
        return
    if nvml.nvmlInit_v2() != 0:
        yield None
        return
    try:
        yield nvml
    finally:
        nvml.nvmlShutdown()


def _nvml_count(nvml) -> int:
    count = ctypes.c_uint(0)
    return count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0


def nvml_device_count(library: str = "libnvidia-ml.so.1") -> int:
    """GPUs the NVIDIA driver reports (NVML, as ``nvidia-smi`` counts them); 0 where there is no driver."""
    with _nvml(library) as nvml:
        return 0 if nvml is None else _nvml_count(nvml)


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_smallest_gpu_memory(library: str = "libnvidia-ml.so.1") -> int:
    """The total memory, in bytes, of the smallest GPU the NVIDIA driver reports (NVML); 0 where there is no driver
    or no GPU. Every GPU of the host counts, not only those CUDA_VISIBLE_DEVICES lists (which may name them by UUID):
    a host's GPUs are normally one model, and the smallest is the safe bound where they are not."""
    with _nvml(library) as nvml:
        if nvml is None:
            return 0
        sizes = []
        for index in range(_nvml_count(nvml)):
            handle, memory = ctypes.c_void_p(), _NvmlMemory()
            if (nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
                    and nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0):
                sizes.append(memory.total)
        return min(sizes, default=0)


def create_cuda_context_in_background(library: str = "libcuda.so.1", driver=None, after=None):
    """Create this process's CUDA context (the device's primary context, the one torch's runtime then uses) on a
    side thread, through the driver API, while the main thread goes on importing torch and collecting. Returns the
    thread, or None where there is no driver. ``driver``: the loaded library (a stand-in, for tests).

    The driver creates contexts one at a time: workers that each created theirs at their first CUDA call, at the
    same moment, queued behind each other while the host's cores sat idle. Started as each worker is configured
    (xdist starts them apart, and the driver API needs no torch), the contexts come up one after another during
    start-up, whose imports keep the cores busy anyway; ctypes lets go of the GIL for each call. A failure here is
    left to show again, with its message, at the first real use (a test, with its node id). Join the thread before
    the process exits (the pytest plugin does, in ``pytest_unconfigure``): a thread inside the driver at exit can
    crash the process. ``after``: called on the thread first; the context is made only if it returns true (a
    process that waits for another's context: ``harness.isolation.spare.wait_for_spare_context``)."""
    import threading

    if driver is None:
        try:
            driver = ctypes.CDLL(library)
        except OSError:
            return None

    def create() -> None:
        if after is not None and not after():
            return
        device, context = ctypes.c_int(0), ctypes.c_void_p()
        if driver.cuInit(0) == 0 and driver.cuDeviceGet(ctypes.byref(device), 0) == 0:
            driver.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)

    thread = threading.Thread(target=create, name="ssd-harness-cuda-context", daemon=True)
    thread.start()
    return thread


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    """The leading release numbers: ``2.4.0rc1`` -> (2, 4, 0)."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group(0).split(".")) if found else ()


def interpreter_install_problem() -> str | None:
    """Why this Python cannot run the kernels in Triton's interpreter, read from the installed distributions without
    importing Triton (configure must set TRITON_INTERPRET first); None when nothing is known to be wrong."""
    if importlib.util.find_spec("triton") is None:
        return (f"device cpu runs the kernels in Triton's interpreter, and triton is not installed; install the "
                f"cpu extra, which pins triton 3.6.0 and numpy < 2.4: {CPU_INSTALL}")
    triton_version = _installed_version("triton")
    numpy_version = _installed_version("numpy")
    if triton_version is None or numpy_version is None:
        return None  # another distribution of Triton (a nightly): nothing known about it
    if _release(triton_version)[:2] > LAST_TRITON_WITH_THE_LIMIT:
        return None
    if _release(numpy_version)[:2] < INTERPRETER_NUMPY_BELOW:
        return None
    below = ".".join(map(str, INTERPRETER_NUMPY_BELOW))
    return (f"device cpu runs the kernels in Triton {triton_version}'s interpreter, which needs numpy < {below}; "
            f"found numpy {numpy_version} (with it, every CPU item errors with TypeError('only 0-dimensional arrays "
            f"can be converted to Python scalars')). Install the cpu extra, which pins numpy < {below}: {CPU_INSTALL} "
            f"(or pip install 'numpy<{below}')")


def configure(requested: str = "auto") -> str:
    """Resolve the device and set ``TRITON_INTERPRET`` to match, before any kernel module is imported. Under the
    interpreter, autotuners without a benchmarker of their own get a deterministic stand-in
    (``harness.triton_autotuner.use_interpreter_benchmarker``), and the interpreter does not repeat work it already did
    (``harness.triton_interpreter.install``). Raises RuntimeError for the interpreter where this
    Python's Triton or numpy cannot run it (``interpreter_install_problem``), naming the install line."""
    device = resolve_device(requested)
    if device == "cpu":
        problem = interpreter_install_problem()
        if problem:
            raise RuntimeError(problem)
    want = "1" if device == "cpu" else "0"
    # kernels.backend is the module that reads the variable (once, when imported, before any kernel is defined);
    # the package and its triton-free modules (kernels.environment, kernels.interface) may be imported earlier.
    if "kernels.backend" in sys.modules and os.environ.get("TRITON_INTERPRET", "0") != want:
        raise RuntimeError(
            f"kernels were imported with TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')} "
            f"before the harness selected device {device!r}; select the device first"
        )
    os.environ["TRITON_INTERPRET"] = want
    if device == "cuda":
        share_autotuning_results()
    else:
        # Triton's default autotuning benchmarker needs a GPU driver: without a stand-in, any provider's autotuned
        # kernel that brings no benchmarker of its own fails at its first launch under the interpreter.
        from harness import triton_interpreter
        from harness.triton_autotuner import use_interpreter_benchmarker

        use_interpreter_benchmarker()
        # The interpreter repeats work whose result it already has (harness.triton_interpreter); the operations and
        # their bits are the same.
        triton_interpreter.install()
    return device


# What sizes the thread pools of the BLAS and OpenMP libraries numpy and torch load (OpenBLAS, MKL, GNU and Intel
# OpenMP), each read once, when the library loads: a process started with it set gets pools of that size.
BLAS_THREADS_ENV = "OMP_NUM_THREADS"

AUTOTUNE_CACHE_ENV = "TRITON_CACHE_AUTOTUNING"
SHARED_GPU_AUTOTUNE_MS = "1,5"


def shorten_autotuning() -> None:
    """For processes that share a GPU with other test workers: their tuning timings are noise (the other workers'
    kernels run in between), so measuring each config for 125 ms buys nothing, and with dozens of tuning keys per
    worker it would be most of the GPU suite's time. Any config is correct (every one is tested), so a short budget
    changes nothing a check expects. A caller's own setting wins. Call after ``configure``: the variable's name is
    the kernels' (``kernels.environment``), and importing the kernels package settles the interpreter choice."""
    from kernels.environment import AUTOTUNE_BUDGET_ENV

    os.environ.setdefault(AUTOTUNE_BUDGET_ENV, SHARED_GPU_AUTOTUNE_MS)


def share_autotuning_results() -> None:
    """Keep autotuning results in the Triton cache (shared by xdist workers), unless the caller chose otherwise.

    Each process otherwise benchmarks every config of every tuning key itself, and the suite has dozens of keys per
    worker. Which config wins never changes what a check expects: a check compares
    calls made in one process, with one tuned config per key, and tests/test_kernel_stages.py forces every config.
    Triton reads this when an autotuner is created, so it must be set before the kernel modules are imported.
    """
    os.environ.setdefault(AUTOTUNE_CACHE_ENV, "1")


def restore_environment(before: dict[str, str], names) -> None:
    """Set each of ``names`` back to its value in ``before`` (a copy of ``os.environ``), unset where it had none: what
    a run or a command set for itself, given back to the process that goes on after it."""
    for name in names:
        if name in before:
            os.environ[name] = before[name]
        else:
            os.environ.pop(name, None)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def current_device() -> str:
    """The device the kernels of this process run on, as ``--device`` spells it (after ``configure``)."""
    return "cpu" if interpreting() else "cuda"
