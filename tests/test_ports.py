"""The ports tfl picks for the tasks it places itself (``--local N``): distinct, and free on
every address of the machine, which is how a task's TensorFlow server binds them."""

from __future__ import annotations

import socket

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
