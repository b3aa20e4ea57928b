"""The network test bed itself: hosts that answer over SSH, a cut that isolates one host while
its processes run on, a join that brings it back, a power-off that leaves nothing running."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests import netbed_limits
from tests.netbed import NetBed, make_netbed, netbed_available


def ssh(bed: NetBed, host: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={bed.known_hosts}",
                           "-o", "ConnectTimeout=3", "-i", str(bed.client_key), f"root@{host}", command],
                          capture_output=True, text=True, timeout=timeout)


def reachable(address: str) -> bool:
    try:
        socket.create_connection((address, 22), timeout=2).close()
        return True
    except OSError:
        return False


def test_each_host_has_its_own_network_sshd_and_home_and_a_cut_host_keeps_running(netbed: NetBed) -> None:
    h1, h2, h3 = netbed.addresses
    answer = ssh(netbed, h2, "ip -4 -o addr show dev eth0; echo HOME=$HOME; sleep 600 >/dev/null 2>&1 & echo $!")
    assert answer.returncode == 0, answer.stderr
    assert f"inet {h2}/27" in answer.stdout and f"HOME={netbed.host(h2).home}" in answer.stdout
    sleeper = int(answer.stdout.split()[-1])
    assert sleeper in netbed.pids(netbed.host(h2)) and sleeper not in netbed.pids(netbed.host(h1))
    routes = subprocess.run(["ip", "netns", "exec", netbed.host(h2).netns, "ip", "route"], capture_output=True, text=True).stdout
    assert "default" not in routes  # the range goes nowhere beyond the bridge
    netbed.cut(h2)
    assert not reachable(h2) and reachable(h1) and reachable(h3)
    assert sleeper in netbed.pids(netbed.host(h2))  # a partition, not a crash
    netbed.join(h2)
    deadline = time.monotonic() + 10
    while not reachable(h2) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ssh(netbed, h2, "true").returncode == 0
    netbed.power_off(h2)
    assert netbed.pids(netbed.host(h2)) == [] and not reachable(h2)


def test_an_unknown_host_key_is_refused(netbed: NetBed) -> None:
    assert netbed.known_hosts is not None
    netbed.known_hosts.write_text("")
    assert ssh(netbed, netbed.addresses[0], "true").returncode == 255


def test_two_beds_at_once_take_blocks_of_their_own_and_teardown_leaves_nothing(netbed: NetBed, tmp_path: Path) -> None:
    first = make_netbed(tmp_path / "a", count=1)
    try:
        second = make_netbed(tmp_path / "b", count=1)
        try:
            assert first.gateway != second.gateway and first.addresses != second.addresses
            assert reachable(first.addresses[0]) and reachable(second.addresses[0])
        finally:
            second.teardown()
    finally:
        first.teardown()
    assert first.leftovers() == second.leftovers() == []


def test_a_large_bed_takes_a_22_of_the_benchmarking_range_and_its_neighbour_limits_come_back(tmp_path: Path) -> None:
    if why := netbed_available():
        pytest.skip(why)
    before = netbed_limits.current()
    bed = make_netbed(tmp_path / "large", count=30)  # one past a small bed: the smallest large one
    try:
        assert bed.prefix == 22 and all(a.startswith("198.1") for a in bed.addresses)
        assert ipaddress.IPv4Address(bed.addresses[-1]) in ipaddress.IPv4Network("198.18.0.0/15")
        raised = netbed_limits.current()
        assert all(raised[k] >= before[k] for k in raised) and raised["gc_thresh1"] >= 30 + 128
        assert netbed_limits.holds(bed.token)
        assert reachable(bed.addresses[0]) and reachable(bed.addresses[-1])
        assert ssh(bed, bed.addresses[-1], "ip -4 -o addr show dev eth0").stdout.count(f"{bed.addresses[-1]}/22") == 1
        assert len(bed.all_pids()) == 30  # an sshd in every namespace
    finally:
        bed.teardown()
    assert bed.leftovers() == [] and bed.all_pids() == {}
    if not netbed_limits.STATE.exists():  # no other large bed on this machine right now
        assert netbed_limits.current() == before
