"""A process's spare child: forked at the process's start for one owner, taken by the first ``Supervisor`` of that
owner that starts.

The owner is whoever forked it for its own case items: the ``python -m harness`` command (``CLI``) or a pytest
worker's config. Other supervisors in the same process never take it: a test that runs the CLI or an inner pytest
session inside a pytest worker would otherwise take (or discard) the worker's spare, and the worker's own case items
would then wait for a spawned child (an interpreter importing torch again).

``prefork()`` must run where the process has imported torch and has neither touched CUDA nor run a torch op
(``harness.isolation.forking`` says why). So this module imports nothing heavy: importing the harness's checks would
import ``kernels``, whose package settles Triton's interpreter choice by asking torch for a GPU, which starts the
CUDA driver (and then no fork is safe).
"""

from __future__ import annotations

import os
import select
import subprocess
import tempfile

from harness.isolation import forking
from harness.isolation.channel import Channel
from harness.isolation.protocol import CONTEXT_MADE

EXIT_WAIT_SECONDS = 10.0  # for a child that closed its channel (or was told to close) to exit by itself
CHILD_CONTEXT_WAIT_SECONDS = 60.0  # the most a process waits for its spare's device context before making its own

Launched = tuple  # (process, the supervisor's Channel, the trace file)
CLI = "python -m harness"  # the owner of a spare that harness/__main__.py forks for the command's items
_spare: tuple[int, object, Launched] | None = None  # (the pid that forked it, its owner, the launched child)
_refusal: tuple[int, object, str] | None = None  # (the pid that did not fork, for which owner, why): ``refused_for``
_context_made: tuple[int, int] | None = None  # (the pid that forked, a pipe's read end): see wait_for_spare_context


def prefork(owner: object, code_ran_before: bool = False) -> str:
    """Fork this process's first child now and keep it until a Supervisor of ``owner`` starts (``take``): "" when
    forked, else why not (``forking.fork_hazard``). The spare waits for its ``Hello`` and needs not import torch
    again; one never taken ends with this process (or ``discard``). ``code_ran_before``: code this module does not
    know ran in this process before the call (a test suite's conftest files), which may have started torch's OpenMP
    pool."""
    global _spare, _context_made, _refusal
    if waiting():
        return ""
    refused = forking.fork_hazard(code_ran_before)
    _refusal = (os.getpid(), owner, refused) if refused else None
    if not refused:
        made_r, made_w = os.pipe()
        try:
            _spare = (os.getpid(), owner, fork(context_made_fd=made_w))
        except BaseException:
            os.close(made_r)
            raise
        finally:
            os.close(made_w)
        _context_made = (os.getpid(), made_r)
    return refused


def wait_for_spare_context(timeout: float = CHILD_CONTEXT_WAIT_SECONDS) -> bool:
    """Block until this process's spare has made its device context: True once it has, False when it ended
    without one, the wait ran out, or there is no spare. The driver makes contexts one at a time, so a process whose
    case items run in its spare makes its own context only after the spare's (its first case item then does not
    wait behind it); a call that needs the context before then gets it from torch as usual. Once per spare."""
    global _context_made
    found, _context_made = _context_made, None
    if found is None or found[0] != os.getpid():
        return False
    fd = found[1]
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable) and os.read(fd, 1) == CONTEXT_MADE
    finally:
        os.close(fd)


def refused_for(owner: object) -> str:
    """Why this process's ``prefork`` for ``owner`` did not fork, for that owner's start records; "" where it forked
    or never tried for ``owner``: a supervisor of another owner would not have taken the spare either way."""
    if _refusal is None or owner is None:
        return ""
    pid, refused_owner, why = _refusal
    return why if pid == os.getpid() and refused_owner is owner else ""


def waiting(owner: object = None) -> bool:
    """Whether this process has a spare that no Supervisor took yet (``owner`` given: one forked for it)."""
    return _spare is not None and _spare[0] == os.getpid() and (owner is None or _spare[1] is owner)


def take(owner: object) -> Launched | None:
    """``owner``'s spare for a Supervisor to start (it then sends ``Hello``); None when there is none, it is
    another owner's, it died, or ``owner`` is None (no owner: a fresh child)."""
    global _spare
    if owner is None or not waiting(owner):  # a spare belongs to the process that forked it, and to its owner there
        return None
    found, _spare = _spare, None
    proc, channel, trace = found[2]
    if proc.poll() is not None:
        channel.close()
        trace.close()
        return None
    return found[2]


def discard(owner: object) -> None:
    """Close ``owner``'s unused spare (it reads the end of its input and exits) and wait briefly for it."""
    global _context_made
    if owner is None or not waiting(owner):
        return
    if _context_made is not None and _context_made[0] == os.getpid():  # nobody waits on it (a waiter takes it)
        os.close(_context_made[1])
        _context_made = None
    launched = take(owner)
    if launched is None:
        return
    proc, channel, trace = launched
    channel.close()
    try:
        proc.wait(EXIT_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()  # it started nothing: it never had a Hello
        proc.wait()
    trace.close()


def pipes_and_trace():
    """Two pipes (request, reply) and the child's trace file (faulthandler's): request_r, request_w, reply_r,
    reply_w, trace."""
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    trace = tempfile.TemporaryFile()  # already unlinked: a supervisor killed outright leaves no file behind
    return request_r, request_w, reply_r, reply_w, trace


def fork(context_made_fd: int | None = None) -> Launched:
    """Fork a child now that serves ``harness.isolation.child.run`` over fresh pipes; ``context_made_fd``: a pipe's
    write end the child writes ``protocol.CONTEXT_MADE`` to once its device context exists (the child's alone: the
    caller closes its copy)."""
    from harness.isolation import child

    request_r, request_w, reply_r, reply_w, trace = pipes_and_trace()
    parent = os.getpid()
    kept = (request_r, reply_w, trace.fileno()) + ((context_made_fd,) if context_made_fd is not None else ())
    try:
        proc = forking.fork_child(lambda: child.run(request_r, reply_w, trace.fileno(), parent,
                                                    context_made_fd=context_made_fd),
                                  keep_fds=kept)
    except BaseException:
        for fd in (reply_r, request_w):
            os.close(fd)
        trace.close()
        raise
    finally:
        os.close(request_r)
        os.close(reply_w)
    return proc, Channel(reply_r, request_w), trace
