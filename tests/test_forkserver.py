"""The fork server (``harness.isolation.forkserver``): a supervisor's fresh children are forked from one process
that imported torch once; they run where a spawned child would (the supervisor's working directory, standard output
and error at that moment), report their end like a spawned child, die with the server, and where the server cannot
fork (a refusal, a server that ended) the supervisor spawns and says why."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time

import pytest

from harness.cases.loader import load_case_file
from harness.checks import Status
from harness.isolation import Supervisor, forking, forkserver
from tests import broken_providers as bp
from tests import faulty_providers as fp

pytestmark = pytest.mark.usefixtures("children_with_one_hardware_queue")  # tests/conftest.py says why


@pytest.fixture
def cases(tmp_path) -> dict:
    path = tmp_path / "tiny.yaml"
    path.write_text(bp.TINY_CASES)
    return {c.id: c for c in load_case_file(path)}


def _ends(pid: int, seconds: float = 10.0) -> bool:
    """Whether ``pid`` is gone, or a zombie (its new parent, outside this test's control, may not reap it), within
    ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_server_child_runs_in_the_supervisors_directory_and_writes_to_its_output(cases, device, capfd, tmp_path,
                                                                                   monkeypatch):
    case = cases[fp.FAULTING_CASE]
    monkeypatch.chdir(tmp_path)
    with Supervisor("tests.faulty_providers:reports_where", device) as sup:
        result = sup.run(case, "determinism")
        starts = sup.describe()["starts"]
    assert [s["how"] for s in starts] == ["fork server"], starts
    assert result.status is Status.ERROR and f"cwd={tmp_path}" in result.message, result.message
    out, err = capfd.readouterr()
    assert "reports_where: standard output" in out and "reports_where: standard error" in err, (out, err)


def test_a_server_that_ended_takes_its_children_with_it_and_is_started_again(cases, device):
    with Supervisor("reference:provider", device) as sup:
        assert sup.run(cases["tiny-direct"], "determinism").status is Status.PASSED
        server = forkserver._server
        child = sup._proc.pid
        os.kill(server.proc.pid, signal.SIGKILL)
        assert sup._proc.wait(30) == -signal.SIGKILL  # the parent-death signal, or the status lost with the server
        assert _ends(child), f"child {child} still runs after its server was killed"
        after = sup.run(cases["tiny-returned"], "determinism")
        starts = [s["how"] for s in sup.describe()["starts"]]
    assert after.status is Status.PASSED, after.message
    assert [(r.item, r.cause) for r in sup.restarts] == [
        ("between items", "the process running the provider died: SIGKILL (signal 9)")]
    assert starts == ["fork server", "fork server"] and forkserver._server is not server


def test_where_the_server_cannot_fork_the_supervisor_spawns_and_says_why(cases, device, monkeypatch):
    monkeypatch.setattr(forkserver, "fork", lambda *args, **kwargs: (None, "not here"))
    with Supervisor("reference:provider", device) as sup:
        result = sup.run(cases["tiny-direct"], "determinism")
        starts = sup.describe()["starts"]
    assert result.status is Status.PASSED, result.message
    assert [s["how"] for s in starts] == ["spawn (no fork server: not here)"], starts


def _serve_in_thread(monkeypatch, hazard: str):
    """``serve`` on one end of a socket pair in a thread of this process (``fork_hazard`` answering ``hazard``, so
    that nothing forks here); the other end, and the thread."""
    monkeypatch.setattr(forking, "fork_hazard", lambda code_ran_before=False: hazard)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    thread = threading.Thread(target=forkserver.serve, args=(theirs, lambda *fds: 0), daemon=True)
    thread.start()
    return ours, theirs, thread


def test_the_server_refuses_a_fork_it_cannot_make_safely_and_a_malformed_request(monkeypatch):
    ours, theirs, thread = _serve_in_thread(monkeypatch, "the CUDA driver is initialized in this process")
    with tempfile.TemporaryFile() as trace:
        r, w = os.pipe()
        try:
            socket.send_fds(ours, [b'F{"cwd": "/"}'], [r, w, trace.fileno(), 1, 2])
            assert ours.recv(4096) == b"Rthe CUDA driver is initialized in this process"
            socket.send_fds(ours, [b"F{}"], [r, w])
            assert ours.recv(4096) == b"Rmalformed request (2 descriptors)"
        finally:
            os.close(r)
            os.close(w)
    ours.close()  # the supervising process gone: the server returns
    thread.join(10)
    assert not thread.is_alive()
    theirs.close()


def test_a_refusal_reaches_the_supervisor_as_a_reason_to_spawn(monkeypatch):
    """The owner's end (``ForkServer.fork``) turns the server's refusal into the reason the supervisor records."""
    ours, theirs, thread = _serve_in_thread(monkeypatch, "a reason")
    server = forkserver.ForkServer(ours, proc=None)
    with tempfile.TemporaryFile() as trace:
        r, w = os.pipe()
        try:
            with pytest.raises(RuntimeError, match="^a reason$"):
                server.fork(r, w, trace.fileno(), timeout=10)
        finally:
            os.close(r)
            os.close(w)
    ours.close()
    thread.join(10)
    theirs.close()
