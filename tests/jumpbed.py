"""A test bed of hosts reachable only through a bastion (jump host), all in namespaces of its own.

```
 launcher ns L  ──veth──  bastion ns B (sshd on 198.51.100.2, sshd's default MaxStartups)
 198.51.100.1/30          198.51.100.2/30 · bridge br0 198.18.0.1/16
 198.18.0.0/16: blackhole     │
                              ├── h1 198.18.0.2  (sshd :22)
                              ├── h2 198.18.0.3  (sshd :22) …
```

The launcher (``tfl``, run with ``bed.launcher_argv``) lives in a network namespace of its own
whose only link goes to the bastion, and whose route to the hosts' range is a blackhole: it
cannot send them anything straight, so only what goes through the bastion reaches them. Nothing of the bed is in this machine's own network namespace: its
addresses collide with no other bed's, and no packet leaves it. The hosts sit on a bridge inside
the bastion's namespace; ``cut(host)`` takes a host's link down there (its processes run on).

``teardown()`` kills the sshds and every process of the bed's namespaces by pid, and deletes the
namespaces (their links and the bridge go with them); ``leftovers()`` proves it. Needs root and
``ip netns`` (``tests.netbed.netbed_available``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.netbed import Host, _ip, _kill, _running, netbed_available  # a Host here: its link is on the bastion's bridge
from tests.sshd import Sshd, start_sshd

LAUNCHER_ADDRESS, BASTION_ADDRESS = "198.51.100.1", "198.51.100.2"
HOSTS_NET = "198.18.0.0/16"  # private to the bed's namespaces


def host_address(index: int) -> str:
    """The ``index``-th host's address (1, 2, …): 198.18.0.2, 198.18.0.3, …"""
    return f"198.18.{(index + 1) // 256}.{(index + 1) % 256}"


@dataclass
class JumpBed:
    token: str
    dir: Path
    launcher_ns: str
    bastion_ns: str
    bastion: Sshd | None = None
    hosts: list[Host] = field(default_factory=list)
    known_hosts: Path | None = None
    client_key: Path | None = None

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]

    def host(self, address: str) -> Host:
        return next(h for h in self.hosts if h.address == address)

    def launcher_argv(self, *args: str) -> list[str]:
        """``python -m launcher ARGS`` in the launcher's namespace."""
        return ["ip", "netns", "exec", self.launcher_ns, sys.executable, "-m", "launcher", *args]

    def cluster_file(self, path: Path, tasks: dict[str, list[str]], python: str | Path, **extra: Any) -> Path:
        ssh = {"user": "root", "identity_file": str(self.client_key), "known_hosts": str(self.known_hosts),
               "connect_timeout": 10, **extra.pop("ssh", {})}
        hosts = {h: {"python": str(python)} for h in self.addresses}
        path.write_text(json.dumps({"cluster": tasks, "ssh": ssh, "hosts": hosts, **extra}, indent=1))
        return path

    def pids(self, netns: str) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", netns, check=False).stdout.split()]

    def cut(self, address: str) -> float:
        _ip("-n", self.bastion_ns, "link", "set", "dev", self.host(address).link, "down")
        return time.time()

    def join(self, address: str) -> None:
        _ip("-n", self.bastion_ns, "link", "set", "dev", self.host(address).link, "up")

    def namespaces(self) -> list[str]:
        return [self.launcher_ns, self.bastion_ns, *(h.netns for h in self.hosts)]

    def sshds(self) -> list[Sshd]:
        return [s for s in (self.bastion, *(h.sshd for h in self.hosts)) if s is not None]

    def teardown(self) -> None:
        """Everything of the bed, by pid and name; idempotent, and tolerant of a half-made bed."""
        for server in self.sshds():
            _kill(server.proc.pid)
            try:
                server.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        for netns in self.namespaces():
            if _ip("netns", "pids", netns, check=False).returncode != 0:
                continue
            for _ in range(50):
                pids = self.pids(netns)
                if not pids:
                    break
                for pid in pids:
                    _kill(pid)
                time.sleep(0.05)
            _ip("netns", "del", netns, check=False)

    def leftovers(self) -> list[str]:
        left = [n for n in _ip("netns", "list").stdout.split() if self.token in n]
        left += [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", "show").stdout.splitlines()
                 if self.token in line]
        left += [f"sshd pid {s.proc.pid}" for s in self.sshds() if _running(s.proc.pid)]
        return left


def make_jumpbed(directory: Path, count: int = 4) -> JumpBed:
    """A bastion and ``count`` hosts behind it, each with its sshd listening; torn down again if a step fails."""
    token = os.urandom(3).hex()
    directory.mkdir(parents=True, exist_ok=True)
    bed = JumpBed(token, directory, launcher_ns=f"tfl-{token}-L", bastion_ns=f"tfl-{token}-B")
    try:
        _make_network(bed, count)
        _start_sshds(bed)
    except BaseException:
        bed.teardown()
        raise
    return bed


def _make_network(bed: JumpBed, count: int) -> None:
    L, B, t = bed.launcher_ns, bed.bastion_ns, bed.token
    root = [f"netns add {L}", f"netns add {B}", f"link add tl{t}a netns {L} type veth peer name tl{t}b netns {B}"]
    inside: dict[str, list[str]] = {
        L: [f"link set tl{t}a name eth0", f"addr add {LAUNCHER_ADDRESS}/30 dev eth0", "link set lo up",
            "link set eth0 up", f"route add blackhole {HOSTS_NET}"],  # straight to a host: nothing goes out
        B: [f"link set tl{t}b name eth0", f"addr add {BASTION_ADDRESS}/30 dev eth0", "link add br0 type bridge",
            "addr add 198.18.0.1/16 dev br0", "link set lo up", "link set eth0 up", "link set br0 up"],
    }
    for i in range(1, count + 1):
        host = Host(f"h{i}", host_address(i), netns=f"tfl-{t}-h{i}", link=f"tv{t}h{i}")
        bed.hosts.append(host)
        root += [f"netns add {host.netns}", f"link add {host.link} netns {B} type veth peer name tp{t}h{i} netns {host.netns}"]
        inside[B] += [f"link set {host.link} master br0", f"link set {host.link} up"]
        inside[host.netns] = [f"link set tp{t}h{i} name eth0", f"addr add {host.address}/16 dev eth0",
                              "link set eth0 up", "link set lo up"]
    _batch([], root)
    for netns, commands in inside.items():
        _batch(["-n", netns], commands)
    # the bastion forwards no packet: only its sshd's channels reach the hosts
    subprocess.run(["ip", "netns", "exec", B, "sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward"], check=True)


def _batch(options: list[str], commands: list[str]) -> None:
    done = subprocess.run(["ip", *options, "-batch", "-"], input="\n".join(commands) + "\n", capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(options)} -batch: {done.stderr.strip()}")


def _start_sshds(bed: JumpBed) -> None:
    # The bastion keeps sshd's default MaxStartups (10:30:100): tfl must not open a connection per host there.
    bed.bastion = start_sshd(bed.dir / "bastion", hosts=(BASTION_ADDRESS,), netns=bed.bastion_ns, port=22,
                             max_startups=None, wait=False)
    for host in bed.hosts:
        host.sshd = start_sshd(bed.dir / host.name, hosts=(host.address,), keys_from=bed.bastion, netns=host.netns,
                               port=22, wait=False)
    deadline = time.monotonic() + 60
    for server in bed.sshds():  # this namespace reaches none of them: their logs say when they listen
        while "Server listening on" not in server.log():
            if server.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd in the jump bed did not start: {server.log()}")
            time.sleep(0.05)
    bed.known_hosts, bed.client_key = bed.dir / "known_hosts", bed.bastion.client_key
    bed.bastion.known_hosts_for((BASTION_ADDRESS, *bed.addresses), bed.known_hosts)


def jumpbed_fixture(count: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JumpBed]:
    why = netbed_available()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI runs as root with iproute2 and openssh-server (see .ci/run)")
        pytest.skip(why)
    bed = make_jumpbed(tmp_path_factory.mktemp("jumpbed"), count)
    try:
        yield bed
    finally:
        bed.teardown()
    assert bed.leftovers() == [], f"the jump bed left {bed.leftovers()}"

