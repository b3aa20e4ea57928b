"""The ports tfl picks for the tasks it places itself (``--local N``): distinct, and free on
every address of the machine, which is how a task's TensorFlow server binds them."""

from __future__ import annotations

import resource
import socket
import subprocess
import sys

import pytest

from launcher.describe import ports
from launcher.describe.spec import local_cluster


def test_a_port_held_on_another_loopback_address_is_not_free() -> None:
    """CI's failure: an sshd held 127.0.0.2:P, the pick checked 127.0.0.1 only and chose P, and
    the task's server (which binds every address) could not have it."""
    with socket.socket() as held:
        held.bind(("127.0.0.2", 0))
        held.listen()
        taken = held.getsockname()[1]
        with socket.socket() as narrow:  # the old check: 127.0.0.1 alone says it is free
            narrow.bind(("127.0.0.1", taken))
        assert not ports.free_everywhere(taken)
    assert ports.free_everywhere(taken)


def test_ports_are_distinct_and_free_everywhere() -> None:
    picked = ports.free_ports(8)
    assert len(set(picked)) == 8
    assert all(ports.free_everywhere(port) for port in picked), picked


def test_a_port_whose_ipv6_side_is_held_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    refused: list[int] = []

    def ipv6_free(port: int) -> bool:
        if not refused:
            refused.append(port)
            return False
        return True

    monkeypatch.setattr(ports, "_ipv6_free", ipv6_free)
    picked = ports.free_ports(2)
    assert len(refused) == 1 and refused[0] not in picked and len(set(picked)) == 2


def test_local_clusters_use_them(monkeypatch: pytest.MonkeyPatch) -> None:
    given = iter([[40001, 40002, 40003]])
    monkeypatch.setattr("launcher.describe.spec.free_ports", lambda count: next(given)[:count])
    spec = local_cluster(2, evaluator=True)
    assert [*spec.cluster.chief, *spec.cluster.worker, *spec.cluster.evaluator] == [
        "127.0.0.1:40001", "127.0.0.1:40002", "127.0.0.1:40003"]


def _tfl_under_limit(args: list[str], env: dict[str, str], open_files: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        if open_files is not None:  # soft and hard: the CLI's own raise to the hard limit cannot undo it
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True,
                          timeout=120, preexec_fn=limit)


@pytest.mark.parametrize("command", [["launch", "job.py", "--dry-run"], ["export", "k8s", "job.py", "--image", "i", "--name", "n"]])
def test_more_local_tasks_than_ports_is_one_line(command: list[str], child_env: dict[str, str]) -> None:
    """`--local 100000` was a traceback (EMFILE from the port picker), and with a high enough
    limit a search of millions of binds for ports that cannot exist."""
    done = _tfl_under_limit([*command, "--local", "100000"], child_env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("tfl: error: --local 100000: 100000 tasks need 100000 ports") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_local_tasks_beyond_the_open_files_limit_name_the_limit(child_env: dict[str, str]) -> None:
    done = _tfl_under_limit(["launch", "job.py", "--dry-run", "--local", "300"], child_env, open_files=200)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("tfl: error: tfl ran out of file descriptors while holding 300 free ports for --local 300")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
