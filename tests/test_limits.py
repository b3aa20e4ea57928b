"""The launcher's own limits (issue 29): the soft open-files limit raised to the hard one at
start, and an error of the launcher's own (EMFILE, ENFILE, ENOBUFS, ENOMEM) never taken for a
host that is down or refuses SSH."""

from __future__ import annotations

import errno
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from launcher.describe.hosts import SSHTarget
from launcher.engines.parallel import first_error
from launcher.engines.ssh import pool as pool_module
from launcher.engines.ssh.failures import SSHError
from launcher.engines.ssh.watch import SILENT_AFTER, HostWatch, reachable
from launcher.errors import LaunchError, ResourceLimitError
from launcher.limits import limit_error, own_fault
from tests.test_host_watch import FakeTask


def out_of_fds(*args: Any, **kwargs: Any) -> Any:
    raise OSError(errno.EMFILE, "Too many open files")


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) missing")
def test_the_cli_raises_the_soft_limit_to_the_hard_one() -> None:
    code = "import resource, launcher.cli as c; c.app = lambda **k: print(resource.getrlimit(resource.RLIMIT_NOFILE)[0]); c.main()"
    done = subprocess.run(["prlimit", "--nofile=50:3000", sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["3000"], done.stderr


def test_own_fault_is_found_behind_the_error_a_connection_became() -> None:
    try:
        try:
            out_of_fds()
        except OSError:
            raise SSHError("h1", "ssh to u@h1:22 failed: OSError: [Errno 24] Too many open files") from None
    except SSHError as exc:
        fault = own_fault(exc)
    assert fault is not None and fault.errno == errno.EMFILE
    assert own_fault(SSHError("h1", "connection refused on port 22")) is None
    assert own_fault(ConnectionRefusedError(errno.ECONNREFUSED, "refused")) is None
    for number in (errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
        assert own_fault(OSError(number, "x")) is not None
    line = str(limit_error(OSError(errno.EMFILE, "Too many open files"), "connecting to the hosts"))
    assert "\n" not in line and "ulimit -n" in line and "RLIMIT_NOFILE" in line and "no host is at fault" in line


def test_a_connection_without_descriptors_blames_the_launcher_not_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real connect (paramiko) meets EMFILE making its socket: a ResourceLimitError naming no host."""
    import fabric  # noqa: F401  (imported before socket.socket is replaced: ssl subclasses it)
    import paramiko  # noqa: F401

    monkeypatch.setattr(socket, "socket", out_of_fds)
    target = SSHTarget(host="127.0.0.9", port=22, user="u", identity_file=None, connect_timeout=2.0, known_hosts="/nonexistent")
    with pytest.raises(ResourceLimitError) as caught:
        pool_module.HostPool().get(target)
    assert "127.0.0.9" not in str(caught.value) and "file descriptors" in str(caught.value)


def test_of_many_hosts_failing_the_launchers_own_limit_is_what_is_said() -> None:
    own = limit_error(OSError(errno.EMFILE, "Too many open files"), "connecting to the hosts")
    with pytest.raises(ResourceLimitError) as caught:
        first_error([SSHError("h1", "no answer on port 22"), own, SSHError("h3", "x")])
    assert caught.value is own
    with pytest.raises(LaunchError, match="and 1 more host"):
        first_error([SSHError("h1", "no answer"), SSHError("h2", "no answer")])


def test_the_probe_out_of_descriptors_raises_rather_than_saying_down(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "create_connection", out_of_fds)
    with pytest.raises(ResourceLimitError, match="file descriptors"):
        reachable("127.0.0.9", 22, timeout=1.0)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(TimeoutError("timed out")))
    assert reachable("127.0.0.9", 22, timeout=1.0) is False  # a silent host is down, as before


def test_a_watch_whose_probe_meets_the_launchers_limit_loses_no_host_and_says_so_once() -> None:
    now = [100.0]
    said: list[str] = []
    woken = threading.Event()

    def probe(host: str, port: int) -> bool:
        raise limit_error(OSError(errno.EMFILE, "Too many open files"), "watching the hosts")

    watch = HostWatch(woken.set, probe=probe, clock=lambda: now[0], wall=lambda: 5000.0, say=said.append)
    task = FakeTask("b", 90.0, 4990.0)
    for _ in range(3):
        now[0] += SILENT_AFTER + 1
        watch.check([task])
        for thread in [t for t in threading.enumerate() if t.name.startswith("probe-")]:
            thread.join(5)
    watch.confirm(task)  # its connection ended: still not a lost host for our own limit
    assert task.lost == [] and watch.lost("b") is None
    assert len(said) == 1 and "file descriptors" in said[0] and "b" not in said[0].split("ulimit")[0].split()
    assert watch.fault is not None and time.time() > 0


def test_status_out_of_descriptors_says_so_rather_than_calling_hosts_unreachable(tmp_path: Any,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.engines.ssh import recorded
    from launcher.records.states import TaskState
    from launcher.supervise.recording import initial_record
    from tests.test_record_size import ssh_plan

    record = initial_record(ssh_plan(tmp_path, 3), 1.0, 0, "ssh")
    for pid, task in enumerate(record.tasks, 1000):
        task.state, task.pid = TaskState.RUNNING, pid

    def connect(target: SSHTarget, **how: Any) -> Any:
        try:
            out_of_fds()
        except OSError:
            raise SSHError(target.host, "ssh failed: OSError: [Errno 24] Too many open files") from None

    monkeypatch.setattr(recorded, "connect", connect)
    with pytest.raises(ResourceLimitError, match="file descriptors while asking the hosts"):
        recorded.inspect(record, ask=True)
    monkeypatch.setattr(recorded, "connect", lambda target, **how: (_ for _ in ()).throw(SSHError(target.host, "no answer")))
    assert {live.state for live in recorded.inspect(record, ask=True).values()} == {"unreachable"}  # a real silence
