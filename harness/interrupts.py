"""SIGTERM stops a run the way Ctrl-C does. A CI time limit (``timeout``), a job's cancel or ``kill`` sends SIGTERM,
whose default action ends the process before it can report; raised as ``KeyboardInterrupt`` instead, it reaches the
code that reports what finished and says the run was interrupted (the CLI's loop, pytest's session)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


def sigterm_as_interrupt() -> Callable[[], None]:
    """Until the returned function is called, the first SIGTERM raises ``KeyboardInterrupt`` in the main thread and
    later ones are ignored: the run is stopping already, and ``timeout`` signals its command and then the command's
    whole process group, so the process gets two (a second ``KeyboardInterrupt``, raised while the first unwinds,
    would stop the report being written; SIGKILL still ends the process). Nothing changes outside the main thread
    (only it may set handlers) or where the earlier handler was not set from Python (it could not be given back)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:
        return lambda: None
    raised = False

    def interrupt(signum, frame):
        nonlocal raised
        if not raised:
            raised = True
            raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)

    def give_back() -> None:
        if signal.getsignal(signal.SIGTERM) is interrupt:
            signal.signal(signal.SIGTERM, previous)

    return give_back


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    give_back = sigterm_as_interrupt()
    try:
        yield
    finally:
        give_back()
