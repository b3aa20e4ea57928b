"""The run's own firewall on its SSH hosts (``"ssh": {"firewall": true}``; docs/security.md).

On each host with it, one agent session (``node/agent_firewall.py``, mode ``fence``) installs
an nftables table named after the run, ``inet tfl_<run>``, before any task starts there: the
host's task ports accept connections from loopback and from the run's hosts, and drop all
others; and since those sources are shared with the host's other users, only the run's login
user there (and root) may open a connection to a task port of the run, the host's own or a
peer's (``destinations``). The agent holds the table while we ping it and removes it when we ask (the run's
end), or on its own when it loses us (stdin ends, or ``fence_after`` s of silence: the same
fence that stops its tasks). ``tfl stop`` and ``tfl rm`` remove it again (``unfence``), which
is harmless when it is gone already.

The run's hosts are named by the cluster file; a name is resolved here, once, when the run's
first table is installed, and every address it has is admitted.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from launcher.contract import RUN_ID
from launcher.engines.parallel import parallel
from launcher.engines.ssh.connect import connect
from launcher.engines.ssh.failures import SSHError
from launcher.engines.ssh.pool import HEARTBEAT_TIMEOUT
from launcher.engines.ssh.wire import agent_command, agent_input, agent_request, converse
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.run_options import DEFAULT_GRACE_S
from launcher.records.store import RunRecord

if TYPE_CHECKING:
    from paramiko import Channel

    from launcher.engines.ssh.pool import HostPool

PING_EVERY = 2.0  # the holder's fence is the host's ``fence_after`` (5 s at least)
# How long a holder that lost us keeps the table while a task port is still served there: the tasks'
# fence gives them the grace (``backend.KILL_GRACE``) before SIGKILL, and a kill its wait.
LINGER = DEFAULT_GRACE_S + 30.0
TABLE_PREFIX = "tfl_"


def table_name(run_id: str) -> str:
    """nftables names are letters, digits and ``_``: the run id with anything else as ``_``."""
    return TABLE_PREFIX + "".join(c if c.isascii() and c.isalnum() else "_" for c in run_id)


def fenced_tasks(plan: LaunchPlan, host: str) -> list[TaskLaunch]:
    return [t for t in plan.tasks if t.host == host and t.ssh is not None and t.ssh.firewall]


def resolve_each(hosts: Iterable[str]) -> dict[str, list[str]]:
    """host -> its addresses: an address as written, a name as it resolves here.
    SSHError naming a name that does not resolve."""
    addresses: dict[str, list[str]] = {}
    for host in sorted(set(hosts)):
        try:
            found = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                found = [ipaddress.ip_address(str(info[4][0]).split("%")[0])
                         for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]
            except (OSError, ValueError) as exc:
                raise SSHError(host, f"cannot resolve it here for the run's firewall ({exc}); "
                                     "name it by address in the cluster file") from None
        addresses[host] = sorted({str(a) for a in found})
    return addresses


def by_family(addresses: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """Every host's addresses together: the IPv4 ones and the IPv6 ones."""
    found = {ipaddress.ip_address(a) for host_addresses in addresses.values() for a in host_addresses}
    return sorted(str(a) for a in found if a.version == 4), sorted(str(a) for a in found if a.version == 6)


def resolve(hosts: Iterable[str]) -> tuple[list[str], list[str]]:
    """The hosts' IPv4 and IPv6 addresses (``resolve_each``), all together."""
    return by_family(resolve_each(hosts))


def destinations(plan: LaunchPlan, addresses: dict[str, list[str]]) -> list[list[Any]]:
    """Every fenced task port of the run as ``[address, port]``, each address of its host: what a
    host's output chain keeps the other users there from dialling."""
    pairs = {(a, t.port) for t in plan.tasks if t.ssh is not None and t.ssh.firewall for a in addresses.get(t.host, [])}
    return [[a, p] for a, p in sorted(pairs)]


class Firewalls:
    """The run's tables on its hosts, each held by one agent session until ``release``."""

    def __init__(self, pool: HostPool) -> None:
        self._pool = pool
        self._held: dict[str, tuple[Channel, str]] = {}  # host -> (its holder's session, python)
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._addresses: dict[str, list[str]] | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._pinger: threading.Thread | None = None

    def ensure(self, plan: LaunchPlan, host: str) -> str | None:
        """The host's table installed and held (now or before); None, or the one-line refusal."""
        tasks = fenced_tasks(plan, host)
        if not tasks or tasks[0].ssh is None:
            return None
        with self._locks[host]:
            held = self._held.get(host)
            if held is not None and not (held[0].closed or held[0].exit_status_ready()):
                return None
            target, python = tasks[0].ssh, tasks[0].python
            request = {"mode": "fence", "table": table_name(tasks[0].env[RUN_ID]), "ports": [t.port for t in tasks],
                       "heartbeat_timeout": target.fence_after, "linger": LINGER}
            addresses = self._run_addresses(plan)
            request["ipv4"], request["ipv6"] = by_family(addresses)
            request["destinations"] = destinations(plan, addresses)
            chan = self._pool.channel(target, agent_command(python), HEARTBEAT_TIMEOUT)
            chan.sendall(agent_input(None))
            answer = converse(chan, request, host, python)
            if "error" in answer:
                chan.close()
                return (f"cannot fence the task ports with nftables ({answer['error']}); {answer['fix']}, "
                        "or set ssh.firewall to false")
            self._held[host] = (chan, python)
        self._start_pinger()
        return None

    def _run_addresses(self, plan: LaunchPlan) -> dict[str, list[str]]:
        with self._lock:
            if self._addresses is None:
                self._addresses = resolve_each(t.host for t in plan.tasks)
            return self._addresses

    def _start_pinger(self) -> None:
        with self._lock:
            if self._pinger is None:
                self._pinger = threading.Thread(target=self._ping, name="ssh-firewall", daemon=True)
                self._pinger.start()

    def _ping(self) -> None:
        while not self._closing.wait(PING_EVERY):
            for chan, _ in list(self._held.values()):
                try:
                    chan.sendall(b'{"ping": 1}\n')
                except (OSError, EOFError):
                    pass  # its host is lost: its holder removes the table on its own

    def release(self, lost: Callable[[str], bool]) -> None:
        """Ask every holder to remove its table and wait for it, all hosts at once; a host
        ``lost`` is not waited on (its holder removes the table when it notices)."""
        self._closing.set()

        def remove(host: str) -> None:
            chan, python = self._held.pop(host)
            try:
                if not lost(host):
                    converse(chan, {"remove": 1}, host, python)
            except SSHError:
                pass  # best effort: the holder removes it anyway when its session ends
            finally:
                chan.close()

        parallel(remove, list(self._held))


def unfence(record: RunRecord) -> dict[str, str]:
    """``tfl stop`` / ``tfl rm``: remove the run's table on each of its fenced hosts, all at once;
    host -> what is left there ("" when nothing)."""
    plan = LaunchPlan.from_dict(record.plan)
    hosts = {t.host: (t.ssh, t.python) for t in plan.tasks if t.ssh is not None and t.ssh.firewall}

    def drop(host: str) -> str:
        target, python = hosts[host]
        conn = connect(replace(target, accept_new_host_keys=False), recorded=True)
        try:
            answer: dict[str, Any] = agent_request(conn, python, {"mode": "unfence", "table": table_name(record.run_id)})
        finally:
            conn.close()
        return "" if "error" not in answer else f"nftables table {table_name(record.run_id)}: {answer['error']}; {answer['fix']}"

    results = parallel(drop, list(hosts))
    return {h: (f"{r}" if isinstance(r, Exception) else r) for h, r in zip(hosts, results, strict=True)}
