"""The ports tfl picks for the tasks it places itself (``--local N``): free on every address of
the machine, and above the kernel's ephemeral range, from which anything may take them."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from launcher.describe import ports
from launcher.describe.spec import local_cluster


def test_a_port_held_on_another_loopback_address_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's failure: an sshd held 127.0.0.2:P, the pick checked 127.0.0.1 only and chose P, and
    the task's server (which binds every address) could not have it."""
    with socket.socket() as held, socket.socket() as free:
        held.bind(("127.0.0.2", 0))
        free.bind(("127.0.0.1", 0))
        taken, other = held.getsockname()[1], free.getsockname()[1]
        free.close()
        monkeypatch.setattr(ports, "_ephemeral_end", lambda: 1024)
        monkeypatch.setattr(ports.random, "sample", lambda population, k: [taken, other])
        assert ports.free_ports(1) == [other]


def test_ports_come_from_above_the_ephemeral_range_distinct_and_free_everywhere() -> None:
    """Above it: neither an outgoing connection nor tfl's Slurm engine (10000-32767) takes them."""
    last = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[1])
    picked = ports.free_ports(8)
    assert len(set(picked)) == 8
    assert all(last < p <= 65535 and not 10000 <= p < 32768 for p in picked), (picked, last)
    for port in picked:
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", port))


def test_local_clusters_use_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports.random, "sample", lambda population, k: [p for p in population if p % 7 == 3][:k])
    spec = local_cluster(2, evaluator=True)
    addresses = [*spec.cluster.chief, *spec.cluster.worker, *spec.cluster.evaluator]
    assert all(int(a.rsplit(":", 1)[1]) % 7 == 3 for a in addresses), addresses


def test_a_machine_whose_ephemeral_range_starts_low_falls_back_to_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_ephemeral_end", lambda: 65000)
    picked = ports.free_ports(3)
    assert len(set(picked)) == 3 and all(p >= 1024 for p in picked)
