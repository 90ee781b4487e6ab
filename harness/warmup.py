"""The kernels' warmup (``kernels.warmup``) as the harness runs it: from a case corpus, with compile strategies for
many processes at once, and as ``python -m harness warmup``.

Two strategies on top of the kernels' in-process compile, both only on the GPU:

- Claims (``harness.compile_claims``): processes that warm at the same time and share one Triton disk cache (xdist
  workers; the pytest plugin names a claims folder in ``SSD_HARNESS_COMPILE_CLAIMS``) claim each binary before
  compiling it, so that overlapping requests are not compiled once per worker.
- Children (``jobs > 1``): Triton compiles one kernel at a time per process. At the first specialization the disk
  cache lacks, ``jobs`` child processes compile a part of the plan each into the disk cache, then this process loads
  everything from there. Whether a spec was compiled or loaded is read from the disk cache folder (a compile adds an
  entry, a load adds none), so a warm cache never pays for starting the children.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import torch

from harness.compile_claims import ClaimBoard, compile_claimed
from kernels import warmup as registry
from kernels.warmup import ModelShape, PlannedSpec, compile_spec


@dataclass
class WarmupReport(registry.WarmupReport):
    jobs: int = 1  # processes that compiled first (``jobs`` > 1), before this one loaded everything
    parallel_seconds: float = 0.0  # their wall time (included in ``seconds``)

    def how(self) -> str:
        return f", by {self.jobs} processes in {self.parallel_seconds:.2f}s then loaded" if self.jobs > 1 else ""


def requests_from_cases(cases: Iterable[Any]) -> list[tuple[ModelShape, tuple, tuple, dict]]:
    """The registry request (``kernels.warmup.model_request``) of each distinct model configuration of ``cases``
    (``harness.checks.hooks.model_configs``): shape, dtypes and D/z/dt options. Paths, modes and index classes
    stay complete: a check may call a case on either path and in a mode other than its own, but never with other
    options or dtypes."""
    from harness.checks.hooks import model_configs

    return list({repr(r): r for r in map(registry.model_request, model_configs(cases))}.values())


def claimed(claims: ClaimBoard):
    """The strategy that compiles a spec only under claims on all its binaries (``compile_claimed``)."""

    def compile_plan(planned: list[PlannedSpec], order: list[int]) -> None:
        names = [[ClaimBoard.name(k.kernel, k.key) for k in p.keys] for p in planned]
        compile_claimed([(p.spec, n) for p, n in zip(planned, names, strict=True)], order, claims, compile_spec)

    return compile_plan


@dataclass
class ChildrenAtFirstCompile:
    """The strategy that hands the plan to ``jobs`` child processes at the first real compile, then loads."""

    requests: list[tuple]
    names: list[str]
    jobs: int
    seconds: float = 0.0  # the children's wall time; 0 when none started

    def __call__(self, planned: list[PlannedSpec], order: list[int]) -> None:
        spawn = True
        for i in order:
            before = _disk_cache_entries() if spawn else None
            compile_spec(planned[i].spec)
            if spawn and (before is None or _disk_cache_entries() != before):
                # A real compile (or a cache we cannot see into): the children compile the rest in parallel, and
                # this process loads it from the disk cache below.
                self.seconds = _compile_in_children(self.requests, self.names, self.jobs)
                spawn = False


def in_process(planned: list[PlannedSpec], order: list[int]) -> None:
    """Everything compiles in this process, one spec after another (``compile_spec`` is looked up here at call
    time, so that a test can stand in for the compiler)."""
    for i in order:
        compile_spec(planned[i].spec)


@contextlib.contextmanager
def hook_strategy(device: str, first: float = 0.0) -> Iterator[None]:
    """Inside the block, ``kernels:provider``'s warmup hook compiles as this process's warmups do (on the GPU under
    the claims board ``SSD_HARNESS_COMPILE_CLAIMS`` names, shared with the processes warming at once), from
    fraction ``first`` of its plan. Another provider's hook is not affected: it compiles however it does."""
    claims = ClaimBoard.from_env() if device == "cuda" else None
    with registry.hook_compiles_with(claimed(claims) if claims is not None else in_process, first):
        yield


def warmup_all(device: str, requests: Iterable[tuple], *, kernels: Iterable[str] | None = None, first: float = 0.0,
               part: tuple[int, int] | None = None, jobs: int = 1, claims: ClaimBoard | None = None) -> WarmupReport:
    """``kernels.warmup.warmup_all`` with the strategy for this process: ``claims`` (GPU; default the board named by
    ``SSD_HARNESS_COMPILE_CLAIMS`` when ``jobs`` is 1) shares compiles with the processes warming at the same time,
    ``jobs > 1`` (GPU, whole plan) compiles in child processes first; otherwise everything compiles here. The
    children of ``jobs`` claim their parts on the same board (they inherit the environment); the parent only loads
    after them and claims nothing."""
    requests = list(requests)
    names = registry.registered() if kernels is None else list(kernels)
    if claims is None and device == "cuda" and jobs == 1:
        claims = ClaimBoard.from_env()
    children = None
    if claims is not None:
        strategy = claimed(claims)
    elif jobs > 1 and part is None and device == "cuda":
        strategy = children = ChildrenAtFirstCompile(requests, names, jobs)
    else:
        strategy = in_process
    report = registry.warmup_all(device, requests, kernels=names, first=first, part=part, compile=strategy)
    spawned = children is not None and children.seconds > 0
    return WarmupReport(report.keys, report.compiled, report.seconds, report.per_kernel, report.enumerated,
                        jobs=jobs if spawned else 1, parallel_seconds=children.seconds if spawned else 0.0)


def warmup(device: str, shape: ModelShape, io_dtypes: Sequence[torch.dtype], state_dtypes: Sequence[torch.dtype], *,
           kernels: Iterable[str] | None = None, **request: Any) -> WarmupReport:
    """``warmup_all`` for one request; ``request``: further ``WarmupRequest`` fields."""
    return warmup_all(device, [(shape, tuple(io_dtypes), tuple(state_dtypes), request)], kernels=kernels)


def _disk_cache_entries() -> int | None:
    """Entries in Triton's disk cache folder (a compile adds one; a load adds none), or None when it has none."""
    from triton import knobs

    try:
        return len(os.listdir(knobs.cache.dir))
    except (OSError, TypeError):
        return None


def _compile_in_children(requests: list[tuple], names: list[str], jobs: int) -> float:
    """Run ``compile_part`` for parts 0..jobs-1 of ``requests`` in child processes; raise naming any part that
    failed. Returns their wall time."""
    from harness.guards.gpu_compile import compiler_child_env

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "requests.pkl")
        with open(job, "wb") as fh:
            pickle.dump((requests, names), fh)
        env = compiler_child_env()
        code = "import sys; from harness.warmup import compile_part; compile_part(sys.argv[1], sys.argv[2])"
        children = [subprocess.Popen([sys.executable, "-c", code, job, f"{k}/{jobs}"], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                    for k in range(jobs)]
        errors = [child.communicate()[1] for child in children]
    failed = [f"part {k}/{jobs} (exit {c.returncode}):\n{err[-2000:]}"
              for k, (c, err) in enumerate(zip(children, errors, strict=True)) if c.returncode != 0]
    if failed:
        raise RuntimeError("warmup: parallel compile failed:\n" + "\n".join(failed))
    return time.perf_counter() - start


def compile_part(job: str, part: str) -> None:
    """Child body of ``_compile_in_children``: compile part ``K/N`` of the pickled requests."""
    with open(job, "rb") as fh:
        requests, names = pickle.load(fh)
    k, n = (int(v) for v in part.split("/"))
    warmup_all("cuda", requests, kernels=names, part=(k, n))


_DTYPE_NAMES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness warmup``: compile (GPU) or key (interpreter) every specialization the SSD path needs for
    the shapes of a case corpus (or one ``--shape``), print the time and the number of specializations.

    The backend is the one the kernels were imported for (``harness.backend.configure`` runs before); ``--device``
    only checks it. Exit status 0; 2 on bad arguments.
    """
    from triton import knobs

    parser = argparse.ArgumentParser(
        prog="python -m harness warmup",
        description="Compile (GPU) or key (interpreter) every specialization the SSD path needs for the shapes of a "
                    "case corpus (or one --shape); print the time and the number of specializations.")
    parser.add_argument("paths", nargs="*", default=["cases"], help="case files or directories (default: cases)")
    parser.add_argument("--shape", help="one model shape instead of the cases: nheads,headdim,dstate,ngroups,chunk")
    parser.add_argument("--io", nargs="+", choices=sorted(_DTYPE_NAMES), help="io dtypes (with --shape)")
    parser.add_argument("--state", nargs="+", choices=sorted(_DTYPE_NAMES), help="state dtypes (with --shape)")
    parser.add_argument("--kernels", nargs="+", choices=registry.registered(),
                        help="registrations to warm (default all)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="cuda, or cpu (Triton interpreter); auto = cuda when visible (default)")
    parser.add_argument("--verbose", action="store_true", help="list every specialization")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="compile in N processes first (each a share, into the Triton disk cache), then load "
                             "everything here (GPU only; default 1)")
    parser.add_argument("--part", default=None, metavar="K/N",
                        help="compile only every N-th specialization from the K-th (0-based; to split by hand)")
    args = parser.parse_args(argv)
    part = None
    if args.part:
        try:
            k, n = (int(v) for v in args.part.split("/"))
        except ValueError:
            k, n = -1, 0
        if not 0 <= k < n:
            parser.error(f"--part: expected K/N with 0 <= K < N, found {args.part!r}")
        part = (k, n)
    if args.jobs < 1:
        parser.error(f"--jobs: expected a positive count, found {args.jobs}")

    device = "cpu" if knobs.runtime.interpret else "cuda"
    if args.device not in ("auto", device):
        parser.error(f"--device {args.device}: kernels were imported for {device} (set it before importing kernels)")
    if args.shape:
        try:
            shape = ModelShape(*(int(v) for v in args.shape.split(",")))
        except (TypeError, ValueError):
            parser.error(f"--shape: expected nheads,headdim,dstate,ngroups,chunk_size; found {args.shape!r}")
        io = tuple(_DTYPE_NAMES[d] for d in (args.io or _DTYPE_NAMES))
        state = tuple(_DTYPE_NAMES[d] for d in (args.state or _DTYPE_NAMES))
        requests = [(shape, io, state)]
    else:
        from harness.cases.loader import load_cases

        requests = requests_from_cases(load_cases(args.paths))
        if not requests:
            parser.error(f"no cases under {args.paths}")
    report = warmup_all(device, requests, kernels=args.kernels, part=part, jobs=args.jobs)
    shapes = len({r[0] for r in requests})
    print(f"{report.summary()} over {shapes} model shape(s), {len(requests)} option set(s) on {device}")
    if device == "cpu":
        print("(interpreter: nothing compiles; the keys are what the GPU would compile, and what the CPU guard "
              "compares launches against)")
    if args.verbose:
        for k in report.keys:
            print("  " + k.describe())
    return 0
