"""A test bed of hosts with networks of their own: a host can be cut off, joined, powered off.

Each host is a Linux network namespace with one veth link to a private bridge in the root
namespace, an address of its own in 198.51.100.0/24 (a documentation range, never routed
anywhere: no default route, no forwarding), ``lo`` up, and an sshd of its own listening on
its address at port 22, with the bed's host key (checked: the bed writes a known_hosts) and
a HOME of its own. The launcher (the test, tfl) runs in the root namespace and reaches the
hosts over the bridge, whose address is the first of the bed's block.

Several test sessions may run at once on one machine: every name (bridge, links,
namespaces) carries a token unique to the bed, and each bed takes a free /27 block of the
range (under a lock in /run/lock), so their routes never overlap.

A large bed (more than 29 hosts: the bench, one slow test; up to 1,021 hosts) takes a free /22
block of 198.18.0.0/15 instead (RFC 2544's benchmarking range, never routed either). It is
made in batches (``ip -batch`` for the links and namespaces, sshds started in parallel) and
raises the root namespace's neighbour table limits (``gc_thresh1/2/3``) to what a bridge of
that size needs while it exists: ``tests.netbed_limits`` restores them when the last large
bed goes.

Faults:
- ``cut(host)``: the host's link goes down (its cable pulled); its processes keep running.
- ``join(host)``: the link comes back.
- ``power_off(host)``: it is cut, then every process in its namespace is SIGKILLed.

``teardown()`` removes everything by name and pid (sshds, the namespaces' processes, the
namespaces, links, the bridge), idempotently, and ``leftovers()`` proves nothing is left.
Needs root and ``ip netns``; ``netbed_available()`` says why not. ``python -m tests.netbed``
makes a bed and prints it as JSON until stdin closes (for trying things by hand).
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from tests import netbed_limits
from tests.sshd import SSHD, Sshd, start_sshd

RANGE = "198.51.100"  # TEST-NET-2: documentation only
BLOCK = 32  # addresses per small bed: /27
LARGE_RANGE = ipaddress.IPv4Network("198.18.0.0/15")  # RFC 2544: benchmarking only, never routed
LARGE_BLOCK = 1024  # addresses per large bed: /22
LOCK = Path("/run/lock/tfl-netbed.lock")
SSHD_STARTERS = 16  # sshds started at once (each waits until it listens)


def netbed_available() -> str | None:
    """None when a bed can be made here, else why not."""
    if os.geteuid() != 0:
        return "the network test bed needs root (network namespaces, links)"
    if not os.path.exists(SSHD):
        return f"{SSHD} not installed (apt-get install openssh-server)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()} (apt-get install iproute2)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _ip_batch(lines: list[str], *options: str, check: bool = True) -> None:
    """Many ``ip`` commands in one process (``-force``: all of them, even after a failure)."""
    if not lines:
        return
    result = subprocess.run(["ip", *options, "-batch", "-"], input="\n".join(lines) + "\n", capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(options)} -batch: {result.stderr.strip()[-500:]}")


@dataclass
class Host:
    name: str  # h1, h2…
    address: str
    netns: str
    link: str  # the root namespace's end of its veth pair (on the bridge)
    sshd: Sshd | None = None

    @property
    def home(self) -> Path:
        assert self.sshd is not None
        return self.sshd.home(self.address)


@dataclass
class NetBed:
    token: str
    dir: Path
    bridge: str
    gateway: str  # the bridge's address: where the launcher's packets come from
    hosts: list[Host] = field(default_factory=list)
    known_hosts: Path | None = None
    client_key: Path | None = None
    prefix: int = 27  # the block's prefix length: /27 small, /22 large

    # --- what tests use ------------------------------------------------------------------
    def host(self, address: str) -> Host:
        return next(h for h in self.hosts if h.address == address)

    @property
    def addresses(self) -> list[str]:
        return [h.address for h in self.hosts]

    def home(self, address: str) -> Path:
        """The HOME of ``address``'s SSH sessions (its ``~/.cache/tfl``, its ``~/.bashrc``)."""
        return self.host(address).home

    def sshd_log(self) -> str:
        return "".join(h.sshd.log() for h in self.hosts if h.sshd is not None)

    def ssh_settings(self, **override: Any) -> dict[str, Any]:
        return {"user": "root", "identity_file": str(self.client_key), "known_hosts": str(self.known_hosts),
                "connect_timeout": 5, **override}

    def cluster_file(self, path: Path, tasks: dict[str, list[str]], python: str | Path, **extra: Any) -> Path:
        hosts: dict[str, dict[str, Any]] = {h: {"python": str(python)} for h in self.addresses}
        for host, settings in extra.pop("hosts", {}).items():
            hosts.setdefault(host, {}).update(settings)
        data = {"cluster": tasks, "ssh": self.ssh_settings(**extra.pop("ssh", {})), "hosts": hosts, **extra}
        path.write_text(json.dumps(data, indent=1))
        return path

    def pids(self, host: Host) -> list[int]:
        """Every process in the host's network namespace."""
        out = _ip("netns", "pids", host.netns, check=False).stdout
        return [int(p) for p in out.split()]

    def all_pids(self) -> dict[str, list[int]]:
        """Every process in any of the bed's namespaces, by host name: one pass over /proc."""
        return {h.name: pids for h, pids in zip(self.hosts, _pids_in(self.hosts), strict=True) if pids}

    # --- faults --------------------------------------------------------------------------
    def cut(self, address: str) -> float:
        """Pull the host's cable; returns the wall time of the cut."""
        _ip("link", "set", "dev", self.host(address).link, "down")
        return time.time()

    def join(self, address: str) -> None:
        _ip("link", "set", "dev", self.host(address).link, "up")

    def power_off(self, address: str) -> float:
        """Cut the host, then kill every process of it (its sshd too): like a power cut, nothing
        goes out on the wire (no FIN, no RST); returns the wall time."""
        host = self.host(address)
        _ip("link", "set", "dev", host.link, "down")
        when = time.time()
        for _ in range(50):
            pids = self.pids(host)
            if not pids:
                break
            for pid in pids:
                _kill(pid)
            time.sleep(0.05)
        return when

    # --- life ----------------------------------------------------------------------------
    def teardown(self) -> None:
        """Everything of the bed, by pid and name; idempotent, and tolerant of a half-made bed.
        Deleting a namespace ends its links in the kernel's own time: this waits for them."""
        for host in self.hosts:
            if host.sshd is not None:
                _kill(host.sshd.proc.pid)
        for host in self.hosts:
            if host.sshd is not None:
                try:
                    host.sshd.proc.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        for _ in range(100):
            left = [pid for pids in _pids_in(self.hosts) for pid in pids]
            if not left:
                break
            for pid in left:
                _kill(pid)
            time.sleep(0.05)
        names = set(_ip("netns", "list").stdout.split())
        _ip_batch([f"netns del {h.netns}" for h in self.hosts if h.netns in names], "-force", check=False)
        links = _links_of(self.token)
        _ip_batch([f"link del {name}" for name in links if name != self.bridge], "-force", check=False)
        if self.bridge in links:
            _ip("link", "del", self.bridge, check=False)
        deadline = time.monotonic() + 30
        while _links_of(self.token) and time.monotonic() < deadline:
            time.sleep(0.1)
        netbed_limits.release(LOCK, self.token)

    def leftovers(self) -> list[str]:
        """What of the bed still exists (namespaces, links, sshds, raised kernel limits it holds):
        [] after ``teardown``."""
        left = [n for n in _ip("netns", "list").stdout.split() if self.token in n]
        left += _links_of(self.token)
        left += [f"sshd pid {h.sshd.proc.pid}" for h in self.hosts if h.sshd is not None and _running(h.sshd.proc.pid)]
        left += [f"the neighbour table limits held for bed {self.token}"] if netbed_limits.holds(self.token) else []
        return left


def _links_of(token: str) -> list[str]:
    return [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", "show").stdout.splitlines()
            if token in line]


def _pids_in(hosts: list[Host]) -> list[list[int]]:
    """Per host, the processes in its namespace: each /proc/PID/ns/net against the namespace's inode."""
    inodes: dict[int, int] = {}
    for i, host in enumerate(hosts):
        try:
            inodes[os.stat(f"/run/netns/{host.netns}").st_ino] = i
        except OSError:
            pass
    found: list[list[int]] = [[] for _ in hosts]
    if not inodes:
        return found
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                index = inodes.get(os.stat(f"/proc/{entry.name}/ns/net").st_ino)
            except OSError:
                continue
            if index is not None:
                found[index].append(int(entry.name))
    return found


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _free_block(large: bool) -> tuple[list[str], int]:
    """The addresses of the first block of the range whose first address no interface here holds
    (the gateway, then the hosts'), and its prefix length."""
    used = _ip("-4", "-o", "addr", "show").stdout
    if large:
        for block in LARGE_RANGE.subnets(new_prefix=32 - (LARGE_BLOCK - 1).bit_length()):
            if f"inet {block.network_address + 1}/" not in used:
                return [str(a) for a in block.hosts()], block.prefixlen
        raise RuntimeError(f"every /22 block of {LARGE_RANGE} is in use by other test beds")
    for base in range(0, 256, BLOCK):
        if f"inet {RANGE}.{base + 1}/" not in used:
            return [f"{RANGE}.{base + a}" for a in range(1, BLOCK - 1)], 27
    raise RuntimeError(f"every /27 block of {RANGE}.0/24 is in use by other test beds")


def make_netbed(directory: Path, count: int = 3) -> NetBed:
    """``count`` hosts, each with its sshd listening; torn down again if any step fails. More
    than ``BLOCK - 3`` hosts make a large bed (module docstring)."""
    large = count > BLOCK - 3
    if count > LARGE_BLOCK - 3:
        raise ValueError(f"at most {LARGE_BLOCK - 3} hosts per bed")
    token = os.urandom(3).hex()
    directory.mkdir(parents=True, exist_ok=True)
    bed = NetBed(token, directory, bridge=f"tb{token}", gateway="")
    try:
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # two beds must not take the same block
            addresses, bed.prefix = _free_block(large)
            bed.gateway = addresses[0]
            _ip("link", "add", bed.bridge, "type", "bridge")
            _ip("addr", "add", f"{bed.gateway}/{bed.prefix}", "dev", bed.bridge)
            if large:
                netbed_limits.hold(token, count, held_by=lambda t: f"tb{t}" in _links_of(t))
        _ip("link", "set", bed.bridge, "up")
        bed.hosts = [Host(f"h{i}", addresses[i], netns=f"tfl-{token}-h{i}", link=f"tv{token}h{i}") for i in range(1, count + 1)]
        _make_hosts(bed)
        _start_sshds(bed)
    except BaseException:
        bed.teardown()
        raise
    return bed


def _make_hosts(bed: NetBed) -> None:
    """Namespaces and veth pairs in one ``ip -batch``; then each namespace's addresses in one more."""
    root: list[str] = []
    for host in bed.hosts:
        root += [f"netns add {host.netns}", f"link add {host.link} type veth peer name eth0 netns {host.netns}",
                 f"link set {host.link} master {bed.bridge}", f"link set {host.link} up"]
    _ip_batch(root)

    def inside(host: Host) -> None:
        _ip_batch([f"addr add {host.address}/{bed.prefix} dev eth0", "link set eth0 up", "link set lo up"], "-n", host.netns)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(inside, bed.hosts))


def _start_sshds(bed: NetBed) -> None:
    first, *others = bed.hosts
    first.sshd = start_sshd(bed.dir / first.name, hosts=(first.address,), netns=first.netns, port=22)

    def start(host: Host) -> None:
        host.sshd = start_sshd(bed.dir / host.name, hosts=(host.address,), keys_from=first.sshd, netns=host.netns, port=22)

    with ThreadPoolExecutor(SSHD_STARTERS) as pool:
        list(pool.map(start, others))  # raises the first failure, once every start has ended
    bed.known_hosts, bed.client_key = bed.dir / "known_hosts", first.sshd.client_key
    first.sshd.known_hosts_for(tuple(bed.addresses), bed.known_hosts)


@pytest.fixture
def netbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetBed]:
    """Three hosts of their own (a fresh bed per test: a fault may power one off); gone after the
    test, failed or not, and proven gone. Skipped where it cannot work, except in CI (CI=true)."""
    why = netbed_available()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI runs as root with iproute2 and openssh-server (see .ci/run)")
        pytest.skip(why)
    bed = make_netbed(tmp_path_factory.mktemp("netbed"))
    try:
        yield bed
    finally:
        bed.teardown()
    assert bed.leftovers() == [], f"the test bed left {bed.leftovers()}"


def main() -> int:
    why = netbed_available()
    if why:
        print(f"netbed: {why}", file=sys.stderr)
        return 2
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="tfl-netbed-"))
    bed = make_netbed(directory, int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    try:
        print(json.dumps({"dir": str(directory), "gateway": bed.gateway, "hosts": bed.addresses,
                          "known_hosts": str(bed.known_hosts), "identity_file": str(bed.client_key)}), flush=True)
        sys.stdin.read()
    finally:
        bed.teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
