"""pytest plugin: YAML cases become items ``<file>::<case id>::<check>`` (docs/checks.md).

Loaded by the root ``conftest.py``. Options (group "ssd-harness"): ``--device``, ``--provider``,
``--workers-per-gpu``, ``--json-report``, ``--shard``, ``--recompile-guard``. Under ``pytest -n auto`` on a GPU machine
each xdist worker is pinned to one GPU round-robin (``CUDA_VISIBLE_DEVICES`` from ``gw<N>``) before CUDA initialises;
workers share one Triton cache directory (safe, see ``_pin_worker``); on the CPU there is one worker per core. Items carry junit properties (case id, check, seed,
family, max ulp) through ``user_properties``, which xdist forwards to the controller.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

import pytest

from harness import DEFAULT_PROVIDER, backend, compile_claims, timeline
from harness.report import MESSAGE_CHARS, ItemRecord, Report, append_live, clear_parts, merge_parts, summary_lines, write_part
from harness.sharding import ItemCosts, LongestFirstQueue

CASE_SUFFIXES = (".yaml", ".yml")
GPU_LIST_ENV = "SSD_HARNESS_VISIBLE_GPUS"  # set by the controller, read by workers

_device_key = pytest.StashKey[str]()
_provider_key = pytest.StashKey[dict]()
_records_key = pytest.StashKey[list]()
_case_ids_key = pytest.StashKey[dict]()
_costs_key = pytest.StashKey[ItemCosts]()
_phases_key = pytest.StashKey[dict]()  # this process's start-up phases (harness.timeline)
_ledger_key = pytest.StashKey[object]()  # this process's compile ledger (None in the controller)
_cuda_context_key = pytest.StashKey[object]()  # an xdist worker's context-creating thread (backend)


# ---------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ssd-harness", "Mamba2 SSD correctness harness")
    group.addoption("--device", choices=backend.DEVICES, default="auto",
                    help="cuda, or cpu (Triton interpreter); auto = cuda when visible. Default: auto")
    group.addoption("--provider", default=None, metavar="MODULE:ATTR",
                    help="the ssd_prefill provider under test (default: kernels:provider)")
    group.addoption("--workers-per-gpu", type=int, default=1, metavar="N",
                    help="with -n auto on a GPU machine: xdist workers per GPU (default 1)")
    group.addoption("--json-report", default=None, metavar="FILE",
                    help="write one merged JSON report (every item's outcome, duration, mismatch summary)")
    group.addoption("--shard", default=None, metavar="K/N",
                    help="run only shard K of N (deterministic, balanced by expected cost)")
    group.addoption("--durations-from", default=None, metavar="REPORT",
                    help="a JSON report of an earlier run (--json-report): its item durations are the expected "
                         "costs that balance --shard and, under -n, hand out the longest work first")
    group.addoption("--recompile-guard", action="store_true",
                    help="before a case's first item, a compile-only warmup of its model configuration (once per "
                         "configuration and worker); then fail any case item during which a kernel compiles (GPU) or "
                         "launches a specialization that warmup did not produce (interpreter)")


# ---------------------------------------------------------------- workers and devices


def worker_index(worker_id: str | None) -> int | None:
    """``gw3`` -> 3; None for the controller or a plain run."""
    m = re.fullmatch(r"gw(\d+)", worker_id or "")
    return int(m.group(1)) if m else None


def xdist_worker_count() -> int:
    """Workers in this xdist run (1 without xdist), as xdist tells each worker."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


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


def _usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _pin_worker(worker_id: str) -> None:
    """Runs in a worker before anything touches CUDA: one GPU. The Triton cache directory stays shared: Triton's
    FileCacheManager.put writes each file into a private temp dir and publishes it with an atomic os.replace, and
    writes a kernel's group file only after its children, so a worker sees either nothing (and compiles itself) or a
    complete binary. Sharing lets N workers compile each specialization once instead of N times."""
    gpus = [g for g in os.environ.get(GPU_LIST_ENV, "").split(",") if g]
    if gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu_for_worker(worker_id, gpus)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: one worker per GPU (times --workers-per-gpu) on a GPU machine, else one per CPU core."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own override wins
    try:
        gpus = backend.gpus_for_workers(config.getoption("device"))
    except ValueError:
        gpus = []  # pytest_configure reports it
    if gpus:
        return max(1, len(gpus) * max(1, config.getoption("workers_per_gpu")))
    return _usable_cores()


def case_scope(nodeid: str, groups: dict[str, str] | None = None) -> str:
    """The xdist work unit of an item: every check of one YAML case goes to one worker (its inputs are built once,
    its kernels compiled and tuned once); a test marked ``xdist_group(name)`` goes with its group (``groups``:
    nodeid -> name, as the workers report it), so an expensive module fixture runs in one worker; any other item
    is a unit of its own."""
    if groups and nodeid in groups:
        return f"xdist_group:{groups[nodeid]}"
    path, sep, rest = nodeid.partition("::")
    if sep and path.endswith(CASE_SUFFIXES):
        return f"{path}::{rest.split('::', 1)[0]}"
    return nodeid


GROUPS_FILE_ENV = "SSD_HARNESS_XDIST_GROUPS"  # where workers write {nodeid: xdist_group name} for the controller


def _groups_file_for_this_run() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"ssd-harness-xdist-groups-{os.getpid()}.json")


def _claims_dir_for_this_run() -> str:
    """harness.compile_claims: one folder of compile claims per xdist session, removed when it ends."""
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"ssd-harness-compile-claims-{os.getpid()}")


def _write_xdist_groups(session: pytest.Session) -> None:
    """In an xdist worker, before xdist reports the collection: write the ``xdist_group`` of every marked item for
    the controller's scheduler (xdist's own way, an ``@name`` id suffix, sets a private attribute that pytest 9.2
    no longer reads). Every worker collects the same items, so each writes the same file."""
    path = os.environ.get(GROUPS_FILE_ENV)
    if not path or not hasattr(session.config, "workerinput"):
        return
    import json

    groups = {}
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(groups, fh)
    os.replace(tmp, path)


def _read_groups(path: str | None) -> dict[str, str]:
    import json

    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``-n N`` (``--dist load``, or ``loadgroup``): load scheduling by ``case_scope`` units, in collection order (the Python
    tests, whose single items are the longest, first; the many short case units fill the end), or costliest unit
    first with ``--durations-from``. Other ``--dist`` modes are xdist's own."""
    if config.getoption("dist", "no") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class CaseScopeScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            # xdist's reorder (largest unit first) put every 10-check case before the single-item tests, so slow
            # tests started last and held GPU runs 5 and 6 past their limits.
            config.option.loadscopereorder = False
            self._groups: dict[str, str] | None = None
            self._second_round: list | None = None  # nodes held back during the first hand-out (``schedule``)
            costs = _measured_costs(config)
            if costs is not None:
                self.workqueue = LongestFirstQueue(costs)

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first called once every worker has collected (and written the file)
                self._groups = _read_groups(os.environ.get(GROUPS_FILE_ENV))
            return case_scope(nodeid, self._groups)

        def schedule(self) -> None:
            """xdist hands every node one unit, then (``_reschedule``, "at least two units") a second one, both
            rounds in node order: the node given the costliest first unit also got the costliest second one (GPU
            run 29: the 18.5 s warmup test paired with the 5.8 s xdist test, that worker 2.9 s behind the rest).
            The second round goes in reverse: the costliest remaining unit to the node whose first is cheapest."""
            self._second_round = [] if self.collection is None else None
            super().schedule()
            second, self._second_round = self._second_round, None
            for node in reversed(second or []):
                super()._reschedule(node)

        def _reschedule(self, node) -> None:
            if self._second_round is not None:
                self._second_round.append(node)  # held back until the first round is over (``schedule``)
                return
            super()._reschedule(node)

    return CaseScopeScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.stash[_phases_key] = timeline.new_phases()
    config.stash[_ledger_key] = None
    worker_id = os.environ.get("PYTEST_XDIST_WORKER")
    if worker_id and hasattr(config, "workerinput"):
        config.add_cleanup(lambda: _exit_worker_now(config))  # registered first: the last cleanup to run
        _pin_worker(worker_id)
        if config.getoption("device") != "cpu" and os.environ.get(GPU_LIST_ENV):
            config.stash[_cuda_context_key] = backend.create_cuda_context_in_background()
        import torch

        torch.set_num_threads(cpu_threads_per_worker(xdist_worker_count(), _usable_cores()))
    requested = config.getoption("device")
    try:
        if _is_xdist_controller(config):
            # The controller runs no kernels: it lists the GPUs once, without torch (backend.gpus_for_workers),
            # and the workers inherit the environment when xdist spawns them; each resolves its device itself.
            os.environ[GROUPS_FILE_ENV] = _groups_file_for_this_run()
            os.environ[compile_claims.CLAIMS_ENV] = _claims_dir_for_this_run()  # workers share their warmups' compiles
            gpus = backend.gpus_for_workers(requested)
            if gpus:
                os.environ[GPU_LIST_ENV] = ",".join(gpus)
            config.stash[_device_key] = "cuda" if gpus else "cpu"
        else:
            config.stash[_device_key] = backend.configure(requested)  # before any kernel module is imported
            config.stash[_ledger_key] = timeline.install_compile_ledger()
            if config.stash[_device_key] == "cuda" and xdist_worker_count() > 1:
                backend.shorten_autotuning()
    except (ValueError, RuntimeError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_provider_key] = {}
    config.stash[_records_key] = []
    config.pluginmanager.register(_Recorder(config), "ssd-harness-recorder")
    config.stash[_case_ids_key] = {}
    report_path = config.getoption("json_report")
    if report_path and not hasattr(config, "workerinput"):
        clear_parts(report_path)
    config.addinivalue_line("markers", "ssd_case: an item generated from a YAML case")


def pytest_sessionstart(session: pytest.Session) -> None:
    timeline.mark(session.config.stash[_phases_key], "configured")  # every plugin's pytest_configure has run


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    ledger = item.config.stash.get(_ledger_key, None)
    if ledger is not None:
        ledger.origin = item.nodeid  # compiles from here to the next item's setup are this item's


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: a worker has finished its session (the last one's time is kept); the controller's session
    ends once every worker process has exited."""
    timeline.mark(node.config.stash[_phases_key], "workers_finished")


def _exit_worker_now(config: pytest.Config) -> None:
    """An xdist worker's last cleanup: leave without the interpreter's shutdown. By now xdist has sent
    ``workerfinished`` (with the session's outcome; it ignores the end of a worker's channel after that) and the
    report part is written. The process's teardown, on a GPU mostly the driver destroying its CUDA context one at a
    time per GPU, then overlaps the items other workers still run: without this every worker waited for the last
    one and all 32 exited together, ~3 s at the end of each two-GPU run (GPU runs 25-33, scripts/exit_probe.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(getattr(config, "workeroutput", {}).get("exitstatus", 0)))


def _is_xdist_controller(config: pytest.Config) -> bool:
    """This process starts xdist workers and runs no test itself: xdist's own condition for its distributed session
    (a distribution mode with workers, and not ``--collect-only``, where the process collects by itself). Set by
    xdist's ``pytest_cmdline_main``, so it holds from ``pytest_configure`` on."""
    return (not hasattr(config, "workerinput") and not config.getoption("collectonly")
            and getattr(config.option, "dist", "no") != "no" and bool(getattr(config.option, "tx", None)))


def pytest_unconfigure(config: pytest.Config) -> None:
    thread = config.stash.get(_cuda_context_key, None)
    if thread is not None:
        thread.join(timeout=120)  # never exit while it is inside the driver
    if hasattr(config, "workerinput"):
        return
    path = os.environ.get(GROUPS_FILE_ENV)
    if path and path == _groups_file_for_this_run():
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    claims = os.environ.get(compile_claims.CLAIMS_ENV)
    if claims and claims == _claims_dir_for_this_run():
        import shutil

        shutil.rmtree(claims, ignore_errors=True)
        del os.environ[compile_claims.CLAIMS_ENV]


def pytest_report_header(config: pytest.Config) -> list[str]:
    spec = config.getoption("provider") or DEFAULT_PROVIDER
    return [f"ssd-harness: device={config.stash[_device_key]} provider={spec}"]


# ---------------------------------------------------------------- collection


def _explicit_paths(config: pytest.Config) -> list[Path]:
    out = []
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0])
        path = path if path.is_absolute() else Path(config.invocation_params.dir) / path
        out.append(path.resolve())
    return out


REPO_ROOT = Path(__file__).resolve().parents[1]


def _is_case_file(file_path: Path, config: pytest.Config) -> bool:
    """YAML under ``<repo>/cases`` (or ``<rootdir>/cases``), a YAML file named on the command line, or YAML under a
    folder named on the command line other than the repository itself (whose other YAML is not ours) and its
    ``tests/`` (fixtures such as the malformed files, which are cases only when named one by one)."""
    if file_path.suffix not in CASE_SUFFIXES:
        return False
    resolved = file_path.resolve()
    for root in {REPO_ROOT, Path(config.rootpath).resolve()}:
        if (root / "cases") in resolved.parents:
            return True
    fixtures = REPO_ROOT / "tests"  # the harness's own YAML fixtures (malformed files, ...): cases only by name
    for arg in _explicit_paths(config):
        if arg == resolved:
            return True
        if (arg.is_dir() and arg in resolved.parents and arg != REPO_ROOT and arg not in REPO_ROOT.parents
                and fixtures not in resolved.parents):
            return True
    return False


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if _is_case_file(file_path, parent.config):
        return CaseFile.from_parent(parent, path=file_path)
    return None


class CaseCollectionError(Exception):
    """A case file that cannot become items; shown as the loader's one-line message, not a traceback."""


class CaseFile(pytest.File):
    def collect(self):
        from harness.cases.loader import load_case_file
        from harness.cases.schema import CaseError
        from harness.checks import selected_checks

        try:
            cases = load_case_file(self.path)
        except CaseError as exc:
            raise CaseCollectionError(str(exc)) from None
        seen = self.config.stash[_case_ids_key]
        for case in cases:
            other = seen.setdefault(case.id, str(self.path))
            if other != str(self.path):
                raise CaseCollectionError(
                    f"{self.path}: id: expected an id unique across files, found {case.id!r} also in {other}"
                )
            try:
                checks = selected_checks(case)
            except ValueError as exc:
                raise CaseCollectionError(f"{self.path}: {exc}") from None
            yield CaseNode.from_parent(self, name=case.id, case=case, checks=checks)

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(CaseCollectionError):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)


class CaseNode(pytest.Collector):
    """One case; its children are the checks it runs. Shares built inputs among them."""

    def __init__(self, *, case, checks, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.checks = checks
        self._context = None

    def collect(self):
        for name, explicit in self.checks:
            yield CheckItem.from_parent(self, name=name, check=name, explicit=explicit)

    def context(self, provider, device: str, provider_spec: str):
        from harness.checks import CheckContext

        if self._context is None or self._context.provider is not provider:
            self._context = CheckContext(self.case, provider, device, provider_spec)
        return self._context

    def teardown(self) -> None:
        self._context = None  # release this case's tensors before the next case


class CheckFailed(Exception):
    """A check failed; its message is the full report (what differed, the case, the repro line)."""


def _provider(config: pytest.Config):
    from harness.checks.providers import load_provider

    spec = config.getoption("provider") or DEFAULT_PROVIDER
    cache = config.stash[_provider_key]
    if spec not in cache:
        try:
            cache[spec] = (load_provider(spec), None)
        except Exception as exc:  # noqa: BLE001 - every item reports why the provider is unusable
            cache[spec] = (None, f"{type(exc).__name__}: {exc}")
    return spec, cache[spec]


class CheckItem(pytest.Item):
    def __init__(self, *, check: str, explicit: bool, **kwargs):
        super().__init__(**kwargs)
        self.check = check
        self.explicit = explicit
        case = self.parent.case
        self.add_marker("ssd_case")
        self.user_properties += [("case_id", case.id), ("check", check), ("seed", case.seed),
                                 ("family", case.family)]

    @property
    def case(self):
        return self.parent.case

    def setup(self) -> None:
        super().setup()
        _warmup_for(self.config, self.case)  # outside the guarded call; its time shows as this item's setup

    def runtest(self) -> None:
        from harness.checks import Status, run_check

        config = self.config
        spec, (provider, error) = _provider(config)
        if provider is None:
            raise CheckFailed(f"--provider {spec} is not usable: {error}")
        device = config.stash[_device_key]
        requested = config.getoption("device")
        with _recompile_guard(config, self.case) as guarded:
            result = run_check(
                self.case, self.check, provider, device=device, provider_spec=spec,
                repro_device=None if requested == "auto" else requested,
                context=self.parent.context(provider, device, spec),
            )
            guarded["ran"] = result.status not in (Status.SKIPPED, Status.UNSUPPORTED)
        if result.max_ulp is not None:
            self.user_properties.append(("max_ulp", result.max_ulp))
        if result.summary:
            self.user_properties.append(("mismatch", result.summary))
        self.user_properties.append(("repro", result.repro))
        if result.status in (Status.SKIPPED, Status.UNSUPPORTED):
            pytest.skip(result.reason)
        if result.status is Status.XFAILED:
            pytest.xfail(result.reason)
        if result.status.is_failure:
            raise CheckFailed(result.message)

    def repr_failure(self, excinfo, style=None):
        if excinfo.errisinstance(CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.case.id}::{self.check}"


# ---------------------------------------------------------------- recompile guard

_warmup_key = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reports the collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    """The workers' xdist groups for the scheduler (``_write_xdist_groups``)."""
    timeline.mark(session.config.stash[_phases_key], "collected")
    _write_xdist_groups(session)


def _warmup_for(config: pytest.Config, case):
    """With --recompile-guard: (watched kernels, the warmup report) of this case's model request (its shape, dtypes
    and D/z/dt options, with every path, mode, index and cache-layout class), warmed once per request and process
    before the first item that needs it. A server warms its model configuration, not a whole test corpus; each case
    is held to exactly that (under the interpreter the launch keys are compared with this request's keys alone).
    Lazily, in the item's setup: a worker warms only what its cases need, and no worker waits for a session-wide
    warmup before its first test (each one compiled or loaded all the corpus' specializations first, GPU runs 8-11)."""
    if not config.getoption("recompile_guard"):
        return None
    from harness import warmup

    requests = warmup.requests_from_cases([case])
    done = config.stash.setdefault(_warmup_key, {})
    key = repr(requests)
    if key not in done:
        # Workers that warm the same request at once (the costliest cases go out first, together) start at their
        # own share of its list and find the others' binaries in the disk cache: without this rotation they
        # compiled the same specializations side by side (GPU run 12: cold suite 82 s, up from 70 s).
        index = worker_index(os.environ.get("PYTEST_XDIST_WORKER")) or 0
        report = warmup.warmup_all(config.stash[_device_key], requests, first=index / xdist_worker_count())
        done[key] = (warmup.watched_kernels(), report)
        print(f"\n[{os.environ.get('PYTEST_XDIST_WORKER', 'main')}] {case.id}: {done[key][1].summary()}")
    return done[key]


@contextlib.contextmanager
def _recompile_guard(config: pytest.Config, case):
    """Yields a dict: set ``ran`` False when the check did not run (skipped, unsupported), which launched nothing
    and so leaves the guard nothing to judge (its 'no launch happened' sanity check would otherwise fail it)."""
    outcome = {"ran": True}
    warmed = _warmup_for(config, case)
    if warmed is None:
        yield outcome
        return
    from harness.guards.recompile import RecompileError, compiles_possible, guard_no_recompile

    kernels, report = warmed
    try:
        # On the GPU the compile hook and the kernel caches are the witnesses; under the interpreter, where nothing
        # compiles, every launch's specialization key must be among the warmed keys.
        with guard_no_recompile(kernels, warmed=None if compiles_possible() else report.keys):
            yield outcome
    except RecompileError as exc:
        if outcome["ran"]:
            raise CheckFailed(f"recompile guard (after warmup: {report.summary()}):\n{exc}") from None


# ---------------------------------------------------------------- sharding


def _measured_costs(config: pytest.Config):
    """``ItemCosts`` from ``--durations-from`` (read once per process), or None without it."""
    path = config.getoption("durations_from")
    if not path:
        return None
    if _costs_key not in config.stash:
        try:
            config.stash[_costs_key] = ItemCosts.from_report(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise pytest.UsageError(f"--durations-from {path}: {exc}") from None
    return config.stash[_costs_key]


def _item_cost(item: pytest.Item) -> float:
    measured = _measured_costs(item.config)
    if measured is not None:
        return measured(item.nodeid)
    case = getattr(item, "case", None) if isinstance(item, CheckItem) else None
    if case is None:
        return 1.0
    return float(case.total_tokens * case.shape.state_elements)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    shard = config.getoption("shard")
    if not shard:
        return
    from harness.sharding import parse_shard, select

    try:
        k, n = parse_shard(shard)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    keep = select([(it.nodeid, _item_cost(it)) for it in items], k, n)
    deselected = [it for it in items if it.nodeid not in keep]
    items[:] = [it for it in items if it.nodeid in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)


# ---------------------------------------------------------------- reporting


def _props(report: pytest.TestReport) -> dict:
    return dict(report.user_properties or ())


def _outcome(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xfailed" if report.skipped else "xpassed"
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        return "unsupported" if "unsupported:" in reason else "skipped"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    return "passed"


def _reason(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return str(report.wasxfail)
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return ""


class _Recorder:
    """Keeps one ``ItemRecord`` per finished phase that decides an item's outcome (bound to its config)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.setups: dict[str, tuple[float, float]] = {}  # nodeid -> (setup seconds, setup start)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The call phase, or setup when it did not pass, or a failing teardown. An item's duration includes its
        setup (fixtures: a module fixture's cost lands on the first item that needs it), so time reports show it."""
        config = self.config
        if report.when == "setup" and report.passed:
            self.setups[report.nodeid] = (float(report.duration), float(report.start))
            return
        if report.when == "call" or (report.when == "setup" and not report.passed) or (
            report.when == "teardown" and report.failed
        ):
            props = _props(report)
            setup_seconds, start = self.setups.pop(report.nodeid, (0.0, float(report.start)))
            summary = props.get("mismatch", "")
            if report.failed and not summary:
                summary = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
            config.stash[_records_key].append(
                ItemRecord(
                    nodeid=report.nodeid,
                    outcome=_outcome(report),
                    duration=float(report.duration) + setup_seconds,
                    case_id=str(props.get("case_id", "")),
                    check=str(props.get("check", "")),
                    family=str(props.get("family", "")),
                    source=report.location[0] if report.location else "",
                    seed=props.get("seed"),
                    max_ulp=props.get("max_ulp"),
                    reason=_reason(report),
                    summary=summary,
                    repro=str(props.get("repro", "")),
                    worker=os.environ.get("PYTEST_XDIST_WORKER", ""),
                    message=str(report.longrepr)[-MESSAGE_CHARS:] if report.failed and report.longrepr else "",
                    start=start,
                )
            )
            path = config.getoption("json_report")
            if path and not _is_xdist_controller(config):
                append_live(path, os.environ.get("PYTEST_XDIST_WORKER", "main"), config.stash[_records_key][-1])


def _merged_records(config: pytest.Config) -> list[ItemRecord]:
    """Later records of a nodeid replace earlier ones (a failing teardown after a passing call)."""
    by_id: dict[str, ItemRecord] = {}
    for rec in config.stash[_records_key]:
        prior = by_id.get(rec.nodeid)
        if prior is None or rec.outcome == "error" or prior.outcome == "passed":
            by_id[rec.nodeid] = rec
    return list(by_id.values())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    path = config.getoption("json_report")
    if not path:
        return
    phases = config.stash[_phases_key]
    timeline.mark(phases, "session_end")
    meta = {"device": config.stash[_device_key], "provider": config.getoption("provider") or DEFAULT_PROVIDER}
    ledger = config.stash[_ledger_key]
    mine = {"phases": phases,
            "compiles": {**ledger.to_dict(), "claims": dict(compile_claims.stats)} if ledger is not None else None}
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if hasattr(config, "workerinput") and worker:
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES") if meta["device"] == "cuda" else None
        write_part(path, worker, Report(items=_merged_records(config),
                                        meta={**meta, **mine, "worker": worker, "gpu": gpu}))
        return
    if not _is_xdist_controller(config):
        write_part(path, "main", Report(items=_merged_records(config), meta={**meta, **mine, "worker": "main"}))
        merge_parts(path, meta=meta)
    else:  # the workers' parts say which device they ran on (the controller only asked the driver)
        merge_parts(path, meta={**{k: v for k, v in meta.items() if k != "device"}, "phases": phases})


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    records = _merged_records(config)
    if not any(r.check for r in records):  # no case item ran: pytest's own summary says it all
        return
    terminalreporter.section("ssd-harness summary")
    for line in summary_lines(records):
        terminalreporter.write_line(line)
    path = config.getoption("json_report")
    if path and not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"json report: {path}")
