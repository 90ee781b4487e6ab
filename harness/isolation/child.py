"""The supervised child: ``python -m harness.isolation.child READ_FD WRITE_FD TRACE_FD PARENT_PID``, or a fork of
the supervisor's process that calls ``run`` (``harness.isolation.forking``).

It configures itself like its parent (``protocol.Hello``: sys.path, device, provider), answers ``Ready`` or
``Unusable``, then runs one request at a time until ``Close`` or the end of its input. Provider faults that Python
can catch become the item's ERROR here (``Worker``, with ``interrupts_are_errors``: SIGINT is ignored, so a
KeyboardInterrupt is the provider's). Faults that end the process (a segfault, ``os._exit``, a kill at the time
limit) are the supervisor's to report: faulthandler writes the Python stack of a fatal signal, and of SIGUSR1 (sent
before a kill at the time limit), to TRACE_FD (an unnamed file), which the supervisor adds to the item's
report. After an item leaves a sticky device error (``sticky``) the child reports it and exits.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback

# The child's own exit status after a sticky device error (the supervisor expects it and starts a fresh process).
STICKY_EXIT = 75


def exit_with_parent(parent_pid: int) -> None:
    """Linux: the kernel kills this process when the parent dies (a supervisor killed without closing its child
    must not leave it running a hung item). Elsewhere the end of the request pipe ends the child between items."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__


def _say_context_made(fd: int | None) -> None:
    if fd is not None:
        from harness.isolation.protocol import CONTEXT_MADE

        try:
            os.write(fd, CONTEXT_MADE)
        finally:
            os.close(fd)


def serve(channel, worker) -> int:
    from harness import timeline
    from harness.isolation import protocol

    ledger = timeline.installed_compile_ledger()  # forwarded with each reply to the process the items are for

    while True:
        try:
            request = channel.recv()
        except EOFError:
            return 0
        if isinstance(request, protocol.Close):
            return 0
        if isinstance(request, protocol.RunItem):
            try:
                result = worker.run(request.case, request.check, repro_device=request.repro_device,
                                    guard=request.guard)
            except BaseException as exc:  # noqa: BLE001 - the harness's own failure, still this item's ERROR
                from harness.checks.runner import fault_result

                result = fault_result(request.case, request.check, f"the harness failed to run the item: "
                                      f"{_one_line(exc)}", fault="harness", detail=traceback.format_exc(),
                                      provider_spec=worker.provider_spec, repro_device=request.repro_device)
            reply = protocol.ItemDone(result, worker.sticky(result))
        elif isinstance(request, protocol.Warmup):
            try:
                reply = protocol.Warmed(summary=worker.warmup(request.case))
            except BaseException as exc:  # noqa: BLE001 - reported to the supervisor, which decides
                detail = traceback.format_exc()
                reply = protocol.Warmed(error=_one_line(exc), detail=detail, sticky=worker.sticky_text(detail))
        else:
            raise TypeError(f"harness.isolation.child: unknown request {type(request).__name__}")
        reply.compiles = ledger.drain() if ledger is not None else None
        _flush()
        try:
            channel.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError, ValueError) as exc:  # a stat that does not pickle
            if isinstance(reply, protocol.ItemDone):
                reply.result.stats = {k: repr(v) for k, v in reply.result.stats.items()}
                channel.send(reply)
            else:
                raise exc
        if reply.sticky:
            _flush()
            os._exit(STICKY_EXIT)  # no teardown: a poisoned CUDA context can hang or crash at exit


def main(argv: list[str] | None = None) -> int:
    """A spawned child's entry point (``python -m harness.isolation.child``)."""
    read_fd, write_fd, trace_fd, parent_pid = (argv if argv is not None else sys.argv[1:])
    return run(int(read_fd), int(write_fd), int(trace_fd), int(parent_pid))


def run(read_fd: int, write_fd: int, trace_fd: int, parent_pid: int, context_made_fd: int | None = None) -> int:
    """The child's life, spawned or forked (``harness.isolation.forking``): wait for ``Hello``, configure, answer
    ``Ready`` or ``Unusable``, serve. A forked child has its parent's modules already imported and waits here for
    ``Hello``; a spawned one imports what it needs. ``context_made_fd``: where to write ``protocol.CONTEXT_MADE`` once
    the device context exists (the parent waits for it before making its own), closed then or at exit."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(parent_pid)
    faulthandler.enable(trace_fd, all_threads=True)  # the descriptor stays open for the process's lifetime
    faulthandler.register(signal.SIGUSR1, file=trace_fd, all_threads=True)

    from harness.isolation import protocol
    from harness.isolation.channel import Channel

    channel = Channel(read_fd, write_fd)
    try:
        hello = channel.recv()
    except EOFError:  # a spare child that was never used
        return 0
    began = time.monotonic()
    startup: dict[str, float] = {}

    def mark(phase: str) -> None:
        startup[phase] = round(time.monotonic() - began - sum(startup.values()), 4)

    sys.path[:] = list(dict.fromkeys(hello.sys_path + sys.path))
    if hello.environ is not None:  # a forked child has the environment of its fork, not of the parent's Hello
        os.environ.clear()
        os.environ.update(hello.environ)
    try:
        from harness import backend

        # The device context is created on a side thread while this one imports and loads the provider: the driver
        # creates contexts one at a time, and a context first made in the first item would be that item's time.
        context = backend.create_cuda_context_in_background() if hello.device == "cuda" else None
        device = backend.configure(hello.device)
        from harness import timeline

        timeline.install_compile_ledger()
        if hello.torch_threads:
            import torch

            torch.set_num_threads(hello.torch_threads)
        mark("configure")
        from harness.checks import load_provider
        from harness.checks.providers import provider_name
        from harness.isolation.worker import Worker

        provider = load_provider(hello.provider_spec)
        mark("provider")
        if context is not None:
            context.join()
            mark("device_context")
        _say_context_made(context_made_fd)
    except BaseException as exc:  # noqa: BLE001 - the supervisor reports it as an unusable provider
        from harness.checks.providers import ProviderError

        channel.send(protocol.Unusable(str(exc) if isinstance(exc, ProviderError) else _one_line(exc)))
        return 0
    worker = Worker(provider, device, hello.provider_spec, interrupts_are_errors=True,
                    warmup_first=hello.warmup_first)
    channel.send(protocol.Ready(os.getpid(), device, provider_name(provider), startup))
    return serve(channel, worker)


if __name__ == "__main__":
    code = main()
    _flush()
    os._exit(code)  # without torch's and CUDA's teardown, which a closing supervisor does not wait for
