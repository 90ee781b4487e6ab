"""The processes of a pytest run: the xdist controller, which runs no kernels and prepares its workers, and each
worker's life (GPU pinning, its CUDA context on a side thread, torch's thread share, its early exit)."""

from __future__ import annotations

import os
import re
import sys
import tempfile

import pytest

from harness import backend, compile_claims
from ssd_pytest import private_api

GPU_LIST_ENV = "SSD_HARNESS_VISIBLE_GPUS"  # set by the controller, read by workers
# Set by the controller where workers have roles (``xdist_scheduling.plan_worker_roles``): gw0 .. gw<K-1> are case
# workers, the others test workers.
CASE_WORKERS_ENV = "SSD_HARNESS_CASE_WORKERS"
CASES, TESTS = "cases", "tests"

_cuda_context_key = pytest.StashKey[object]()  # an xdist worker's context-creating thread (backend)
_role_key = pytest.StashKey[str | None]()  # an xdist worker's role (role_of), read once at its start
_auto_workers_key = pytest.StashKey[str]()  # the controller's -n auto choice on GPUs, for the run's header


def worker_index(worker_id: str | None) -> int | None:
    """``gw3`` -> 3; None for the controller or a plain run."""
    m = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(m.group(1)) if m else None


def xdist_worker_count() -> int:
    """Workers in this xdist run (1 without xdist), as xdist tells each worker."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def role_of(worker_id: str | None, case_workers: int | None) -> str | None:
    """``CASES`` or ``TESTS``: the kind of work xdist worker ``worker_id`` is for, where the controller planned
    ``case_workers`` case workers (gw0 .. gw<K-1>); None where it planned no roles (every worker then runs both
    kinds the same way).

    A case worker's case items run in its child process, which makes the child's CUDA context; the worker itself
    makes none unless a test comes to it. A test worker makes its own context at start and starts its child only
    if a case item comes to it. So each worker holds one context instead of two (the driver makes contexts one at a
    time, and each costs host time to make, keep and tear down), and no kernel is loaded in both a worker and its
    child. The scheduler hands each worker its own kind first (``xdist_scheduling``)."""
    index = worker_index(worker_id)
    if case_workers is None or index is None:
        return None
    return CASES if index < case_workers else TESTS


def planned_case_workers() -> int | None:
    """In a worker: the controller's ``case_workers`` (``CASE_WORKERS_ENV``, inherited at the worker's start)."""
    raw = os.environ.get(CASE_WORKERS_ENV, "")
    return int(raw) if raw.isdigit() else None


def worker_role(config: pytest.Config) -> str | None:
    """This process's role (``role_of``), as ``start_worker`` found it; None outside an xdist worker."""
    return config.stash.get(_role_key, None)


def case_worker_count(workers: int, case_share: float) -> int:
    """How many of ``workers`` (at least two) are case workers, for case items that are ``case_share`` of the
    run's expected time: at least one of each kind."""
    return min(workers - 1, max(1, round(workers * case_share)))


def gpu_for_worker(worker_id: str, visible: list[str]) -> str:
    """Round-robin: worker gw<N> gets ``visible[N % len(visible)]``."""
    index = worker_index(worker_id)
    if index is None or not visible:
        raise ValueError(f"gpu_for_worker: expected a gw<N> worker id and GPUs, found {worker_id!r}, {visible}")
    return visible[index % len(visible)]


def cpu_threads_per_worker(workers: int, cores: int) -> int:
    """torch's intra-op threads for one of ``workers`` processes on ``cores`` cores: a fair share, at least one.
    Each process otherwise starts one thread per core, and N workers' CPU work (references, input building) then
    fights over N times as many threads as cores."""
    return max(1, cores // max(1, workers))


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# What one xdist worker on a GPU takes beyond a core, as budgets: host memory for the worker and its case items'
# child process (each imports torch and Triton and holds a case's CPU reference tensors), and GPU memory for their
# CUDA contexts and the largest corpus case's tensors and workspaces. A host short of either runs fewer workers
# rather than swapping or failing allocations.
HOST_BYTES_PER_GPU_WORKER = 4 << 30
GPU_BYTES_PER_WORKER = 4 << 30


def workers_per_gpu_for_host(cores: int, host_memory: int, gpu_memory: int, gpus: int) -> int:
    """``-n auto``'s xdist workers per GPU on a host with ``cores`` usable cores, ``host_memory`` bytes of memory and
    ``gpus`` GPUs of ``gpu_memory`` bytes each: one worker per core (a worker's time is mostly host work: starting
    kernels, Triton's launcher, references, inputs; the GPU runs many workers' small kernels side by side), shared
    among the GPUs, as many as the host's and each GPU's memory hold (``HOST_BYTES_PER_GPU_WORKER``,
    ``GPU_BYTES_PER_WORKER``); at least one."""
    gpus = max(1, gpus)
    by_cores = cores // gpus
    by_host_memory = host_memory // (HOST_BYTES_PER_GPU_WORKER * gpus)
    by_gpu_memory = gpu_memory // GPU_BYTES_PER_WORKER
    return max(1, min(by_cores, by_host_memory, by_gpu_memory))


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def workers_per_gpu(config: pytest.Config, gpus: list[str]) -> tuple[int, str]:
    """The workers per GPU this run uses with ``-n auto``, and why: ``--workers-per-gpu`` where given, else
    ``workers_per_gpu_for_host`` on this host."""
    override = config.getoption("workers_per_gpu")
    if override is not None:
        return max(1, override), "--workers-per-gpu"
    cores, host_memory, gpu_memory = usable_cores(), host_memory_bytes(), backend.nvml_smallest_gpu_memory()
    chosen = workers_per_gpu_for_host(cores, host_memory, gpu_memory, len(gpus))
    return chosen, (f"{cores} cores, {host_memory / 2**30:.0f} GiB host memory, {len(gpus)} GPU(s) of "
                    f"{gpu_memory / 2**30:.0f} GiB")


def auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: ``workers_per_gpu`` workers per GPU on a GPU machine, else one per CPU core. The GPU choice is
    kept for the run's header (``auto_workers_header``)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own override wins
    gpus = listed_gpus(config)
    if not gpus:
        return usable_cores()
    per_gpu, reason = workers_per_gpu(config, gpus)
    config.stash[_auto_workers_key] = (f"ssd-harness: -n auto = {per_gpu} worker(s) per GPU x {len(gpus)} GPU(s) "
                                       f"({reason})")
    return len(gpus) * per_gpu


def listed_gpus(config: pytest.Config) -> list[str]:
    """The GPUs workers are pinned to (``backend.gpus_for_workers``); none where ``--device`` is invalid for this
    machine, which ``pytest_configure`` reports."""
    try:
        return backend.gpus_for_workers(config.getoption("device"))
    except ValueError:
        return []


def auto_workers_header(config: pytest.Config) -> str | None:
    """The run header's line where ``-n auto`` sized the workers on GPUs: per GPU, and from what."""
    return config.stash.get(_auto_workers_key, None)


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def is_xdist_controller(config: pytest.Config) -> bool:
    """This process starts xdist workers and runs no test itself: xdist's own condition for its distributed session
    (a distribution mode with workers, and not ``--collect-only``, where the process collects by itself). Set by
    xdist's ``pytest_cmdline_main``, so it holds from ``pytest_configure`` on."""
    return (not is_xdist_worker(config) and not config.getoption("collectonly")
            and getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None)))


def process_name() -> str:
    """``gw<N>`` in an xdist worker, ``main`` elsewhere: the name of this process's report part."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


# ---------------------------------------------------------------- the controller


def _claims_dir_for_this_run() -> str:
    """harness.compile_claims: one folder of compile claims per xdist session, removed when it ends."""
    return os.path.join(tempfile.gettempdir(), f"ssd-harness-compile-claims-{os.getpid()}")


def planned_worker_count(config: pytest.Config) -> int:
    """In the xdist controller: how many workers xdist will start (its ``--tx`` specs, which ``-n`` fills in)."""
    return sum(int(spec.split("*", 1)[0]) if "*" in spec else 1 for spec in (config.getoption("tx") or []))


def share_blas_threads(worker_count: int) -> None:
    """In the controller, before xdist starts the workers: each worker's numpy and torch libraries start with the
    worker's fair share of the cores (``cpu_threads_per_worker``), not one thread per core, and so do the processes
    a worker starts. OpenBLAS's threads spin while they wait for work: N workers' interpreted dots (numpy matmuls),
    each spread over every core, then slow each other many-fold. A value already set (the user's) is kept."""
    os.environ.setdefault(backend.BLAS_THREADS_ENV, str(cpu_threads_per_worker(worker_count, usable_cores())))


def prepare_workers(requested_device: str, worker_count: int) -> str:
    """In the xdist controller, which runs no kernels: list the GPUs once, without torch (backend.gpus_for_workers),
    name the compile-claims folder the workers share, and share the cores' threads among the ``worker_count``
    workers (``share_blas_threads``); the workers inherit the environment when xdist spawns them and each resolves
    its device itself. Returns the device the workers will use. Raises RuntimeError, as ``backend.configure`` would
    in each worker, where the workers would run an interpreter this Python cannot run."""
    gpus = backend.gpus_for_workers(requested_device)
    problem = None if gpus else backend.interpreter_install_problem()
    if problem:
        raise RuntimeError(problem)
    share_blas_threads(worker_count)
    os.environ[compile_claims.CLAIMS_ENV] = _claims_dir_for_this_run()  # workers share their warmups' compiles
    if gpus:
        os.environ[GPU_LIST_ENV] = ",".join(gpus)
    return "cuda" if gpus else "cpu"


def release_workers_resources() -> None:
    """In the controller at its end: remove the compile-claims folder this run created."""
    claims = os.environ.get(compile_claims.CLAIMS_ENV)
    if claims and claims == _claims_dir_for_this_run():
        import shutil

        shutil.rmtree(claims, ignore_errors=True)  # the variable: the plugin gives its value back (RUN_ENVIRONMENT)


# ---------------------------------------------------------------- a worker


def pin_worker(worker_id: str) -> None:
    """Runs in a worker before anything touches CUDA: one GPU. The Triton cache directory stays shared: Triton's
    FileCacheManager.put writes each file into a private temp dir and publishes it with an atomic os.replace, and
    writes a kernel's group file only after its children, so a worker sees either nothing (and compiles itself) or a
    complete binary. Sharing lets N workers compile each specialization once instead of N times."""
    gpus = [g for g in os.environ.get(GPU_LIST_ENV, "").split(",") if g]
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_for_worker(worker_id, gpus)


def start_worker(config: pytest.Config, worker_id: str) -> None:
    """An xdist worker's set-up, before its device is configured: the early exit as its last cleanup, one GPU, a fair
    share of torch's threads, the case items' child process forked (``prefork_child``), then the CUDA context
    created on a side thread while the worker configures and collects; with a forked child, only once the child has
    made its own (the driver makes contexts one at a time, and the child's is what the first case item waits for).
    A case worker (``role_of``) makes no context of its own; a test worker makes its own without waiting for its
    child, which it starts only for a case item."""
    config.add_cleanup(lambda: exit_worker_now(config))  # registered first: the last cleanup to run
    pin_worker(worker_id)
    import torch

    torch.set_num_threads(cpu_threads_per_worker(xdist_worker_count(), usable_cores()))
    forked = prefork_child(config)
    role = config.stash[_role_key] = role_of(worker_id, planned_case_workers())
    if config.getoption("device") != "cpu" and os.environ.get(GPU_LIST_ENV) and role != CASES:
        after = None
        if forked and role is None:
            from harness.isolation import spare

            after = spare.wait_for_spare_context
        config.stash[_cuda_context_key] = backend.create_cuda_context_in_background(after=after)


def prefork_child(config: pytest.Config) -> bool:
    """Under process isolation, fork the child that will run this worker's case items now, after torch is imported
    and before CUDA is touched: a child spawned later imports torch again (most of its start-up, paid by the first
    case item, by 16 children at once on a 16-worker GPU run) and a fork after the CUDA driver started is unsafe
    (``harness.isolation.forking``). Where a fork is unsafe anyway, the child is spawned when first needed. The
    spare is this config's (``spare.prefork``'s owner): a test that runs the CLI or an inner session here does not
    take it. Returns whether it forked."""
    from harness.isolation import isolation_mode

    if isolation_mode(config.getoption("isolation")) == "process":
        from harness.isolation import spare

        return not spare.prefork(config, code_ran_before=True)  # the conftest files pytest imported before
    return False


def holds_cuda_context(config: pytest.Config) -> bool:
    """Whether this process made a CUDA context of its own: on its side thread at start, or through torch."""
    torch = sys.modules.get("torch")
    return (config.stash.get(_cuda_context_key, None) is not None
            or (torch is not None and torch.cuda.is_initialized()))


def join_cuda_context(config: pytest.Config) -> None:
    thread = config.stash.get(_cuda_context_key, None)
    if thread is not None:
        thread.join(timeout=120)  # never exit while it is inside the driver


def exit_worker_now(config: pytest.Config) -> None:
    """An xdist worker's last cleanup: leave without the interpreter's shutdown, once xdist has the worker's results
    (``private_api.finished_worker_exit_status``) and its report part is written. The process's teardown, on a GPU
    mostly the driver destroying its CUDA context (one at a time per GPU), then overlaps the items other workers
    still run, instead of every worker waiting for the last one and all tearing down together at the end."""
    status = private_api.finished_worker_exit_status(config)
    if status is None:
        return  # the interpreter's own shutdown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
