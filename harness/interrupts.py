"""SIGTERM stops a run the way Ctrl-C does. A CI time limit (``timeout``), a job's cancel or ``kill`` sends SIGTERM,
whose default action ends the process before it can report; raised as ``KeyboardInterrupt`` instead, it reaches the
code that reports what finished and says the run was interrupted (the CLI's loop, pytest's session)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


def sigterm_as_interrupt() -> Callable[[], None]:
    """Until the returned function is called, the first SIGTERM raises ``KeyboardInterrupt`` in the main thread.
    That SIGTERM gives the signal back to its earlier handler, so a second one acts as it did before (a process held
    inside native code, where Python cannot raise, still ends). Nothing changes outside the main thread (only it may
    set handlers) or where the earlier handler was not set from Python (it could not be given back)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:
        return lambda: None

    def interrupt(signum, frame):
        signal.signal(signal.SIGTERM, previous)
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
