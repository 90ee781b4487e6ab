"""pytest plugin: YAML cases become items ``<file>::<case id>::<check>`` (docs/checks.md).

This module holds the options and the hooks; each hook hands its work to one of ssd_pytest's modules (``items``,
``workers``, ``xdist_scheduling``, ``sharding``, ``recompile``, ``reporting``). Loaded by the ``pytest11`` entry
point when the package is installed, else by the checkout's root ``conftest.py``. Options (group "ssd-harness"):
``--device``, ``--provider``, ``--workers-per-gpu``, ``--ssd-report``, ``--shard``, ``--durations-from``,
``--recompile-guard``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import DEFAULT_PROVIDER, backend, compile_claims, timeline
from harness.interrupts import sigterm_as_interrupt
from ssd_pytest import arguments, progress, reporting, sharding, state, workers, xdist_scheduling
from ssd_pytest import items as case_items


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ssd-harness", "Mamba2 SSD correctness harness")
    group.addoption("--device", choices=backend.DEVICES, default="auto",
                    help="cuda, or cpu (Triton interpreter); auto = cuda when visible. Default: auto")
    group.addoption("--provider", default=None, metavar="MODULE:ATTR",
                    help="the ssd_prefill provider under test (default: kernels:provider)")
    group.addoption("--workers-per-gpu", type=int, default=None, metavar="N",
                    help="with -n auto on a GPU machine: xdist workers per GPU (default: one per core, shared "
                         "among the GPUs, as many as host and GPU memory hold; the run's header says how many)")
    group.addoption("--check", action="append", default=None, metavar="NAME",
                    help="only the case items of this check (repeatable; the other case items are deselected, other "
                         "tests stay); a check that runs on the GPU only when named (every_config) runs there. "
                         "Default: every check each case selects")
    group.addoption("--ssd-report", default=None, metavar="FILE",
                    help="write one merged JSON report (every item's outcome, duration, mismatch summary)")
    group.addoption("--shard", default=None, metavar="K/N",
                    help="run only shard K of N (deterministic, balanced by expected cost)")
    group.addoption("--durations-from", default=None, metavar="REPORT",
                    help="a JSON report of an earlier run (--ssd-report): its item durations are the expected "
                         "costs that balance --shard and, under -n, hand out the longest work first")
    parser.addini(sharding.GPU_DURATIONS_INI, default="",
                  help="a JSON report of an earlier GPU run, relative to this file: the --durations-from of a run "
                       "on the GPU that gives none")
    group.addoption("--recompile-guard", action="store_true",
                    help="before a case's first item, the provider's warmup(requests) hook on its model "
                         "configuration (once per configuration and worker); then fail any case item during which a "
                         "Triton kernel, anyone's, compiles (GPU) or launches a specialization that warmup did not "
                         "produce (interpreter). A provider without the hook: unsupported")
    group.addoption("--isolation", choices=("process", "none"), default=None,
                    help="where case items run: process = a supervised child process per pytest process, replaced "
                         "after a crash, exit, hang or sticky device error, which then fail only the item that caused "
                         "them (default; env SSD_HARNESS_ISOLATION); none = in this process (pdb, monkeypatching)")
    group.addoption("--item-timeout", type=float, default=None, metavar="SECONDS",
                    help="per case item time limit, after which its child process is killed and the item is an "
                         "error (env SSD_HARNESS_ITEM_TIMEOUT; default 120 on CPU, 300 on CUDA; 0 = none)")


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    return workers.auto_num_workers(config)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return xdist_scheduling.make_scheduler(config, log)


class _WorkersFinished:
    """xdist controller: notes when a worker has finished its session (the last one's time is kept); the
    controller's session ends once every worker process has exited. Bound to its config, which xdist's hook does
    not pass."""

    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        timeline.mark(self.config.stash[state.PHASES], "workers_finished")


# What this plugin (and the device's configuration it makes) sets in the process's environment for the run.
RUN_ENVIRONMENT = (
    reporting.RUN_ID_ENV, xdist_scheduling.GROUPS_FILE_ENV, workers.CASE_WORKERS_ENV, workers.GPU_LIST_ENV,
    compile_claims.CLAIMS_ENV, backend.BLAS_THREADS_ENV, "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET",
    backend.AUTOTUNE_CACHE_ENV,
    "SSD_AUTOTUNE_MS",  # kernels.environment.AUTOTUNE_BUDGET_ENV: the kernels package loads after the device is set
)


def _give_back_at_the_end(config: pytest.Config) -> None:
    """A run inside a longer-lived process (``pytester``'s inline runs, ``pytest.main``) leaves ``RUN_ENVIRONMENT``
    as it found it, so that what the process runs next does not inherit this run's settings. Not in an xdist worker,
    whose process ends at its last cleanup (``workers.start_worker`` registers that one first)."""
    before = dict(os.environ)
    config.add_cleanup(lambda: backend.restore_environment(before, RUN_ENVIRONMENT))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not workers.is_xdist_worker(config):  # a worker gets the controller's arguments, already checked there
        _give_back_at_the_end(config)
        # A time limit's SIGTERM ends the session as Ctrl-C does, so that the report says what finished and that the
        # run was interrupted; a worker is left to die of it (its items are in the report's live parts already)
        config.add_cleanup(sigterm_as_interrupt())
        arguments.refuse_misread_path_values(config)
    config.stash[state.PHASES] = timeline.new_phases()
    config.stash[state.LEDGER] = None
    worker_id = os.environ.get("PYTEST_XDIST_WORKER")
    if worker_id and workers.is_xdist_worker(config):
        workers.start_worker(config, worker_id)
    requested = config.getoption("device")
    try:
        if workers.is_xdist_controller(config):
            xdist_scheduling.share_groups_file()
            config.stash[state.DEVICE] = workers.prepare_workers(requested, workers.planned_worker_count(config))
            xdist_scheduling.plan_worker_roles(config, config.stash[state.DEVICE])
            config.pluginmanager.register(_WorkersFinished(config), "ssd-harness-workers-finished")
        else:
            config.stash[state.DEVICE] = backend.configure(requested)  # before any kernel module is imported
            ledger = config.stash[state.LEDGER] = timeline.install_compile_ledger()
            config.add_cleanup(lambda: timeline.uninstall_compile_ledger(ledger))
            if config.stash[state.DEVICE] == "cuda" and workers.xdist_worker_count() > 1:
                backend.shorten_autotuning()
    except (ValueError, RuntimeError) as exc:
        raise pytest.UsageError(str(exc)) from None
    case_items.check_option(config)  # an unknown --check name stops the run before any worker starts
    case_items.configure(config)
    case_items.start_spare_runner(config)
    reporting.configure(config)
    config.addinivalue_line("markers", "ssd_case: an item generated from a YAML case")
    config.addinivalue_line("markers", case_items.GPU_MARKER)


def pytest_sessionstart(session: pytest.Session) -> None:
    timeline.mark(session.config.stash[state.PHASES], "configured")  # every plugin's pytest_configure has run
    progress.register(session.config)  # after the terminal reporter registered itself


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if case_items.is_case_file(file_path, parent.config):
        return case_items.CaseFile.from_parent(parent, path=file_path)
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    case_items.keep_named_checks(config, items)
    case_items.skip_by_tier(config, items)
    sharding.keep_shard(config, items)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reports the collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    timeline.mark(session.config.stash[state.PHASES], "collected")
    xdist_scheduling.write_xdist_groups(session)
    case_items.start_runner_early(session)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    ledger = item.config.stash.get(state.LEDGER, None)
    if ledger is not None:
        ledger.origin = item.nodeid  # compiles from here to the next item's setup are this item's


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    case_items.locate_skip(item, report)
    reporting.carry_first_line(report, call)
    return report


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporting.write_report(session, exitstatus)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    reporting.terminal_summary(terminalreporter, config, exitstatus)


def pytest_report_header(config: pytest.Config) -> list[str]:
    spec = config.getoption("provider") or DEFAULT_PROVIDER
    auto_workers = workers.auto_workers_header(config)
    return [f"ssd-harness: device={config.stash[state.DEVICE]} provider={spec}"] + ([auto_workers] if auto_workers
                                                                                  else [])


def pytest_unconfigure(config: pytest.Config) -> None:
    case_items.close_runner(config)
    workers.join_cuda_context(config)
    if workers.is_xdist_worker(config):
        return
    xdist_scheduling.remove_groups_file()
    workers.release_workers_resources()
