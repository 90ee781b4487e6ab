"""Hypothesis search for failing cases (``python -m harness fuzz --budget N --out cases/regressions``).

``cases()`` draws small, valid cases over the ``ssd-case/1`` schema (every combination the loader accepts is
reachable; none it rejects is drawn). ``fuzz`` runs the applicable checks of each drawn case against a provider,
lets Hypothesis shrink the first failure and writes the shrunk case as a YAML case (``expect: pass``,
``checks: [<the failing check>]``, ``tiers: {cpu: true}``, the failure in its description) through
``harness.cases.loader.dump_case``.

Every item runs through a ``harness.isolation`` runner: by default in a supervised child process, so a provider
that crashes, hangs past the item time limit or leaves a sticky device error (a poisoned CUDA context) costs that
item its process, the item is a failure with the cause in one line, and the next item runs in a healthy child. A
fault is a finding like a mismatch: the first failure fixes what the shrinking keeps (``Failure.signature``: the
same check failing the same way: a mismatch, an exception of the same type, a crash with the same cause, a hang, a
sticky device error). A hang counts only when it repeats in the fresh child: a first call that compiles its kernels
on a busy host can pass the limit once. Each case runs once; Hypothesis' final replay of the minimal case is
answered from memory.

Budgets: ``budget`` examples for the search (shrinking is Hypothesis' to bound: it stops after five minutes), and an
optional wall-time budget for search and shrinking together, checked before each item but the first (an item running
when it passes ends by itself or at its time limit). The first item runs whatever the clock says: the child's
start-up (torch, a CUDA context on a busy host) comes before it and can take longer than a short budget, and a
search that tried nothing would tell nothing. Hypothesis' own deadline is off: the item time limit is what stops a
slow item. When the time budget runs out, or on Ctrl-C (SIGTERM in the CLI), the smallest failure seen so far is
written. Progress goes to a log (stderr): a line at the start and at the first failure, and a heartbeat every
``heartbeat`` seconds from a side thread (examples tried, faults seen, process restarts, elapsed time, the smallest
failure so far), so that an item that hangs does not silence the search.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from hypothesis import HealthCheck, find, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from harness.cases.model import (
    INDEX_DTYPES,
    IO_DTYPES,
    STATE_DTYPES,
    CacheSpec,
    CallSpec,
    Case,
    Dtypes,
    Expect,
    IndicesSpec,
    Options,
    SequenceSpec,
    Shape,
    Tiers,
    default_family,
)
from harness.varlen import build_varlen_metadata

FAMILY = "fuzz"
MAX_SEQUENCES = 3
MAX_TOKENS = 40  # per sequence: the interpreter is slow
# Chunks x heads of a drawn case: every check of it takes seconds at most in the interpreter. Drawn cases run on the
# CPU tier whatever its per-item estimate says (tiers.cpu: true), and so do the regressions written from them.
MAX_CHUNK_HEADS = 12
HEARTBEAT_SECONDS = 10.0


@st.composite
def cases(draw, max_sequences: int = MAX_SEQUENCES) -> Case:
    """A small valid case (within MAX_CHUNK_HEADS), run on the CPU tier. ``id`` is a placeholder until a failure is
    written."""
    ngroups = draw(st.sampled_from([1, 2]))
    shape = Shape(
        nheads=ngroups * draw(st.integers(1, 2)),
        headdim=draw(st.sampled_from([2, 4, 8])),
        dstate=16,
        ngroups=ngroups,
        chunk_size=draw(st.sampled_from([16, 32, 64])),
    )
    dtype = Dtypes(io=draw(st.sampled_from(IO_DTYPES)), state=draw(st.sampled_from(STATE_DTYPES)))
    options = Options(
        D=draw(st.sampled_from(["none", "per_head", "per_channel"])),
        z=draw(st.booleans()),
        dt_bias=draw(st.booleans()),
        dt_softplus=draw(st.booleans()),
        dt_limit=draw(st.sampled_from([(0.0, math.inf), (0.001, 0.1)])),
    )
    final_state = draw(st.sampled_from(["direct", "returned", "checkpoint"]))
    direct = final_state == "direct"
    lengths = _sequence_lengths(draw, shape, max_sequences)
    batch = len(lengths)
    slots = batch + draw(st.integers(0, 2))
    finals = draw(st.permutations(range(slots)))[:batch] if direct else [None] * batch
    sequences, slot_state = [], {}
    for b, (context, tokens) in enumerate(lengths):
        init = draw(st.integers(0, slots - 1))
        # A slot is either masked (NaN) or stateful for every sequence that reads it.
        has_state = slot_state.setdefault(init, draw(st.booleans()))
        final = finals[b]
        if direct and draw(st.integers(0, 5)) == 0:
            final = -1  # a padded sequence: nothing written
        sequences.append(SequenceSpec(context=context, tokens=tokens, init_slot=init, has_state=has_state,
                                      final_slot=final))
    sequences = tuple(sequences)
    cache = CacheSpec(
        slots=slots, row_pad=draw(st.integers(0, 5)), offset=draw(st.integers(0, 5)),
        fill=draw(st.sampled_from(["nan", 0.5])),
    )
    index_dtype = draw(st.sampled_from(INDEX_DTYPES))
    if draw(st.booleans()):
        columns = draw(st.integers(2, 5))
        init_column, final_column = draw(st.permutations(range(columns)))[:2]
        indices = IndicesSpec(layout="block_table", dtype=index_dtype, columns=columns, init_column=init_column,
                              final_column=final_column if direct else None, rows_before=draw(st.integers(0, 3)))
    else:
        indices = IndicesSpec(layout="contiguous", dtype=index_dtype)
    case = Case.create("fuzz-candidate", shape=shape, dtype=dtype, options=options, sequences=sequences, cache=cache,
                       indices=indices, call=CallSpec(final_state=final_state), tiers=Tiers(cpu=True))
    path = draw(st.sampled_from(["auto", "snapshot", "indexed"] if case.indexed_eligible() else ["auto", "snapshot"]))
    return replace(case, seed=draw(st.integers(0, 2**16)), call=CallSpec(final_state=final_state, path=path))


def _sequence_lengths(draw, shape: Shape, max_sequences: int) -> list[tuple[int, int]]:
    """(context, tokens) per sequence, within MAX_CHUNK_HEADS chunks x heads."""
    budget = MAX_CHUNK_HEADS // shape.nheads  # chunks left for the whole batch
    q = shape.chunk_size
    lengths = []
    for _ in range(draw(st.integers(1, max_sequences))):
        if budget < 1:
            break
        context = draw(st.integers(0, 150))
        room = q - context % q
        fits = room + (budget - 1) * q  # most tokens that stay within the remaining chunks
        tokens = min(draw(st.integers(1, MAX_TOKENS)), fits)
        budget -= len(build_varlen_metadata([context], [tokens], q).seq_idx)
        lengths.append((context, tokens))
    return lengths


# ---------------------------------------------------------------- what was found


@dataclass(frozen=True)
class Failure:
    """How one item failed, in the terms the search keeps fixed while it shrinks.

    ``kind``: ``mismatch`` (the check's comparison failed), ``exception`` (the provider or check raised), ``crash``
    (the process running the item died), ``hang`` (the item ran past its time limit) or ``sticky device error`` (the
    item's error left its process unable to run another item). ``cause``: one line, the cause as the isolation layer
    or the check reported it. ``signature``: what a smaller case must show to count as the same failure."""

    check: str
    kind: str
    cause: str
    signature: str

    @property
    def fault(self) -> bool:
        return self.kind != "mismatch"

    def describe(self) -> str:
        """One line for people: "determinism failed with a crash (the process running the provider died: ...)"."""
        if not self.fault:
            return f"{self.check} failed ({self.cause})"
        article = "an" if self.kind[0] in "aeiou" else "a"
        return f"{self.check} failed with {article} {self.kind} ({self.cause})"


def classify(result, replaced: str = "") -> Failure:
    """The failure of ``result`` (a failing CheckResult); ``replaced``: the cause the runner recorded when the item
    cost its process (``runner.restarts``), "" when the process lived on."""
    check, summary = result.check, " ".join(result.summary.split())
    if replaced.startswith("timed out"):
        return Failure(check, "hang", replaced, "hang")
    if replaced.startswith("the process running the provider"):  # died, or exited: isolation.describe_exit
        return Failure(check, "crash", replaced, f"crash: {replaced}")
    if replaced:  # harness.isolation.sticky: "sticky device error: <the error>" or "the device context is unusable"
        cause = replaced.removeprefix("sticky device error: ")
        if summary and summary not in cause:
            cause = f"{summary}; {cause}"
        return Failure(check, "sticky device error", cause, "sticky device error")
    if result.status.value == "error":
        name = re.match(r"[\w.]*", summary).group(0) or summary
        return Failure(check, "exception", summary, f"exception: {name}")
    return Failure(check, "mismatch", summary, "mismatch")


@dataclass
class Finding:
    """A shrunk failure written to ``path``. ``stopped``: why the search ended before Hypothesis finished shrinking
    ("" when it finished: the case is as small as Hypothesis gets it)."""

    path: Path
    case_id: str
    check: str
    summary: str
    repro: str
    failure: Failure
    first: Case | None = None  # the case that showed the failure first, before shrinking
    stopped: str = ""
    examples: int = 0
    faults: int = 0
    restarts: int = 0
    seconds: float = 0.0


@dataclass
class NoFailure:
    """The search ended without a failure, after this many drawn cases and checks that reached a verdict.
    ``stopped``: why it ended before the example budget ("" when the budget was spent)."""

    examples: int
    items: int
    stopped: str = ""
    restarts: int = 0
    seconds: float = 0.0


class NothingTried(Exception):
    """No drawn case ran a check to a verdict (every check was filtered out, skipped or unsupported): no failure
    found means nothing here."""


class _Stop(BaseException):
    """Ends the search from inside Hypothesis' test function: Hypothesis re-raises what is not an Exception at once,
    without treating it as a failure to shrink. ``args[0]``: why."""


class _Abort(BaseException):
    """The harness itself could not run an item (an unloadable provider, a child that does not start): carried out
    of Hypothesis, then raised as ``args[0]``, so that it is not shrunk like a provider's failure."""


# ---------------------------------------------------------------- the runners


class _Runners:
    """The isolation runner that runs the next item, and (once a child has been lost) a spare whose child starts
    while the search goes on: after an item that cost its process, the spare takes over and the runner that lost
    its child starts a new one and becomes the spare. Shrinking a fault loses a child at nearly every step; the
    spare keeps the child's start-up (torch, the device, the provider) off most of those steps."""

    def __init__(self, provider_spec: str, device: str, *, isolation: str | None, timeout, provider):
        from harness.isolation import open_runner, spare

        self.device = device
        self._open = lambda: open_runner(provider_spec, device, isolation=isolation, timeout=timeout,
                                         provider=provider, spare_owner=spare.CLI)
        self.active = self._open()
        self.spare = None

    @property
    def isolated(self) -> bool:
        return self.active.mode == "process"

    @property
    def limit(self):
        return self.active.limit

    def start(self) -> None:
        self.active.start()

    def run(self, case, check: str):
        """(CheckResult, the cause of the child lost to this item or "")."""
        runner = self.active
        before = len(runner.restarts)
        result = runner.run(case, check)
        item = f"{case.id}::{check}"
        lost = [r.cause for r in runner.restarts[before:] if r.item == item]
        if lost and self.isolated:
            runner.start()
            if self.spare is None:
                self.spare = self._open()
                self.spare.start()
            self.active, self.spare = self.spare, runner
        return result, lost[-1] if lost else ""

    @property
    def restarts(self) -> int:
        return sum(len(r.restarts) for r in self._all())

    def _all(self) -> list:
        return [r for r in (self.active, self.spare) if r is not None]

    def close(self) -> None:
        for runner in self._all():
            runner.close()


# ---------------------------------------------------------------- the search


class _Search:
    """The predicate Hypothesis minimises: "some check fails", narrowed once a failure is seen to the same check
    failing the same way (``Failure.signature``). Every case is run once: Hypothesis' final replay of the minimal
    case is answered from ``_seen``, so a crash or a hang is not paid for again."""

    def __init__(self, runners: _Runners, only: list[str] | None, deadline: float, time_budget: float | None,
                 shrink_budget: int | None = None):
        self.runners, self.only = runners, only
        self.deadline, self.time_budget, self.shrink_budget = deadline, time_budget, shrink_budget
        self.target: Failure | None = None
        self.first: Case | None = None
        self.smallest: tuple[Case, Failure] | None = None
        self.examples = 0
        self.shrink_examples = 0  # examples run after the first failure
        self.items = 0  # checks run to a verdict (not skipped or unsupported)
        self.faults = 0  # items that ended in an error, a crash, a hang or a sticky device error
        self._seen: dict[Case, Failure | None] = {}
        self._lock = threading.Lock()  # the heartbeat thread reads what this one writes

    def fails(self, case: Case) -> bool:
        if case in self._seen:
            failure = self._seen[case]
            if failure is not None:
                self._record(case, failure)
            return failure is not None
        try:
            failure = self._run(case)
        except Exception as exc:  # noqa: BLE001 - the harness's failure: ends the search, never shrunk
            raise _Abort(exc) from exc
        self._seen[case] = failure
        if failure is None:
            return False
        self._record(case, failure)
        return True

    def _run(self, case: Case) -> Failure | None:
        from harness.checks import selected_checks
        from harness.checks.tiers import tier_reason

        if self.target is not None:  # the count first: where both budgets ran out, the count is what stopped it
            if self.shrink_budget is not None and self.shrink_examples >= self.shrink_budget:
                n = self.shrink_budget
                raise _Stop(f"the shrinking budget of {n} example{'s' * (n != 1)} ran out")
            with self._lock:
                self.shrink_examples += 1
        if self.examples:  # the first item runs however long the child's start-up took (the module says why)
            self._check_time()
        # The items the run's tier leaves out (harness.checks.tiers: the CPU tier's cost model, the checks that run
        # on the GPU only when --check names them) would only report their skip: not run, as a front end skips them.
        names = [n for n, _ in selected_checks(case) if (not self.only or n in self.only)
                 and not tier_reason(case, n, self.runners.device, self.only)]
        if self.target is not None:
            names = [n for n in names if n == self.target.check]
        with self._lock:
            self.examples += 1
        for k, name in enumerate(names):
            if k:
                self._check_time()
            ran, failure = self._item(case, name)
            if not ran:
                continue
            with self._lock:
                self.items += 1
            if failure is not None and failure.kind == "hang":
                # Once more, in the fresh process that replaced the timed-out one: a real hang repeats, while the
                # first call of a new shape compiles its kernels, which on a busy host can pass the limit once (the
                # binaries are in the disk cache by then). The second run's verdict stands.
                self._check_time()
                _, again = self._item(case, name)
                failure = failure if again is not None and again.kind == "hang" else again
            if failure is not None and (self.target is None or failure.signature == self.target.signature):
                return failure
        return None

    def _item(self, case: Case, check: str) -> tuple[bool, Failure | None]:
        """Run one item: whether it reached a verdict (not skipped or unsupported), and its failure or None."""
        from harness.checks import Status

        result, lost = self.runners.run(case, check)
        if result.status in (Status.SKIPPED, Status.UNSUPPORTED):
            return False, None
        with self._lock:
            self.faults += result.status is Status.ERROR or bool(lost)
        return True, classify(result, lost) if result.status.is_failure else None

    def _check_time(self) -> None:
        if time.monotonic() >= self.deadline:
            raise _Stop(f"the time budget of {self.time_budget:g} s ran out")

    def _record(self, case: Case, failure: Failure) -> None:
        with self._lock:
            if self.target is None:
                self.target, self.first = failure, case
            if self.smallest is None or size(case) < size(self.smallest[0]):
                self.smallest = (case, failure)

    def settle(self, minimal: Case) -> None:
        """Hypothesis finished shrinking at ``minimal``: that is the case to write (its order, not ``size``'s)."""
        with self._lock:
            self.smallest = (minimal, self._seen[minimal])

    def status(self, elapsed: float) -> str:
        """One line: where the search is."""
        with self._lock:
            smallest, examples, faults = self.smallest, self.examples, self.faults
        phase = "shrinking" if smallest else "searching"
        head = (f"fuzz: {phase}: {examples} examples, {faults} fault{'s' * (faults != 1)}, "
                f"{self.runners.restarts} process restarts, {elapsed:.0f} s")
        if smallest is None:
            return f"{head}; no failure yet"
        case, failure = smallest
        return f"{head}; smallest failure so far: {failure.describe()} on {_shape_of(case)}"


def size(case: Case) -> tuple:
    """An order on cases for "the smallest failure so far" while Hypothesis is still shrinking (its own order is
    on the choices it drew, which the search does not see): fewer sequences, tokens and context first, then the
    smaller shape, cache, index layout and options."""
    o, c = case.options, case.cache
    options = (o.D != "none") + o.z + o.dt_bias + o.dt_softplus + (o.dt_limit != (0.0, math.inf))
    return (case.batch, case.total_tokens, sum(s.context for s in case.sequences), case.shape.nheads,
            case.shape.headdim, case.shape.ngroups, case.shape.chunk_size, c.slots, c.row_pad + c.offset,
            case.indices.layout != "contiguous", options, case.seed)


def _shape_of(case: Case) -> str:
    """``Case.summary()`` without the placeholder id."""
    return case.summary().split(": ", 1)[-1]


class _Heartbeat:
    """Writes ``search.status`` to ``log`` every ``interval`` seconds from a side thread, so that an item that
    hangs (or a child that takes long to start) does not silence the search."""

    def __init__(self, search: _Search, log, interval: float, started: float):
        self.search, self.log, self.interval, self.started = search, log, interval, started
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="fuzz-heartbeat", daemon=True)
        self._lock = threading.Lock()

    def say(self, line: str) -> None:
        with self._lock:
            try:
                print(line, file=self.log, flush=True)
            except (OSError, ValueError):  # a closed or broken stream: the search goes on
                pass

    def _beat(self) -> None:
        while not self._done.wait(self.interval):
            self.say(self.search.status(time.monotonic() - self.started))

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


# ---------------------------------------------------------------- writing


def _named(case: Case, failure: Failure, provider_spec: str, device: str) -> Case:
    check = failure.check
    body = f"{case.shape}{case.dtype}{case.options}{case.sequences}{case.cache}{case.indices}{case.call}{case.seed}"
    digest = hashlib.sha1(f"{check}|{failure.signature}|{body}".encode()).hexdigest()[:8]
    case_id = f"{FAMILY}-{check.replace('_', '-')}-{digest}"
    description = (f"found by python -m harness fuzz against {provider_spec} on {device}: "
                   f"{_clip(failure.describe(), 300)}")
    return replace(case, id=case_id, family=default_family(case_id), description=description, checks=(check,),
                   expect=Expect("pass"))


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def out_dir_problem(out_dir: Path) -> str:
    """Why ``write_finding`` could not write into ``out_dir``, or "" when it can: asked before the search, so that a
    bad ``--out`` is refused at once instead of losing a finding that took the whole search. The nearest existing
    folder on the way must be a directory this process can create a file in (tried, not inferred from the mode
    bits: root, read-only mounts and ACLs all answer for themselves)."""
    existing = out_dir
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is" if existing == out_dir else f"is on the way to {out_dir} and is"
        return f"{existing} {what} not a directory"
    try:
        fd, name = tempfile.mkstemp(prefix=".fuzz-out-probe.", dir=existing)
    except OSError as exc:
        return f"cannot create a file in {existing} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(name)
    return ""


def write_finding(case: Case, out_dir: Path) -> Path:
    """Write ``case`` as ``<out_dir>/<id>.yaml`` once it loads back to the same case.

    It is written under a name unique to this call first (a case file other runs and collectors skip: not .yaml),
    checked, then renamed into place; nothing is left behind when the check fails."""
    from harness.cases.loader import dump_case, load_case_file

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{case.id}.yaml"
    fd, name = tempfile.mkstemp(prefix=f".{case.id}.", suffix=".yaml.tmp", dir=out_dir)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make the case file private to this user
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(dump_case(case))
        if load_case_file(tmp) != [case]:  # equality ignores where a case was loaded from
            raise RuntimeError(f"{path}: the written case does not load back to the case that failed")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------- the search, driven


def fuzz(provider_spec: str, *, budget: int, out_dir: Path, device: str, checks: list[str] | None = None,
         seed: int = 0, isolation: str | None = None, timeout=None, provider=None, time_budget: float | None = None,
         shrink_budget: int | None = None, heartbeat: float = HEARTBEAT_SECONDS, log=None) -> Finding | NoFailure:
    """Try up to ``budget`` cases against ``provider_spec`` on ``device`` (resolved); on a failure shrink it, write
    it to ``out_dir`` and return the finding.

    ``isolation``, ``timeout``, ``provider``: ``harness.isolation.open_runner``'s (a process per runner by default;
    ``timeout``: the item time limit). ``time_budget``: seconds for the search and shrinking together (None: no
    limit), checked before each item but the first. ``shrink_budget``: examples to run while shrinking a failure
    (None: until Hypothesis is done), checked before each: where every failing example costs a process (a crash, a
    hang), it bounds the search's cost by a count, the same on any host, where a time budget stops it wherever the
    host's speed says. ``heartbeat``: seconds between progress lines on ``log`` (default stderr). When a budget runs
    out or the search is interrupted (KeyboardInterrupt), the smallest failure seen so far is written and returned
    with ``stopped`` saying why. Raises ``NothingTried`` when no check reached a verdict, and the harness's own
    errors (``ProviderError``, ``IsolationError``) as they are."""
    from harness.checks import repro_line

    log = sys.stderr if log is None else log
    started = time.monotonic()
    deadline = math.inf if time_budget is None else started + time_budget
    runners = _Runners(provider_spec, device, isolation=isolation, timeout=timeout, provider=provider)
    search = _Search(runners, checks, deadline, time_budget, shrink_budget)
    config = settings(max_examples=budget, database=None, deadline=None,  # the item time limit stops slow items
                      suppress_health_check=list(HealthCheck))
    budgets = (f"up to {budget} examples" + (f" or {time_budget:g} s" if time_budget is not None else "")
               + (f", {shrink_budget} more while shrinking" if shrink_budget is not None else ""))
    stopped = ""
    try:
        with _Heartbeat(search, log, heartbeat, started) as beat:
            beat.say(f"fuzz: searching {budgets} against {provider_spec} on {device} (isolation "
                     f"{runners.active.mode}, item time limit {runners.limit.describe()}, heartbeat every "
                     f"{heartbeat:g} s)")
            runners.start()
            try:
                search.settle(find(cases(), _announcing(search, beat, started), settings=config,
                                   random=random.Random(seed)))
            except NoSuchExample:
                pass
            except _Stop as stop:
                stopped = str(stop.args[0])
            except KeyboardInterrupt:
                stopped = "interrupted"
            except _Abort as abort:
                raise abort.args[0] from None
            if stopped:
                beat.say(f"fuzz: stopped: {stopped}")
    finally:
        runners.close()
    seconds = time.monotonic() - started
    if search.smallest is None:
        if not search.items and stopped != "interrupted":
            only = f" (--check {', '.join(checks)})" if checks else ""
            raise NothingTried(f"no check{only} passed or failed on any of {search.examples} drawn cases: each was "
                               "filtered out, skipped or unsupported"
                               + (f" ({stopped})" if stopped else ""))
        return NoFailure(examples=search.examples, items=search.items, stopped=stopped, restarts=runners.restarts,
                         seconds=seconds)
    case, failure = search.smallest
    named = _named(case, failure, provider_spec, device)
    path = write_finding(named, Path(out_dir))
    named = replace(named, source=path)
    repro = repro_line(named, failure.check, provider_spec, device)
    if failure.kind == "hang" and "default" not in runners.limit.origin:
        repro += f" --item-timeout {runners.limit.seconds:g}"  # the limit the hang was found under
    return Finding(path=path, case_id=named.id, check=failure.check, summary=failure.cause, repro=repro,
                   failure=failure, first=search.first, stopped=stopped, examples=search.examples,
                   faults=search.faults, restarts=runners.restarts, seconds=seconds)


def _announcing(search: _Search, beat: _Heartbeat, started: float):
    """``search.fails``, saying on the log when the first failure is found."""

    def fails(case: Case) -> bool:
        found_before = search.target is not None
        failed = search.fails(case)
        if failed and not found_before:
            beat.say(f"fuzz: found after {search.examples} examples ({time.monotonic() - started:.0f} s): "
                     f"{search.target.describe()} on {_shape_of(case)}; shrinking")
        return failed

    return fails
