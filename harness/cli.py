"""``python -m harness``: run, repro, validate, generate, schema, fuzz, times, report-html, warmup and bench (each with
``--help``; help texts are plain text, ``DESCRIPTION`` and ``EPILOG`` the top level's).

The same ``harness.checks.run_check`` serves this CLI and the pytest plugin, and the same rule
(``harness.cases.files``) says which files are cases. ``run``, ``repro`` and ``fuzz`` run each item in a supervised
child process (``harness.isolation``): a provider that crashes, exits, hangs or poisons its device is an error of the
item it was running, and the rest still run. Exit status: 0 when everything passed, 1 on any failure (including a
strict XPASS, an error, and a bad case file among good ones, which still run), 2 when the command could not run (no
case files, an unusable provider, unknown check names, an unwritable report) or nothing ran: no item was selected,
or every item was skipped or unsupported. Nothing run is never a pass. 130 when interrupted (Ctrl-C or SIGTERM;
``run --json`` still writes what finished).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from harness import backend
from harness.interrupts import sigterm_interrupts
from harness.report import TIMING_GROUPS

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CASES = REPO_ROOT / "cases"
EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE, EXIT_INTERRUPTED = 0, 1, 2, 130
TABLE_COLUMNS = ("passed", "failed", "error", "xpassed", "xfailed", "skipped", "unsupported")


class Unusable(Exception):
    """The command cannot run at all (exit 2); the message says why."""


def _add_target_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=backend.DEVICES, default="auto",
                   help="cuda, or cpu (Triton interpreter); auto = cuda when visible (default)")
    p.add_argument("--provider", default=None, metavar="MODULE:ATTR",
                   help="the ssd_prefill provider under test (default: kernels:provider)")


def _add_isolation_options(p: argparse.ArgumentParser) -> None:
    from harness.isolation import DEFAULT_TIMEOUTS, ISOLATION_ENV, TIMEOUT_ENV

    p.add_argument("--isolation", choices=("process", "none"), default=None,
                   help="process: each item runs in a supervised child process, replaced after a crash, a hang or "
                        "a sticky device error (default); none: in this process, for pdb (no time limit). "
                        f"Default from {ISOLATION_ENV}")
    p.add_argument("--item-timeout", default=None, metavar="SECONDS",
                   help=f"an item running longer is stopped and reported as an error (0: no limit; default from "
                        f"{TIMEOUT_ENV}, else " + ", ".join(f"{s:g} s on {d}" for d, s in DEFAULT_TIMEOUTS.items())
                        + ")")


class _CheckNames:
    """The registered checks' names, read when a help text is shown (``%(check_names)s``): the registry imports
    torch, which a command that prints no help should not wait for here."""

    def __str__(self) -> str:
        from harness.checks import check_names

        return ", ".join(check_names())


def _add_check_option(p: argparse.ArgumentParser, help: str) -> None:
    action = p.add_argument("--check", action="append", default=None, metavar="NAME",
                            help=f"{help}; one of: %(check_names)s")
    action.check_names = _CheckNames()  # argparse fills %(name)s in a help text from the action's attributes


DESCRIPTION = ("Correctness harness for the Mamba2 SSD prefill path: run the checks of YAML cases against a provider "
               "of ssd_prefill (our Triton kernels by default), re-run one failing item, validate and generate case "
               "files, search for failing cases, report where a run spent its time and draw a run's errors against "
               "their bounds. Each command has its own --help.")
EPILOG = ("exit status (run, repro, validate, fuzz, times): 0 everything passed; 1 any failure (a strict XPASS, an "
          "error and a bad case file included); 2 the command could not run (no case files, an unusable provider, "
          "unknown check names, an unwritable report) or nothing ran (every item skipped or unsupported); 130 "
          "interrupted (Ctrl-C or SIGTERM).")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness", description=DESCRIPTION, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the checks of YAML cases; non-zero exit on any failure",
                         description="Run every applicable check of every case (default: cases/), each item in a "
                                     "supervised child process; print one line per case (-v: per item) and a table "
                                     "per check.")
    run.add_argument("paths", nargs="*", type=Path, help="case files or folders (default: cases/)")
    _add_target_options(run)
    _add_check_option(run, "only this check (repeatable)")
    run.add_argument("--json", type=Path, default=None, metavar="FILE", help="write the JSON report here")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="a progress line per item (default: a line per case, with its items' outcomes, elapsed "
                          "time and ETA; a failing item always gets its own lines)")
    run.add_argument("--quiet", action="store_true", help="no progress lines (failing items still get theirs)")
    _add_isolation_options(run)

    repro = sub.add_parser("repro", help="run one case file (one case / check) and print the full report",
                           description="Re-run a failing item and print what differed in full (the line every "
                                       "failure prints).")
    repro.add_argument("file", type=Path, help="the case file (.yaml or .yml)")
    repro.add_argument("--case", default=None, metavar="ID", help="case id (default: every case in the file)")
    _add_check_option(repro, "check name (repeatable; default: the case's checks)")
    repro.add_argument("--config", default=None, metavar="KERNEL:INDEX",
                       help="every_config: force only config INDEX of the autotuned kernel KERNEL (and that kernel's "
                            "first config, the baseline of its declared-exact outputs), as a failure's rerun line "
                            "names it")
    _add_target_options(repro)
    _add_isolation_options(repro)

    validate = sub.add_parser("validate", help="load case files and report every error (exit 1 on any)",
                              description="Validate case files: schema, combinations, unique ids, check names.")
    validate.add_argument("paths", nargs="+", type=Path, help="case files or folders")

    generate = sub.add_parser("generate", help="write the generated case corpus",
                              description="Write the generated case corpus: one YAML file per family, the same "
                                          "bytes on every run (harness/cases/generate.py). The checked-in corpus "
                                          "is cases/corpus (make generate).")
    generate.add_argument("--out", type=Path, required=True, metavar="DIR",
                          help="the folder to write (cases/corpus for the checked-in corpus)")

    schema = sub.add_parser("schema", help="write the case JSON Schema (cases/schema/ssd-case-1.schema.json)",
                            description="Write the JSON Schema of ssd-case/1 from harness.cases.schema, the one "
                                        "source of the shipped file (tests check that the two agree).")
    schema.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="where to write it (default: the shipped cases/schema/ssd-case-1.schema.json)")

    fuzz = sub.add_parser("fuzz", help="Hypothesis search for failing cases; writes a regression YAML",
                          description="Search small valid cases for a failing check; a failure (a mismatch, an "
                                      "exception, a crash, a hang past the item time limit, a sticky device "
                                      "error) is shrunk and written to DIR as a YAML case that reproduces it. "
                                      "Progress goes to stderr.")
    fuzz.add_argument("--budget", type=int, required=True, metavar="N",
                      help="examples to try while searching (shrinking a failure is not counted)")
    fuzz.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                      help="wall time for searching and shrinking together, checked before each item but the first; "
                           "when it runs out, the smallest failure found so far is written (default: no limit)")
    fuzz.add_argument("--shrink-budget", type=int, default=None, metavar="N",
                      help="examples to try while shrinking a failure; when they run out, the smallest failure found "
                           "so far is written (default: until shrinking ends). Where each failing example costs a "
                           "process (a crash, a hang), a count bounds the search the same on any host")
    fuzz.add_argument("--heartbeat", type=float, default=None, metavar="SECONDS",
                      help="seconds between progress lines on stderr: examples tried, faults seen, elapsed time, "
                           "the smallest failure so far (default 10)")
    fuzz.add_argument("--out", type=Path, required=True, metavar="DIR",
                      help="where a shrunk failing case is written, as a YAML file (cases/regressions/ to keep it)")
    fuzz.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0: reproducible searches)")
    _add_check_option(fuzz, "only this check (repeatable)")
    _add_target_options(fuzz)
    _add_isolation_options(fuzz)

    times = sub.add_parser("times", help="where a run spent its time, from a JSON report (by check and family)",
                           description="Time per check family and case family from a report written by "
                                       "run --json or pytest --ssd-report, slowest first; for pytest reports "
                                       "also each process's start-up and the Triton compiles (harness.timeline). "
                                       "Exit status: 1 when the report holds a failure, 130 when its run did not "
                                       "finish (interrupted, killed, stopped), else 0; 2 when the report or "
                                       "--write-durations cannot be read or written.")
    times.add_argument("report", type=Path, help="the JSON report (or, of a run that was killed, its name: the "
                                                 "parts its processes wrote are read, and left in place)")
    times.add_argument("--by", action="append", choices=TIMING_GROUPS, default=None,
                       help="grouping (repeatable; default check and family); file: each case file and Python test "
                            "file, so that the tests that are no case item are told apart")
    times.add_argument("--top", type=int, default=15, metavar="N", help="the N slowest groups (default 15)")
    times.add_argument("--write-durations", type=Path, metavar="FILE",
                       help="also write the items' durations alone (a compact report for pytest --durations-from)")
    times.add_argument("--longest-of", type=Path, metavar="EARLIER", default=None,
                       help="with --write-durations: per item, the longer of this report's duration and EARLIER's "
                            "(a compile-heavy test is slow in whichever run compiles first: its cold time is the "
                            "cost to plan for); EARLIER may be the FILE written where it is a durations file, never "
                            "a whole report")

    html = sub.add_parser("report-html", help="an HTML page of a report's error against its bounds, per check",
                          description="One self-contained HTML page (inline SVG) from a report written by run "
                                      "--json or pytest --ssd-report: per check its outcomes and each item's largest "
                                      "error over its bound (bounded checks) or ulp distance (exact checks).")
    html.add_argument("report", type=Path, help="the JSON report (or a killed run's report, from its live parts, "
                                                "which are read and left in place; the page says the run did not "
                                                "finish)")
    html.add_argument("-o", "--out", type=Path, required=True, metavar="FILE", help="the HTML file to write")

    # Listed here for the overview; main() hands their arguments (and --help) to harness.bench and harness.warmup.
    sub.add_parser("warmup", help="compile-only warmup of every specialization the cases need (time, count)",
                   add_help=False)
    sub.add_parser("bench", help="GPU benchmarks of the SSD prefill paths (CUDA graph replays, medians)",
                   add_help=False)
    return parser


# ---------------------------------------------------------------- shared steps


def _isolation(args) -> tuple[str, str, object, str, object]:
    """Configure the backend, read the isolation settings and check the provider spec; returns (device, mode,
    time limit, spec, provider). ``provider`` is loaded here only with ``--isolation none``: with process isolation
    the provider is imported by the child alone, so a provider whose import crashes cannot take this process with
    it."""
    from harness.checks.providers import DEFAULT_PROVIDER, ProviderError, check_provider_spec, load_provider
    from harness.isolation import isolation_mode, item_timeout

    try:
        device = backend.configure(args.device)
        mode = isolation_mode(args.isolation)
        limit = item_timeout(args.item_timeout, device)
    except (ValueError, RuntimeError) as exc:
        raise Unusable(str(exc)) from None
    if mode == "none" and args.item_timeout is not None:
        raise Unusable("--item-timeout: with --isolation none items run in this process, where nothing can stop "
                       "one; use --isolation process")
    spec = args.provider or DEFAULT_PROVIDER
    try:
        provider = load_provider(spec) if mode == "none" else None
        if provider is None:
            check_provider_spec(spec)
    except ProviderError as exc:
        raise Unusable(str(exc)) from None
    return device, mode, limit, spec, provider


def _runner(args):
    """``_isolation``'s runner: returns (runner, device, spec). The runner starts nothing yet."""
    from harness.isolation import open_runner, spare

    device, mode, limit, spec, provider = _isolation(args)
    return (open_runner(spec, device, isolation=mode, timeout=limit, provider=provider, spare_owner=spare.CLI),
            device, spec)


def _live_report(path: Path | None, inputs: list[Path]):
    """The ``--json`` report, created before the first item; an unwritable path, or one whose content the report
    must not replace (a device, a FIFO, a case file: ``refuse_unsafe_target``), is refused (exit 2)."""
    from harness.report import LiveReport, UnsafeTarget

    if path is None:
        return None
    try:
        return LiveReport(path, inputs=tuple(inputs))
    except UnsafeTarget as exc:
        raise Unusable(f"--json {exc}; nothing was run") from None
    except OSError as exc:
        reason = exc.strerror or exc
        raise Unusable(f"--json {path}: cannot write the report there ({reason}); nothing was run") from None


class _Output:
    """A run's stdout, which may go away (a closed pipe, a full disk): the first failed write is kept in ``lost``
    and stdout then points at the null device, so that the run goes on to its report (and the interpreter's final
    flush does not fail); the run's exit status then says it could not run as asked (2)."""

    def __init__(self):
        self.lost = ""

    def say(self, *lines: str) -> None:
        if self.lost:
            return
        try:
            print(*lines, sep="\n", flush=True)
        except OSError as exc:
            self.lost = f"stdout failed ({exc.strerror or exc})"
            _drop_stdout()


def _drop_stdout() -> None:
    import os

    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError):  # no file descriptor (a captured stdout): replace the object
        sys.stdout = open(os.devnull, "w")


def _restart_lines(runner) -> list[str]:
    if not runner.restarts:
        return []
    lines = [f"provider process restarts: {len(runner.restarts)} ({runner.processes} processes started)"]
    lines += [f"  after {r.item}: {r.cause}" for r in runner.restarts]
    return lines


def _case_files(paths: list[Path]) -> list[Path]:
    """The case files named or under the folders named; a missing path or a named non-case file is unusable. A
    FIFO or other special file named like a case file is skipped (on stderr), never opened."""
    from harness.cases.files import case_files, describe_special, not_case_files, special_files

    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise Unusable(f"no such file or folder: {', '.join(missing)}")
    wrong = not_case_files(paths)
    if wrong:
        raise Unusable(f"not a case file (a case file ends in .yaml or .yml): {', '.join(map(str, wrong))}")
    for path, kind in special_files(paths):
        print(describe_special(path, kind), file=sys.stderr)
    files = case_files(paths)
    if not files:
        raise Unusable(f"no case files under {', '.join(map(str, paths))} ({NO_CASE_FILES_HINT})")
    return files


NO_CASE_FILES_HINT = ("a case file ends in .yaml or .yml; under the repository's tests/ folder only files named "
                      "one by one count")


def _check_names(only: list[str] | None) -> None:
    from harness.checks import check_names

    unknown = sorted(set(only or ()) - set(check_names()))
    if unknown:
        raise Unusable(f"--check: unknown {unknown}; known: {', '.join(check_names())}")


def _plan(cases, errors, only: list[str] | None) -> tuple[list[tuple[object, str]], list[tuple[str, str]]]:
    """The (case, check) items to run, and the bad files as (file, message): the loader's errors, and files naming
    a check that does not exist (their cases do not run, as pytest does not collect them)."""
    from harness.checks import selected_checks

    bad = [(e.file, str(e)) for e in errors]
    by_file: dict[str, list] = defaultdict(list)
    for case in cases:
        by_file[str(case.source)].append(case)
    plan = []
    for source, file_cases in by_file.items():
        try:
            selected = [(case, [n for n, _ in selected_checks(case)]) for case in file_cases]
        except ValueError as exc:
            bad.append((source, f"{source}: {exc}"))
            continue
        plan += [(case, n) for case, names in selected for n in names if not only or n in only]
    return plan, bad


def _record(result, nodeid: str, start: float):
    from harness.report import MESSAGE_CHARS, ItemRecord

    return ItemRecord(
        nodeid=nodeid, outcome=result.status.value, duration=result.duration, case_id=result.case_id,
        check=result.check, family=result.family, source=result.source, seed=result.seed,
        max_ulp=result.max_ulp, bound_use=result.bound_use, reason=result.reason, summary=result.summary,
        repro=result.repro, start=start,
        message=result.message[:MESSAGE_CHARS] if result.status.is_failure else "",
    )


def _bad_file_record(file: str, message: str):
    """A bad case file as an error record: what pytest reports for a file it cannot collect."""
    from harness.report import ItemRecord

    return ItemRecord(nodeid=file, outcome="error", source=file, summary=message, message=message, start=time.time())


def _nothing_ran(records) -> bool:
    """No case item reached a verdict: none ran, or every one was skipped or unsupported."""
    return not any(r.check and r.outcome not in ("skipped", "unsupported") for r in records)


def _table(records) -> list[str]:
    by_check: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        if r.check:  # bad files are listed apart
            by_check[r.check][r.outcome] += 1
    width = max([len("check")] + [len(c) for c in by_check])
    head = f"{'check':<{width}}  " + " ".join(f"{c:>11}" for c in TABLE_COLUMNS)
    lines = [head, "-" * len(head)]
    total: Counter = Counter()
    for check in sorted(by_check):
        total.update(by_check[check])
        lines.append(f"{check:<{width}}  " + " ".join(f"{by_check[check][c]:>11}" for c in TABLE_COLUMNS))
    lines.append(f"{'total':<{width}}  " + " ".join(f"{total[c]:>11}" for c in TABLE_COLUMNS))
    return lines


def _skip_lines(records, verbose: bool) -> list[str]:
    """Skipped and unsupported items grouped by the kind of reason (its text up to the first colon), with one
    example each; per-item lines (-v) already showed every reason."""
    groups: dict[str, list] = defaultdict(list)
    for r in records:
        if r.check and r.outcome in ("skipped", "unsupported"):
            groups[r.reason.split(":", 1)[0] or r.outcome].append(r)
    if not groups or verbose:
        return []
    lines = ["skipped or unsupported items by reason (one example each; -v shows every item's):"]
    for kind, recs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"  {len(recs):>5}  {kind}; e.g. {recs[0].case_id}::{recs[0].check}: {recs[0].reason}")
    return lines


# ---------------------------------------------------------------- commands


def cmd_run(args) -> int:
    from harness.cases.loader import load_each
    from harness.checks.providers import ProviderError
    from harness.isolation import IsolationError

    _check_names(args.check)
    paths = args.paths or [DEFAULT_CASES]
    runner, device, spec = _runner(args)
    try:
        files = _case_files(paths)
        live = _live_report(args.json, files)
        runner.start()  # the child's imports overlap with loading the cases
        loaded = load_each(files)
        plan, bad = _plan(loaded.cases, loaded.errors, args.check)
        if not plan and not bad:
            raise Unusable(f"nothing to run: no check of the {len(loaded.cases)} cases under "
                           f"{', '.join(map(str, paths))} is selected"
                           f"{' by --check ' + ', '.join(args.check) if args.check else ''}")
        return _run_plan(args, runner, device, spec, loaded.cases, plan, bad, live)
    except (ProviderError, IsolationError) as exc:
        raise Unusable(str(exc)) from None
    finally:
        runner.close()


def _run_plan(args, runner, device: str, spec: str, cases, plan, bad, live) -> int:
    """Run the plan, printing as it goes. An I/O error writing the live report (a full disk) stops the run like a
    provider that cannot run; a stdout that goes away does not stop it (``_Output``). Either way the exit status is
    2 and the report of what ran is written where it still can be."""
    from harness.checks.providers import ProviderError
    from harness.checks.runner import run_selected
    from harness.isolation import IsolationError
    from harness.progress import CaseProgress, item_weight
    from harness.report import Report, summary_lines

    repro_device = None if args.device == "auto" else args.device
    out = _Output()
    out.say(f"ssd-harness run: {len(cases)} cases, {len(plan)} items, {len(bad)} bad case files, device={device}, "
            f"provider={spec}, isolation={runner.mode}, item time limit: {runner.limit.describe()}")
    records, failures, last_note = [], 0, ""
    interrupted, aborted, in_flight = False, "", None
    for file, message in bad:
        record = _bad_file_record(file, message)
        records.append(record)
        if live is not None:
            live.append(record)
        failures += 1
        out.say(f"ERROR       {message}")
    case_number = {case_id: k for k, case_id in enumerate(dict.fromkeys(c.id for c, _ in plan), 1)}
    ncases = len(case_number)
    progress = CaseProgress(plan, lambda case, check: item_weight(case, check, device, args.check))
    with sigterm_interrupts():
        try:
            for i, (case, check) in enumerate(plan, 1):
                start, in_flight = time.time(), f"{case.source}::{case.id}::{check}"
                restarts = len(runner.restarts)
                result = run_selected(runner, case, check, device=device, named=args.check, provider_spec=spec,
                                      repro_device=repro_device)
                record = _record(result, in_flight, start)
                records.append(record)
                in_flight = None
                if live is not None:
                    live.append(record)
                failures += result.status.is_failure
                if args.verbose or result.status.is_failure:
                    line = (f"[{i}/{len(plan)} case {case_number[case.id]}/{ncases}] "
                            f"{result.status.value.upper():<11} {case.id}::{check} "
                            f"({result.duration:.2f}s) failures so far: {failures}")
                    if result.status.is_failure:  # what differed, on the item's own line (as pytest -rf shows it)
                        out.say(f"{line} - {result.summary}\n    repro: {result.repro}")
                    else:  # a skip's reason, or an xfail's summary, once for a run of items that share it
                        note = result.summary or result.reason
                        note, last_note = ("" if note == last_note and not result.summary else note), note
                        out.say(line + (f"\n    {note}" if note else ""))
                case_line = progress.item_done(case, check, result.status.value)
                if case_line and not args.quiet:
                    out.say(case_line)
                for restart in runner.restarts[restarts:]:
                    if restart.cause != result.summary:  # a sticky device error: the item's own error differs
                        out.say(f"    provider process replaced: {restart.cause}")
        except KeyboardInterrupt:
            interrupted = True
            out.say(f"\ninterrupted: {len(records)} of {len(plan)} items finished"
                    + (f"; {in_flight} was running and is not reported" if in_flight else ""))
        except (ProviderError, IsolationError) as exc:
            aborted = str(exc)
            out.say(f"\nstopped: {aborted}")
        except OSError as exc:  # the live report's disk full: what ran is still reported
            aborted = f"I/O error ({exc.strerror or exc}) after {len(records)} of {len(plan)} items"
            out.say(f"\nstopped: {aborted}")
    status = (EXIT_INTERRUPTED if interrupted else EXIT_UNUSABLE if aborted else
              EXIT_FAILED if failures else EXIT_OK)
    unfinished = "interrupted" if interrupted else f"stopped: {aborted}" if aborted else ""
    lines = ["", *_table(records), *_skip_lines(records, verbose=args.verbose)]
    if bad:
        lines += [f"bad case files (not run): {len(bad)}", *(f"  {file}" for file, _ in bad)]
    lines += summary_lines(records, unfinished=unfinished)
    lines += _restart_lines(runner) or ["provider process restarts: 0"]
    if interrupted or aborted:
        lines.append(f"{'INTERRUPTED' if interrupted else 'STOPPED'}: {len(records)} of {len(plan)} collected items "
                     f"reported; an unfinished run is not a pass (exit {status})")
    out.say(*lines)
    if out.lost and not interrupted:
        status = EXIT_UNUSABLE
    if live is not None:
        meta = {"device": device, "provider": spec, "command": "run", "collected": len(plan),
                "reported": len(records), "interrupted": interrupted, "in_flight": in_flight, "aborted": aborted,
                "exit_status": status, "output_error": out.lost, "run": live.run, **runner.describe()}
        try:
            live.finish(Report(items=records, meta=meta))
        except (OSError, ValueError) as exc:  # a full disk; a target replaced by a device or FIFO meanwhile
            raise Unusable(f"--json {args.json}: cannot write the report ({getattr(exc, 'strerror', None) or exc}); "
                           f"its live part "
                           f"{live.live} keeps what was written before the error") from None
        out.say(f"json report: {args.json}")
    if aborted:
        raise Unusable(aborted)
    if out.lost:
        raise Unusable(f"{out.lost}; the run went on: {len(records)} of {len(plan)} items reported"
                       + (f" in {args.json}" if live is not None else ""))
    if status in (EXIT_OK, EXIT_FAILED) and _nothing_ran(records):
        print(f"error: nothing ran: {len(plan)} items, none passed or failed"
              f"{' (every case file is bad)' if not plan else ' (every item was skipped or unsupported)'}",
              file=sys.stderr)
        return EXIT_UNUSABLE
    return status


def _choose_config(args):
    """``repro --config KERNEL:INDEX``: put the choice where ``every_config`` reads it (``CONFIG_ENV``, which the
    item's child process inherits); returns what puts the environment back."""
    from harness.checks.configs import CONFIG_ENV, NAME

    if not args.config:
        return lambda: None
    if args.check != [NAME]:
        raise Unusable(f"--config selects a config for --check {NAME} alone; found --check {args.check}")
    saved = os.environ.get(CONFIG_ENV)
    os.environ[CONFIG_ENV] = args.config

    def forget() -> None:
        if saved is None:
            os.environ.pop(CONFIG_ENV, None)
        else:
            os.environ[CONFIG_ENV] = saved

    return forget


def cmd_repro(args) -> int:
    from harness.cases.files import not_case_files
    from harness.cases.loader import load_case_file
    from harness.cases.schema import CaseError
    from harness.checks import selected_checks
    from harness.checks.providers import ProviderError
    from harness.checks.runner import run_selected
    from harness.isolation import IsolationError

    if not args.file.is_file():
        raise Unusable(f"no such case file: {args.file}")
    if not_case_files([args.file]):
        raise Unusable(f"not a case file (a case file ends in .yaml or .yml): {args.file}")
    try:
        cases = load_case_file(args.file)
    except CaseError as exc:
        raise Unusable(str(exc)) from None
    if args.case:
        cases = [c for c in cases if c.id == args.case]
        if not cases:
            raise Unusable(f"{args.file}: no case with id {args.case!r}")
    _check_names(args.check)
    items = []
    for case in cases:
        try:
            items += [(case, n) for n in (args.check or [n for n, _ in selected_checks(case)])]
        except ValueError as exc:
            raise Unusable(f"{args.file}: {exc}") from None
    if not items:
        raise Unusable(f"{args.file}: nothing to run: no check applies to "
                       f"{'case ' + repr(args.case) if args.case else 'its cases'}")
    forget_config = _choose_config(args)
    try:
        runner, device, spec = _runner(args)
    except BaseException:
        forget_config()
        raise
    repro_device = None if args.device == "auto" else args.device
    failed, verdicts, shown = 0, 0, None
    try:
        with sigterm_interrupts():
            for case, check in items:
                if case is not shown:
                    print(case.summary())
                    shown = case
                result = run_selected(runner, case, check, device=device, named=args.check, provider_spec=spec,
                                      repro_device=repro_device)
                failed += result.status.is_failure
                verdicts += result.status.value not in ("skipped", "unsupported")
                print(f"{result.status.value.upper()}: {case.id}::{check} ({result.duration:.2f}s)")
                if result.reason:
                    print(f"  reason: {result.reason}")
                if result.message:
                    print(result.message)
                for key, value in result.stats.items():
                    print(f"  {key}: {value}")
    except KeyboardInterrupt:
        print("interrupted")
        return EXIT_INTERRUPTED
    except (ProviderError, IsolationError) as exc:
        raise Unusable(str(exc)) from None
    finally:
        runner.close()
        forget_config()
    for line in _restart_lines(runner):
        print(line)
    if not verdicts:
        print(f"error: nothing ran: all {len(items)} items were skipped or unsupported", file=sys.stderr)
        return EXIT_UNUSABLE
    return EXIT_FAILED if failed else EXIT_OK


def cmd_validate(args) -> int:
    from harness.cases.files import case_files, describe_special, not_case_files, special_files
    from harness.cases.loader import load_each
    from harness.checks import selected_checks

    errors = [f"no such file or folder: {p}" for p in args.paths if not p.exists()]
    errors += [f"not a case file (a case file ends in .yaml or .yml): {p}" for p in not_case_files(args.paths)]
    existing = [p for p in args.paths if p.exists()]
    for path, kind in special_files(existing):
        print(describe_special(path, kind))
    files = case_files(existing)
    if not files and not errors:
        raise Unusable(f"no case files under {', '.join(map(str, args.paths))} ({NO_CASE_FILES_HINT})")
    loaded = load_each(files)  # each file parsed once; every bad file reported
    errors += [str(e) for e in loaded.errors]
    for case in loaded.cases:
        try:
            selected_checks(case)
        except ValueError as exc:
            errors.append(f"{case.source}: {exc}")
    for e in errors:
        print(e)
    warnings = _regression_tier_warnings(loaded.cases)
    for w in warnings:
        print(w)
    if errors:
        print(f"{len(errors)} error(s) in {len(files)} file(s)")
        return EXIT_FAILED
    print(f"ok: {len(loaded.cases)} cases in {len(files)} files"
          + (f", {len(warnings)} warning(s)" if warnings else ""))
    return EXIT_OK


def _regression_tier_warnings(cases) -> list[str]:
    """A regression case (a file under a ``regressions`` folder) with items the CPU tier skips: the CI run of every
    change is the CPU tier, so only the nightly GPU run would run those items."""
    from harness.checks.tiers import cpu_tier_gaps

    lines = []
    for case in cases:
        if case.source is None or "regressions" not in Path(case.source).parts:
            continue
        try:
            skipped, why = cpu_tier_gaps(case)
        except ValueError:
            continue  # unknown check names: already an error
        if skipped:
            lines.append(f"warning: {case.source}: {case.id}: the CPU tier skips {', '.join(skipped)} ({why}), so "
                         f"CI runs them only on the nightly GPU run, not on every change; add tiers: {{cpu: true}} to "
                         f"the case to run them on the CPU tier too")
    return lines


def cmd_generate(args) -> int:
    try:
        from harness.cases.generate import generate_corpus
    except ImportError as exc:
        raise Unusable(f"generate: harness.cases.generate is not available ({exc})") from None
    from harness.cases.loader import load_cases
    from harness.checks.tiers import cpu_tier_items

    try:
        written = list(generate_corpus(args.out) or [])
    except OSError as exc:
        raise Unusable(f"--out {args.out}: cannot write the corpus there ({exc.strerror or exc})") from None
    cases = load_cases(written)  # as every run reads them: each case's tiers are the loader's
    on_cpu, items = cpu_tier_items(cases)
    print(f"generated: {len(written)} files under {args.out}: {len(cases)} cases, {items} items, {on_cpu} of them "
          f"in the CPU tier")
    return EXIT_OK


def cmd_schema(args) -> int:
    from harness.cases.schema import SCHEMA_FILE, write_schema_file

    print(f"wrote {write_schema_file(args.out or SCHEMA_FILE)}")
    return EXIT_OK


def cmd_fuzz(args) -> int:
    from harness.checks.providers import ProviderError
    from harness.fuzz import HEARTBEAT_SECONDS, NoFailure, NothingTried, fuzz, out_dir_problem
    from harness.isolation import IsolationError

    for option, value in (("--budget", args.budget), ("--shrink-budget", args.shrink_budget)):
        if value is not None and value < 1:
            raise Unusable(f"{option}: expected an integer >= 1, found {value}")
    for option, value in (("--time-budget", args.time_budget), ("--heartbeat", args.heartbeat)):
        if value is not None and not (0 < value < float("inf")):
            raise Unusable(f"{option}: expected seconds (a number > 0), found {value:g}")
    _check_names(args.check)
    problem = out_dir_problem(args.out)
    if problem:
        raise Unusable(f"--out {args.out}: a failing case could not be written there ({problem}); nothing was run")
    device, mode, limit, spec, provider = _isolation(args)
    try:
        with sigterm_interrupts():
            found = fuzz(spec, budget=args.budget, out_dir=args.out, device=device, checks=args.check,
                         seed=args.seed, isolation=mode, timeout=limit, provider=provider,
                         time_budget=args.time_budget, shrink_budget=args.shrink_budget,
                         heartbeat=args.heartbeat or HEARTBEAT_SECONDS)
    except NothingTried as exc:
        raise Unusable(f"fuzz: nothing ran: {exc}") from None
    except (ProviderError, IsolationError) as exc:
        raise Unusable(f"fuzz: {exc}") from None
    interrupted = found.stopped == "interrupted"
    stopped = f"; stopped early: {found.stopped}" if found.stopped else ""
    if isinstance(found, NoFailure):
        print(f"fuzz: no failure in {found.examples} examples, {found.items} items ({found.seconds:.1f}s), "
              f"provider={spec}, device={device}{stopped}")
        return EXIT_INTERRUPTED if interrupted else EXIT_OK
    shrunk = "partly shrunk" if found.stopped else "shrunk"
    what = f"{found.check} failed" if not found.failure.fault else found.failure.describe()
    print(f"fuzz: {what}; {shrunk} case written to {found.path} ({found.seconds:.1f}s{stopped})")
    print(found.summary)
    print(f"first seen on: {found.first.summary().split(': ', 1)[-1]}")
    print(f"repro: {found.repro}")
    print(f"fuzz: {found.examples} examples, {found.faults} faults, {found.restarts} provider process restarts")
    return EXIT_INTERRUPTED if interrupted else EXIT_FAILED


def cmd_bench(argv: list[str]) -> int:
    try:
        from harness import bench
    except ImportError as exc:
        print(f"bench: harness.bench is not available ({exc}); harness/bench.py provides main(argv)",
              file=sys.stderr)
        return EXIT_UNUSABLE
    return int(bench.main(argv) or 0)


def _read_report(path: Path):
    """The report at ``path``, or the live parts of a run there that did not finish (``load_report``: read, never
    written back); a note on stdout says which."""
    from harness.report import load_report

    try:
        report, note = load_report(path)
    except FileNotFoundError:
        raise Unusable(f"{path}: no such report") from None
    except (OSError, ValueError) as exc:
        raise Unusable(f"{path}: cannot read the report ({getattr(exc, 'strerror', None) or exc})") from None
    if note:
        print(note)
    return report


def cmd_times(args) -> int:
    """Exit status as ``run``'s for the run reported: 1 where any item failed, 130 where the run did not finish
    (``Report.unfinished``: interrupted, killed, stopped), else 0; 2 where the report or the durations cannot be
    read or written."""
    from harness.report import (
        Report,
        UnsafeTarget,
        holds_durations_alone,
        longest_durations,
        timing_lines,
        write_durations,
    )
    from harness.timeline import compile_lines, startup_lines

    if args.longest_of and not args.write_durations:
        raise Unusable("--longest-of: only with --write-durations")
    report = _read_report(args.report)
    records = report.items
    if not records:
        raise Unusable(f"{args.report}: no items (the run it reports ran nothing)")
    for by in args.by or ["check", "family"]:
        print("\n".join(timing_lines(records, by=by, top=args.top)))
    timed = [r for r in records if r.start is not None]
    for lines in (startup_lines(report.meta, [r.start for r in timed], [r.start + r.duration for r in timed]),
                  compile_lines(report.meta, top=args.top)):
        if lines:
            print("\n".join(lines))
    if args.write_durations:
        source, kept = str(args.report), [args.report]
        if args.longest_of:
            if not args.longest_of.is_file():
                raise Unusable(f"--longest-of {args.longest_of}: no such report")
            earlier = Report.read(args.longest_of)
            records = longest_durations(records, earlier.items)
            source = f"{source}, each item's longest of it and {earlier.meta.get('source') or args.longest_of}"
            if not holds_durations_alone(earlier):  # a durations file may take its own merge: nothing else is lost
                kept.append(args.longest_of)
        try:
            write_durations(records, args.write_durations, source=source, inputs=tuple(kept))
        except (OSError, UnsafeTarget) as exc:
            raise Unusable(f"--write-durations {args.write_durations}: cannot write it "
                           f"({getattr(exc, 'strerror', None) or exc})") from None
        print(f"durations of {len(records)} items: {args.write_durations}")
    failures, unfinished = report.failures, report.unfinished
    if unfinished:
        print(f"the run did not finish ({unfinished}): not a pass")
    if failures:
        print(f"failures: {len(failures)} of {len(records)} items")
    return EXIT_FAILED if failures else EXIT_INTERRUPTED if unfinished else EXIT_OK


def cmd_report_html(args) -> int:
    from harness.report import UnsafeTarget, refuse_unsafe_target, write_atomic
    from harness.report_html import render

    report = _read_report(args.report)
    try:
        refuse_unsafe_target(args.out, what="page", inputs=(args.report,))
        write_atomic(args.out, render(report, title=f"ssd-harness: {args.report.name}"))
    except (OSError, UnsafeTarget) as exc:
        raise Unusable(f"--out {args.out}: cannot write it ({getattr(exc, 'strerror', None) or exc})") from None
    print(f"wrote {args.out}: {sum(1 for r in report.items if r.check)} case items")
    return EXIT_OK


def cmd_warmup(argv: list[str]) -> int:
    """The device must be chosen before ``kernels`` is imported, so it is read here and the rest is warmup's."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--device", choices=backend.DEVICES, default="auto")
    known, _ = pre.parse_known_args(argv)
    try:
        backend.configure(known.device)
    except (ValueError, RuntimeError) as exc:
        print(f"warmup: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    from harness import warmup

    return int(warmup.main(argv) or 0)


COMMANDS = {"run": cmd_run, "repro": cmd_repro, "validate": cmd_validate, "generate": cmd_generate,
            "schema": cmd_schema, "fuzz": cmd_fuzz, "times": cmd_times, "report-html": cmd_report_html}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])  # bench owns its own options (and --help)
    if argv and argv[0] == "warmup":
        return cmd_warmup(argv[1:])  # so does warmup
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except Unusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    except BrokenPipeError:  # stdout closed under the command (``| head``): the could-not-run status, no traceback
        _drop_stdout()
        print(f"error: {args.command}: stdout was closed before the output ended", file=sys.stderr)
        return EXIT_UNUSABLE
