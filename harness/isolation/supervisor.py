"""The supervisor: runs items in a child process (``harness.isolation.child``) and turns every way that child can
fail into a result of the item it was running, then starts a fresh child for the next item.

- The child dies during an item (a segfault, ``os._exit``, any exit): the item is an ERROR, "the process running
  the provider died: SIGSEGV (signal 11)" or "... exited with status N during the call", with the Python stack that
  faulthandler wrote at the fatal signal.
- The item runs past the time limit: the child is asked for its stack (SIGUSR1), killed with its process group,
  and the item is an ERROR "timed out after N s (limit from ...)" with that stack.
- The child reports a sticky device error after an item (``harness.isolation.sticky``): the item keeps its own
  result, and the child, which exits by itself, is replaced.
- After an item of a case timed out, the case's later items are ERRORs at once, naming the item that hung: they call
  the same provider on the same inputs, so each would most likely wait out the whole limit too.
- Whenever a child ends (an item's fault, a replacement, ``close``), what it started in its process group (it leads
  its own session) is killed too: a provider's helper processes never outlive the child they served.

A replaced child is recorded in ``restarts`` (which item, why), every start in ``starts`` (fork or spawn, the wait,
the child's phases). The child is started lazily, at the first request, and kept for every later one; ``start()``
starts it early without waiting for it (its start-up then overlaps the caller's own work). The first is the
process's spare when ``spare.prefork`` forked one. Nothing is retried: an item that crashed its process is reported,
never run again as passed.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# A dotted import binds the module that sys.modules holds, where pickle finds the message classes; ``from
# harness.isolation import protocol`` would take the package's attribute, which can outlive the module's entry in
# sys.modules where a test harness restores sys.modules after an in-process run (pytester).
import harness.isolation.protocol as protocol
from harness import backend
from harness.checks.base import CheckResult
from harness.checks.providers import ProviderError
from harness.checks.runner import fault_result, repro_line
from harness.isolation import forking, forkserver, spare
from harness.isolation.channel import Channel, ChannelClosed
from harness.isolation.settings import TimeLimit, item_timeout
from harness.isolation.spare import EXIT_WAIT_SECONDS

# How long a new child may take to import torch, configure the device and load the provider: at least this, and at
# least the item limit (a provider's import can be as slow as a call).
MIN_START_SECONDS = 120.0
TRACE_CHARS = 6000  # of a dying child's stack dump kept in the item's report
DUMP_WAIT_SECONDS = 2.0  # for the stack dump of a timed-out child before it is killed


class IsolationError(RuntimeError):
    """The child could not start, or failed outside an item (a warmup): the message says why in one line,
    ``detail`` holds what else is known (a traceback, the child's stack)."""

    def __init__(self, message: str, detail: str = ""):
        super().__init__(message)
        self.detail = detail


@dataclass(frozen=True)
class Restart:
    item: str  # "<case id>::<check>", or "warmup of <case id>"
    cause: str


def describe_exit(returncode: int, during: str = "during the call") -> str:
    """One line for a child's end: "... died: SIGSEGV (signal 11)" / "... exited with status 0 during the call"."""
    if returncode < 0:
        number = -returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "signal"
        return f"the process running the provider died: {name} (signal {number})"
    return f"the process running the provider exited with status {returncode} {during}".rstrip()


class Supervisor:
    mode = "process"

    def __init__(self, provider_spec: str, device: str, *, timeout: TimeLimit | float | None = None,
                 warmup_first: float = 0.0, start_timeout: float | None = None, spare_owner: object = None):
        """``device``: resolved ("cpu" or "cuda"). ``timeout``: seconds per item (0: none), a TimeLimit, or None
        for ``SSD_HARNESS_ITEM_TIMEOUT`` / the device's default. ``warmup_first``: see kernels.warmup.
        ``spare_owner``: whose spare child (``spare.prefork``) the first start takes; None: always a fresh one."""
        self.provider_spec, self.device, self.warmup_first = provider_spec, device, warmup_first
        self.spare_owner = spare_owner
        if isinstance(timeout, TimeLimit):
            self.limit = timeout
        elif timeout is None:
            self.limit = item_timeout(None, device)
        else:
            self.limit = TimeLimit(math.inf if timeout == 0 else float(timeout), "limit given to the supervisor")
        self.start_seconds = start_timeout or max(MIN_START_SECONDS, self.limit.seconds)
        self.restarts: list[Restart] = []
        self.processes = 0  # children started
        self.starts: list[dict] = []  # per child: how it started, how long the first request waited, its phases
        self._start: dict = {}
        self.provider_name = ""
        self._proc: subprocess.Popen | forking.ForkedProcess | forkserver.ServerChild | None = None
        self._channel: Channel | None = None
        self._trace = None  # an unnamed file the child's faulthandler writes to (nothing to remove, ever)
        self._ready = False
        # case -> (the check that timed out, its cause). Keyed by the case's contents (a Case compares and hashes by
        # value): the fuzzer names every drawn case alike, and a different case is not known to hang.
        self._hung: dict[object, tuple[str, str]] = {}

    # ---- the child's life

    def start(self) -> None:
        """Start a child unless one is running; returns at once (``run`` waits for it to be ready). The child is this
        process's spare when ``spare.prefork`` made one for ``spare_owner``, else a fresh interpreter."""
        if self._proc is not None:
            return
        launched, how = spare.take(self.spare_owner), "fork"
        if launched is None:
            launched, how = _fresh()
            refused = spare.refused_for(self.spare_owner)
            if refused:
                how += f" (no fork at start: {refused})"
        self._proc, self._channel, self._trace = launched
        self.processes += 1
        self._ready = False
        self._start = {"how": how}
        self.starts.append(self._start)
        forked = not how.startswith("spawn")  # a fork has the environment of its fork, not this process's
        self._channel.send(protocol.Hello(list(sys.path), self.device, self.provider_spec, self.warmup_first,
                                          _torch_threads(), _child_environ() if forked else None))

    def _ready_channel(self) -> Channel:
        if self._ready and self._proc.poll() is not None:  # ended between requests: no item's fault
            code, _ = self._reap()
            self.restarts.append(Restart("between items", describe_exit(code, during="between items")))
        self.start()
        if not self._ready:
            what = f"the process to run {self.provider_spec} on {self.device}"
            began = time.monotonic()
            try:
                reply = self._channel.recv(began + self.start_seconds)
            except TimeoutError:
                self._stop(dump=True)
                raise IsolationError(f"{what} did not start within {self.start_seconds:g} s") from None
            except ChannelClosed:
                code, _ = self._reap()
                raise IsolationError(f"{what} could not start: {describe_exit(code, during='')} "
                                     "(its stderr is above)") from None
            if isinstance(reply, protocol.Unusable):
                self._reap()
                raise ProviderError(reply.message)
            self._ready, self.provider_name = True, reply.provider_name
            self._start.update(waited=round(time.monotonic() - began, 4), phases=reply.startup)
        return self._channel

    def _exchange(self, request, deadline_seconds: float):
        """Send ``request`` and wait for the reply. Returns (reply, None, seconds) or (None, (cause, detail, kind),
        seconds) when the child died ("exit") or ran past the limit ("timeout"): it is gone either way. Seconds from
        the request sent (a start-up before it does not count). Any other interruption (Ctrl-C in this process)
        stops the child and propagates."""
        channel = self._ready_channel()
        began = time.monotonic()
        deadline = None if math.isinf(deadline_seconds) else began + deadline_seconds
        try:
            channel.send(request)
            return channel.recv(deadline), None, time.monotonic() - began
        except TimeoutError:
            stack = self._stop(dump=True)
            cause = f"timed out after {deadline_seconds:g} s ({self.limit.origin})"
            fault = (cause, f"where it was when stopped:\n{stack}" if stack.strip() else "", "timeout")
        except (ChannelClosed, BrokenPipeError):
            code, stack = self._reap()
            fault = (describe_exit(code), stack, "exit")
        except BaseException:
            self._stop(dump=False)
            raise
        return None, fault, time.monotonic() - began

    def _reap(self) -> tuple[int, str]:
        """The child ended (or is ending): its exit status and what faulthandler wrote; forget it."""
        proc = self._proc
        try:
            code = proc.wait(EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:  # it closed its channel but lives on
            self._kill_group(proc)
            code = proc.wait()
        return code, self._forget()

    def _stop(self, dump: bool) -> str:
        """Kill the child and what it started; with ``dump``, first ask it for its Python stack (SIGUSR1)."""
        proc = self._proc
        if proc is None:
            return ""
        if dump and proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
            end = time.monotonic() + DUMP_WAIT_SECONDS
            size = -1
            while time.monotonic() < end:  # until the dump has stopped growing
                now = os.fstat(self._trace.fileno()).st_size
                if now and now == size:
                    break
                size = now
                time.sleep(0.1)
        self._kill_group(proc)
        proc.wait()
        return self._forget()

    @staticmethod
    def _kill_group(proc) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                proc.kill()
            except ProcessLookupError:
                pass

    def _forget(self) -> str:
        """Kill what the ended child left in its process group, close the channel, read and close the trace file;
        the next request starts a fresh child."""
        if self._proc is not None:
            _kill_leftovers(self._proc.pid)
        stack = ""
        if self._trace is not None:
            # pread: the file's offset is shared with the child's descriptor, and the dump starts at 0.
            stack = os.pread(self._trace.fileno(), TRACE_CHARS, 0).decode("utf-8", errors="replace")
            self._trace.close()
        if self._channel is not None:
            self._channel.close()
        self._proc, self._channel, self._trace, self._ready = None, None, None, False
        return stack

    def close(self) -> None:
        """Tell the child to finish and wait briefly for it; kill it if it does not, or if it never became ready
        (a caller that gives up before the first item does not wait for the child's imports)."""
        if self._proc is None:
            return
        if not self._ready:
            self._stop(dump=False)
            return
        try:
            self._channel.send(protocol.Close())
        except OSError:
            pass
        self._channel.close()
        try:
            self._proc.wait(EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            self._kill_group(self._proc)
            self._proc.wait()
        self._forget()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- requests

    def run(self, case, check: str, *, repro_device: str | None = None, guard: bool = False) -> CheckResult:
        """``check`` on ``case`` in the child: its CheckResult, or an ERROR of this item when the child died, ran
        past the limit, or could not go on. ``guard``: under the recompile guard (``harness.isolation.guarded``)."""
        item = f"{case.id}::{check}"
        hung = self._hung.get(case)
        if hung is not None:
            earlier, cause = hung
            hang_repro = repro_line(case, earlier, self.provider_spec, repro_device)
            return fault_result(case, check, f"not run: {earlier} of the same case {cause}; the provider is taken to "
                                "hang on this case, so its remaining items fail at once", fault="timeout",
                                detail=f"the hang's repro: {hang_repro}",
                                provider_spec=self.provider_spec, repro_device=repro_device)
        reply, fault, seconds = self._exchange(protocol.RunItem(case, check, repro_device, guard), self.limit.seconds)
        if fault is not None:
            cause, detail, kind = fault
            self.restarts.append(Restart(item, cause))
            if kind == "timeout":
                self._hung[case] = (check, cause)
            return fault_result(case, check, cause, fault=kind, detail=detail, duration=seconds,
                                provider_spec=self.provider_spec, repro_device=repro_device)
        _absorb_compiles(reply)
        result = reply.result
        if reply.sticky:
            self._reap()
            self.restarts.append(Restart(item, reply.sticky))
            result.message = (f"{result.message}\nthe process that ran it could not run another item and was "
                              f"replaced: {reply.sticky}")
        return result

    def warmup(self, case) -> str:
        """Warm the case's model request for the recompile guard in the child (once per child); its summary.
        Raises IsolationError when the warmup fails, or its child dies or runs past the limit."""
        item = f"warmup of {case.id}"
        reply, fault, _ = self._exchange(protocol.Warmup(case), self.limit.seconds)
        if fault is not None:
            self.restarts.append(Restart(item, fault[0]))
            raise IsolationError(f"{item}: {fault[0]}", fault[1])
        _absorb_compiles(reply)
        if reply.sticky:
            self._reap()
            self.restarts.append(Restart(item, reply.sticky))
        if reply.error:
            raise IsolationError(f"{item} failed: {reply.error}", reply.detail)
        return reply.summary

    def describe(self) -> dict:
        """For a report's meta: how items were run and every replaced child; the running child's start record also
        has its CPU so far (``timeline.process_cpu``: what isolation costs the host)."""
        starts = [dict(s) for s in self.starts]
        if self._proc is not None and starts:
            from harness.timeline import process_cpu

            usage = process_cpu(self._proc.pid)
            if usage is not None:  # off Linux, or the child is gone
                starts[-1]["cpu"] = usage
        return {"isolation": self.mode, "item_timeout": None if math.isinf(self.limit.seconds) else self.limit.seconds,
                "processes": self.processes, "restarts": [asdict(r) for r in self.restarts], "starts": starts}


def _kill_leftovers(pgid: int) -> None:
    """SIGKILL to the process group a child led, after the child itself was reaped: its own grandchildren (a
    provider's compile workers or helper servers) stay in that group unless they left it. Safe after the reap: the
    kernel does not reuse a process id while a group still carries it, and an empty group is simply gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _fresh() -> tuple[spare.Launched, str]:
    """A fresh child and how it started: forked by this process's fork server (``harness.isolation.forkserver``),
    else spawned, with the reason the server did not fork it."""
    request_r, request_w, reply_r, reply_w, trace = spare.pipes_and_trace()
    env = _spawn_environ()  # the server's, where this starts it; else the spawned child's
    try:
        proc, refused = forkserver.fork(request_r, reply_w, trace.fileno(), env)
        how = "fork server"
        if proc is None:
            how = f"spawn (no fork server: {refused})"
            proc = _spawn(request_r, reply_w, trace, env)
    except BaseException:
        trace.close()
        for fd in (reply_r, request_w):
            os.close(fd)
        raise
    finally:
        os.close(request_r)
        os.close(reply_w)
    return (proc, Channel(reply_r, request_w), trace), how


def _spawn_environ() -> dict[str, str]:
    """A new interpreter's environment: this process's for its child (``_child_environ``), with the directory
    ``harness`` is imported from first on its path, for ``-m``."""
    root = str(Path(__file__).resolve().parents[2])
    env = _child_environ()
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def _spawn(request_r: int, reply_w: int, trace, env: dict[str, str]) -> subprocess.Popen:
    """A new interpreter running ``harness.isolation.child`` on these descriptors, with ``env``."""
    # Its own session: a terminal's Ctrl-C reaches the front end alone, which stops the child itself, and a kill at
    # the time limit reaches whatever the child started (warmup compile processes).
    return subprocess.Popen(
        [sys.executable, "-m", "harness.isolation.child", str(request_r), str(reply_w), str(trace.fileno()),
         str(os.getpid())],
        pass_fds=(request_r, reply_w, trace.fileno()), stdin=subprocess.DEVNULL, env=env, start_new_session=True)


def _child_environ() -> dict[str, str]:
    """This process's environment for its child. The child stands in for this process while it waits, so it gets
    this process's share of the cores (pytest workers each take a fair share): torch's default of one thread per
    core in every child oversubscribes the host N-fold under ``-n N``. OpenMP sizes its pool from the environment
    at start (a spawned child); the child also sets torch's count from ``Hello`` (a forked one)."""
    env = dict(os.environ)
    threads = _torch_threads()
    if threads:
        env[backend.BLAS_THREADS_ENV] = str(threads)
    return env


def _torch_threads() -> int:
    """This process's torch intra-op thread count, or 0 where torch is not imported (then the child keeps torch's
    default: nothing here decided a share)."""
    torch = sys.modules.get("torch")
    return torch.get_num_threads() if torch is not None else 0


def _absorb_compiles(reply) -> None:
    """The child's compiles count as this process's: its ledger (if it keeps one) is what a report reads."""
    if reply.compiles:
        from harness import timeline

        ledger = timeline.installed_compile_ledger()
        if ledger is not None:
            ledger.absorb(reply.compiles)
