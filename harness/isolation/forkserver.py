"""A fork server: the supervisor's fresh children forked from one process that imported torch once, instead of each
spawned as a new interpreter that imports torch again.

A spawned child spends most of its start-up importing torch (about 1.5 s of CPU on an idle host, more beside busy
test workers); a replaced child (after a crash, a hang, a sticky device error) pays it again each time. The server is
spawned once per supervising process (``fork``, lazily) with the environment a spawned child would get; it imports
torch and nothing that touches a device, then waits on a Unix socket. For each request it forks a child exactly as
``forking.fork_child`` forks a spare (its own session, signals reset, only its descriptors kept) that runs
``harness.isolation.child.run``; the child then configures itself from ``Hello`` like a spare does (``sys.path``, the
environment, torch's thread count). What a spawned child would inherit from the supervisor at that moment comes with
the request: its pipes and trace file, its standard output and error, its working directory.

The server is safe to fork from for the reasons a spare's parent is (``harness.isolation.forking``): it never makes
a device context and never runs a torch op. It checks ``fork_hazard`` before every fork and refuses with the reason
where a fork would not be safe; the supervisor then spawns, and its start record says why.

The child is the server's, not the supervisor's: the server reaps it and sends its exit status, which
``ServerChild`` (``subprocess.Popen``'s interface, as the supervisor uses it) returns. The child's process id is
real, so the supervisor signals it and its process group as it would a spawned child. The server dies with the
supervising process (the kernel's parent-death signal, and the end of its socket), and its children with it: where
the server ends before a child's status was sent, the child was killed with it (SIGKILL, the parent-death signal
``harness.isolation.child`` sets), and that is the status reported.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

from harness.isolation import forking

SERVER_START_SECONDS = 120.0  # for the server to import torch and answer its first request, as a child's start
REQUEST_FDS = 5  # the child's request pipe, reply pipe, trace file, standard output, standard error
_POLL_SECONDS = 0.05  # the server's reaping interval where pidfds are not available
_KILLED_WITH_SERVER = -signal.SIGKILL


class ServerGone(OSError):
    """The server ended or stopped answering."""


class ForkServer:
    """The supervising process's end of one server (``fork`` starts and keeps it)."""

    def __init__(self, sock: socket.socket, proc: subprocess.Popen | None):
        self.sock, self.proc = sock, proc  # proc: None where the server is not a process of ours (tests)
        self.owner = os.getpid()
        self.gone = ""  # why the server cannot serve any more ("" while it can)
        self._answers: deque = deque()  # replies to fork requests, in request order: ("pid", n) or ("refused", why)
        self._exits: dict[int, int] = {}  # child pid -> exit status, as the server reaped them
        self._lock = threading.Lock()

    @classmethod
    def start(cls, environ: dict[str, str]) -> ForkServer:
        """Spawn a server with ``environ`` (it answers once it has imported torch)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "harness.isolation.forkserver", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=environ, start_new_session=True)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(ours, proc)

    def fork(self, request_r: int, reply_w: int, trace_fd: int, timeout: float) -> int:
        """A child forked by the server on these descriptors: its pid. Raises ServerGone, or RuntimeError with the
        server's reason where it refuses to fork."""
        with self._lock:
            if self.gone:
                raise ServerGone(self.gone)
            message = json.dumps({"cwd": os.getcwd()}).encode()
            try:
                socket.send_fds(self.sock, [b"F" + message], [request_r, reply_w, trace_fd, 1, 2])
            except OSError as exc:
                self._lose(f"the fork server's socket failed: {exc}")
                raise ServerGone(self.gone) from None
            end = time.monotonic() + timeout
            while not self._answers:
                if not self._pump(end - time.monotonic()):
                    if not self.gone:
                        self._lose(f"the fork server did not answer within {timeout:g} s")
                        self.stop()
                    raise ServerGone(self.gone)
            kind, value = self._answers.popleft()
        if kind == "refused":
            raise RuntimeError(value)
        return value

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit status once the server has reaped it, waiting at most ``timeout`` (None: until then); None
        while it runs. Given once per pid."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while pid not in self._exits:
                if self.gone:
                    return _KILLED_WITH_SERVER
                remaining = None if end is None else end - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._pump(remaining)
            return self._exits.pop(pid)  # asked for once: ``ServerChild`` keeps it as its returncode

    def _pump(self, timeout: float | None) -> bool:
        """Read one message from the server within ``timeout`` (None: no limit); False when none came."""
        wait = None if timeout is None else max(timeout, 0.0)
        if not select.select([self.sock], [], [], wait)[0]:
            return False
        try:
            data = self.sock.recv(4096)
        except OSError:
            data = b""
        if not data:
            self._lose("the fork server ended")
            return False
        kind, body = data[:1], data[1:].decode()
        if kind == b"P":
            self._answers.append(("pid", int(body)))
        elif kind == b"R":
            self._answers.append(("refused", body))
        elif kind == b"X":
            pid, status = body.split()
            self._exits[int(pid)] = int(status)
        return True

    def _lose(self, why: str) -> None:
        self.gone = why
        if self.proc is not None:
            self.proc.poll()  # reaped if it ended: no zombie left behind

    def stop(self) -> None:
        """End the server (its children die with it)."""
        self.sock.close()
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()


class ServerChild:
    """A child the server forked, with the part of ``subprocess.Popen``'s interface the supervisor uses."""

    def __init__(self, pid: int, server: ForkServer):
        self.pid, self.server = pid, server
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_status(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_status(self.pid, timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(f"fork server child {self.pid}", timeout)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


_server: ForkServer | None = None
_server_lock = threading.Lock()


def fork(request_r: int, reply_w: int, trace_fd: int, environ: dict[str, str],
         timeout: float = SERVER_START_SECONDS) -> tuple[ServerChild | None, str]:
    """(a child forked by this process's server on these descriptors, "") or (None, why not). The server is started
    at the first call, with ``environ``, and again after it ended."""
    global _server
    with _server_lock:
        if _server is None or _server.owner != os.getpid() or _server.gone:
            if _server is not None and _server.owner == os.getpid():
                _server.stop()
            try:
                _server = ForkServer.start(environ)
            except OSError as exc:
                _server = None
                return None, f"the fork server could not start: {exc}"
        server = _server
    try:
        return ServerChild(server.fork(request_r, reply_w, trace_fd, timeout), server), ""
    except ServerGone as exc:
        return None, str(exc)
    except RuntimeError as exc:
        return None, f"the fork server refused: {exc}"


# ---------------------------------------------------------------- the server's side


def serve(sock: socket.socket, run_child) -> None:
    """Fork a child for each request until the socket ends; send each child's pid, then its exit status.
    ``run_child(request_r, reply_w, trace_fd)`` is the child's life (its return value its exit status)."""
    children: dict[int, int | None] = {}  # pid -> its pidfd (None where pidfds are not available)
    while True:
        watched = [sock] + [fd for fd in children.values() if fd is not None]
        polling = any(fd is None for fd in children.values())
        readable = select.select(watched, [], [], _POLL_SECONDS if polling else None)[0]
        if sock in readable:
            try:
                data, fds, _, _ = socket.recv_fds(sock, 65536, REQUEST_FDS)
            except OSError:
                data, fds = b"", []
            if not data:
                return
            try:
                pid = _fork_one(sock, data, fds, run_child)
            except OSError:  # the supervising process is gone: its children die with this process
                return
            if pid is not None:
                children[pid] = _pidfd(pid)
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                fd = children.pop(pid)
                if fd is not None:
                    os.close(fd)
                try:
                    sock.send(f"X{pid} {os.waitstatus_to_exitcode(status)}".encode())
                except OSError:
                    return


def _fork_one(sock: socket.socket, data: bytes, fds: list[int], run_child) -> int | None:
    try:
        if data[:1] != b"F" or len(fds) != REQUEST_FDS:
            sock.send(f"Rmalformed request ({len(fds)} descriptors)".encode())
            return None
        hazard = forking.fork_hazard()
        if hazard:
            sock.send(f"R{hazard}".encode())
            return None
        cwd = json.loads(data[1:])["cwd"]
        request_r, reply_w, trace_fd, out_fd, err_fd = fds

        def life() -> int:
            os.dup2(out_fd, 1)
            os.dup2(err_fd, 2)
            for fd in (out_fd, err_fd):
                if fd > 2:
                    os.close(fd)
            os.chdir(cwd)
            return run_child(request_r, reply_w, trace_fd)

        try:
            proc = forking.fork_child(life, keep_fds=tuple(fds))
        except OSError as exc:
            sock.send(f"Rfork failed: {exc}".encode())
            return None
        sock.send(f"P{proc.pid}".encode())
        return proc.pid
    finally:
        for fd in fds:
            os.close(fd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def main(argv: list[str]) -> int:
    sock_fd, owner_pid = int(argv[0]), int(argv[1])
    from harness.isolation.child import exit_with_parent

    exit_with_parent(owner_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the supervisor's to handle
    import torch  # noqa: F401 - imported once here, for every child forked from this process

    from harness.isolation import child

    sock = socket.socket(fileno=sock_fd)
    server_pid = os.getpid()
    serve(sock, lambda request_r, reply_w, trace_fd: child.run(request_r, reply_w, trace_fd, server_pid))
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
