"""The network test bed itself: hosts that answer over SSH, a cut that isolates one host while
its processes run on, a join that brings it back, a power-off that leaves nothing running."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.netbed import NetBed, make_netbed


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
