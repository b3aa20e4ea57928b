"""Open SSH connections per host, and each host's agent started ahead of its tasks (used by the
backend, ``prepare`` and the restart of a lost attempt)."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import TYPE_CHECKING

from launcher.describe.hosts import SSHTarget
from launcher.engines.ssh.connect import connect, open_channel
from launcher.engines.ssh.failures import SSHError
from launcher.engines.ssh.wire import agent_command, agent_input, python_failure
from launcher.limits import limit_error, own_fault
from launcher.plan.launch_plan import TaskLaunch

if TYPE_CHECKING:
    from fabric import Connection
    from paramiko import Channel

# Silence after which we take a host's agent session for lost even though its host answers (``watch``
# knows a host that does not answer as lost within seconds). The agent's own dead-man timer,
# after which it stops its tasks, is the cluster file's ``ssh.fence_after`` (30 s by default).
HEARTBEAT_TIMEOUT = 30.0


def _connect(target: SSHTarget) -> Connection:
    """``connect``, where a failure for want of the launcher's own descriptors (or buffers) is
    said as that (``launcher.limits``), never as the host's."""
    try:
        return connect(target)
    except SSHError as exc:
        fault = own_fault(exc)
        if fault is not None:
            raise limit_error(fault, "connecting to the hosts") from None
        raise


class HostPool:
    """Open SSH connections per host, shared by its tasks; a dropped one is replaced on demand."""

    def __init__(self) -> None:
        self._conns: dict[str, list[Connection]] = {}
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._ready: dict[str, Channel] = {}  # host -> its agent, started ahead and waiting for its tasks

    def get(self, target: SSHTarget) -> Connection:
        with self._locks[target.host]:
            live = self._live(target.host)
            if not live:
                live.append(_connect(target))
            return live[0]

    def channel(self, target: SSHTarget, command: str, timeout: float) -> Channel:
        """A session running ``command``. sshd allows 10 sessions per connection by default
        (MaxSessions): a host with more at once (its agent, its firewall's, requests) gets another connection."""
        import paramiko

        for conn in [self.get(target), *self._live(target.host)[1:]]:
            try:
                return open_channel(conn, command, timeout)
            except paramiko.ChannelException:
                continue
        conn = _connect(target)
        with self._locks[target.host]:
            self._live(target.host).append(conn)
        return open_channel(conn, command, timeout)

    def agent(self, launch: TaskLaunch) -> Channel:
        """The agent on the task's host: the one started ahead by ``start_agent_ahead``, else a new one."""
        chan = self._ready.pop(launch.host, None)
        if chan is None or chan.closed or chan.exit_status_ready():
            if launch.ssh is None:
                raise SSHError(launch.host, "the plan has no ssh settings for this task (a plan from another tfl?)", launch.name)
            chan = self.channel(launch.ssh, agent_command(launch.python), HEARTBEAT_TIMEOUT)
            try:
                chan.sendall(agent_input(None))
            except (OSError, EOFError) as exc:
                # The remote command may have ended before its input went: a missing python
                # exits 127 at once. Say that, as the host's probe would, rather than the symptom.
                if chan.status_event.wait(5.0) and chan.exit_status != 0:
                    stderr = chan.recv_stderr(65536) if chan.recv_stderr_ready() else b""
                    raise SSHError(launch.host, python_failure(launch.python, chan.exit_status, stderr, launch.host)) from None
                raise SSHError(launch.host, f"the SSH session closed at once ({exc})", launch.name) from None
        return chan

    def start_agent_ahead(self, launch: TaskLaunch) -> Channel:
        """The host's agent, started now and kept: it checks the host and unpacks the code, then runs
        the host's tasks (``backend.SSHBackend._session``), so that starting them costs a round trip each."""
        chan = self._ready[launch.host] = self.agent(launch)
        return chan

    def drop(self, host: str) -> None:
        """Close the host's connections: after it was lost, a transport may look active and be dead."""
        with self._locks[host]:
            for conn in self._conns.pop(host, []):
                conn.close()

    def _live(self, host: str) -> list[Connection]:
        conns = self._conns.setdefault(host, [])
        conns[:] = [c for c in conns if (t := c.client.get_transport()) is not None and t.is_active()]
        return conns

    def close(self) -> None:
        for chan in self._ready.values():
            chan.close()  # its agent reads EOF before any request and exits
        self._ready.clear()
        for conns in list(self._conns.values()):
            for conn in conns:
                conn.close()
        self._conns.clear()
