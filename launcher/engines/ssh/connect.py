"""SSH connections to the hosts of a plan: fabric, strict host keys, bastions, retries, one-line errors.

fabric (and paramiko under it) is imported on first connect only, so nothing that merely
imports this module (``tfl status`` of a local run, ``--help``) pays for it.

Host keys are checked against known_hosts, always (``hostkeys``: the file is read once per
process, as is the private key, ``identity``). fabric's default would add any unknown host
silently (AutoAddPolicy); here an unknown host is refused with the command that fixes it,
unless the user opted in to accepting *new* keys. A changed key is never accepted. Every
failure becomes an ``SSHError`` naming the host, the cause and the fix.

A host behind a bastion (``jump``: ``ssh.jump`` or the ssh config's ProxyJump) is reached
through a ``direct-tcpip`` channel of the one connection this process holds to that bastion
(``_Bastions``), shared by every host behind it and closed with the last of them; the
bastion's key is checked like any host's. An open that an sshd drops before its greeting
(MaxStartups: too many connections at once) is tried again, ``TRIES`` times in all with
jittered exponential backoff. A failed open leaves nothing open: fabric closes only a
connected client, so ``TflConnection.close`` closes the rest (the client's transport, the
channel, its hold on the bastion).
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from launcher.describe.hosts import SSHTarget
from launcher.engines.ssh.failures import SSHError, dropped, explain
from launcher.engines.ssh.hostkeys import give_keys, policy
from launcher.engines.ssh.identity import private_key
from launcher.engines.ssh.jump import Jump, hostname, jump_for, ssh_config
from launcher.engines.ssh.watch import PROBE_TIMEOUT, reachable
from launcher.files import RECORDED_KEY_FIX, private_key_problem
from launcher.limits import limit_error, own_fault

if TYPE_CHECKING:
    from fabric import Connection
    from paramiko import Channel

TRIES = 5  # opens of one connection that an sshd dropped before its greeting
BACKOFF = 0.3  # s before the second try; doubled for each next one, at most BACKOFF_CAP, jittered
BACKOFF_CAP = 4.0
# paramiko's transport thread polls its socket every 0.1 s (``Transport._active_check_timeout``) only
# to notice a close: ten wakeups a second per idle connection, most of an idle launcher's CPU at
# hundreds of hosts. Once a connection is open it polls this seldom instead; ``close`` shuts the
# socket down first, which wakes the thread at once. (No keepalives are sent; a rekey the far side
# asks for is read like any packet, one we owe waits at most this long.)
IDLE_POLL = 10.0
# paramiko's ``Channel.sendall`` sends one packet (32 KiB at most) per turn and then slices off the
# rest, a copy of all that is left: quadratic in the data, 13 min of CPU for a 300 MB ``--sync``.
# ``send_all`` hands it this much at a time, so the copying stays about the size of the data.
SEND_CHUNK = 1 << 16
_sleep = time.sleep  # the tests' hook


def connect(target: SSHTarget, bastion_of: str | None = None, *, recorded: bool = False) -> Connection:
    """An open, authenticated connection, or an ``SSHError`` with the fix. ``bastion_of``: the
    target is a bastion, set there (``Jump.origin``): its user and port come from that, not ssh.*.
    ``recorded``: the target is a recorded run's (status, stop, rm): its settings are the record's, not the cluster file's."""
    key = os.path.expanduser(target.identity_file) if target.identity_file else None
    problem = key and private_key_problem(key, RECORDED_KEY_FIX if recorded else "fix ssh.identity_file in the cluster file")
    if problem:
        raise SSHError(target.host, problem)
    try:
        jump = jump_for(target)
    except ValueError as exc:
        raise SSHError(target.host, f"{exc}") from None
    for attempt in range(1, TRIES + 1):
        try:
            return _open(target, jump)
        except SSHError:
            raise
        except Exception as exc:  # paramiko raises many unrelated types; each becomes one line
            if not dropped(exc) or attempt == TRIES:
                raise explain(target, exc, jump, TRIES, bastion_of) from None
        _sleep(min(BACKOFF_CAP, BACKOFF * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0))
    raise AssertionError("unreachable")


def _open(target: SSHTarget, jump: Jump | None) -> Connection:
    conn = _connection(target, jump)
    try:
        if jump is not None:
            conn._bastion = hold = _BASTIONS.acquire(jump, target.host)
            conn._sock = _forward(hold, target.host, (conn.host, conn.port), target.connect_timeout)
            conn.connect_kwargs["sock"] = conn._sock
        give_keys(conn.client, target.known_hosts_file, conn.host if conn.port == 22 else f"[{conn.host}]:{conn.port}")
        conn.open()
        conn.client.get_transport().sock.settimeout(IDLE_POLL)
    except BaseException:
        conn.close()
        raise
    return conn


def _connection(target: SSHTarget, jump: Jump | None) -> Connection:
    key = os.path.expanduser(target.identity_file) if target.identity_file else None
    timeout = target.connect_timeout
    # With an explicit key, only that key is offered (like ssh's IdentitiesOnly): no surprises
    # from whatever an ssh-agent or ~/.ssh happens to hold. Read once per process (``identity``).
    kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout}
    if key:
        loaded = private_key(key)
        kwargs.update({"pkey": loaded} if loaded is not None else {"key_filename": [key]})
        kwargs.update(allow_agent=False, look_for_keys=False)
    # gateway=False: never fabric's own gateway (a ProxyJump would open one bastion connection
    # per host); None leaves a ProxyCommand of the ssh config to fabric, as before.
    gateway = False if jump is not None or target.jump == "none" else None
    conn = _connection_class()(target.host, user=target.user, port=target.port, connect_timeout=max(1, round(timeout)),
                               connect_kwargs=kwargs, gateway=gateway, config=_config(target.config))
    conn.client.set_missing_host_key_policy(policy(target.known_hosts_file, target.accept_new_host_keys))
    return conn


_CLASS: list[Any] = []


def _config(path: str | None) -> Any:
    """fabric's Config over the ssh config: one per connection (fabric's Connection writes into its
    Config, so connections opened from several threads at once cannot share one)."""
    from fabric import Config

    return Config(ssh_config=ssh_config(path))


def _connection_class() -> Any:
    if not _CLASS:
        import logging

        from fabric import Connection

        # paramiko's transport thread logs a failed open (a banner that never came, a socket closed
        # under it) with its traceback; with no handler of ours Python's last resort prints that on
        # the terminal beside the one line ``explain`` makes of the same failure.
        logging.getLogger("paramiko").addHandler(logging.NullHandler())

        class TflConnection(Connection):  # type: ignore[misc]
            """fabric's Connection; ``close`` also closes what a failed open left, and lets go of the bastion."""

            # Class attributes: invoke's DataProxy stores only names it knows as real attributes.
            _bastion: _Hold | None = None
            _sock: Any = None

            def close(self) -> None:
                try:
                    _wake(self.client.get_transport())
                    super().close()
                    self.client.close()  # a transport left by a failed open (fabric skips it)
                finally:
                    sock, self._sock = self._sock, None
                    if sock is not None:
                        sock.close()
                    hold, self._bastion = self._bastion, None
                    if hold is not None:
                        _BASTIONS.release(hold)

        _CLASS.append(TflConnection)
    return _CLASS[0]


def _wake(transport: Any) -> None:
    """Ends ``transport``'s thread now, not at its next poll (``IDLE_POLL``): a socket shut down
    wakes its reader (closing it does not). A bastion's channel wakes its reader when closed."""
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket):
        # The read side only: the thread's read gets an end at once (an EOF, logged by paramiko at
        # DEBUG), and nothing goes to the sshd before the close, so no reset comes back to be read
        # (which paramiko would log as an error).
        try:
            sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass  # never connected, or already closed


def _forward(hold: _Hold, host: str, dest: tuple[str, int], timeout: float) -> Channel:
    """A ``direct-tcpip`` channel from the bastion to ``dest`` (``host``'s HostName and port): the
    socket of its connection."""
    import paramiko

    port = dest[1]
    transport = hold.conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise EOFError("the connection to the bastion was lost")  # a drop: the next try opens it again
    try:
        return transport.open_channel("direct-tcpip", dest, ("127.0.0.1", 0), timeout=timeout)
    except paramiko.ChannelException as exc:
        if exc.code == paramiko.common.OPEN_FAILED_RESOURCE_SHORTAGE:
            raise
        raise SSHError(host, f"bastion {hold.name} could not reach {host}:{port} ({exc.text}); is the host up, and "
                             "is its sshd on ssh.port?") from None
    except paramiko.SSHException as exc:
        raise SSHError(host, f"no answer from {host}:{port} through bastion {hold.name} within {timeout:g} s ({exc}); "
                             "check the host, or raise ssh.connect_timeout") from None


class _Hold:
    """One open connection to a bastion, and how many connections ride on it."""

    def __init__(self, jump: Jump, conn: Connection) -> None:
        self.key, self.name, self.conn, self.users = jump.bastion, jump.bastion.host, conn, 1

    def active(self) -> bool:
        transport = self.conn.client.get_transport()
        return transport is not None and bool(transport.is_active())


class _Bastions:
    """The process's connections to bastions: one per bastion, opened by the first host behind it
    and closed with the last. Hosts that waited on an open that failed get its answer, not a try each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[SSHTarget, _Hold] = {}
        self._gates: dict[SSHTarget, threading.Lock] = {}
        self._tries: dict[SSHTarget, int] = {}
        self._failed: dict[SSHTarget, tuple[int, str]] = {}

    def acquire(self, jump: Jump, host: str) -> _Hold:
        key = jump.bastion
        with self._lock:
            gate = self._gates.setdefault(key, threading.Lock())
            seen = self._tries.get(key, 0)
        with gate:
            with self._lock:
                hold = self._open.get(key)
                if hold is not None and hold.active():
                    hold.users += 1
                    return hold
                failed = self._failed.get(key)
                if failed is not None and failed[0] > seen:  # tried while we waited: its answer is ours
                    raise SSHError(host, failed[1])
                attempt = self._tries[key] = self._tries.get(key, 0) + 1
            try:
                conn = connect(key, bastion_of=jump.origin)
            except SSHError as exc:
                message = f"{jump.describe()}: {exc.cause}"
                with self._lock:
                    self._failed[key] = (attempt, message)
                raise SSHError(host, message) from None
            hold = _Hold(jump, conn)
            with self._lock:
                self._open[key] = hold
            return hold

    def release(self, hold: _Hold) -> None:
        with self._lock:
            hold.users -= 1
            if hold.users > 0:
                return
            if self._open.get(hold.key) is hold:
                del self._open[hold.key]
        hold.conn.close()


_BASTIONS = _Bastions()


def reach(target: SSHTarget, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the host's sshd port answers, asked the way the host is reached (``watch``): a TCP
    connection (refused counts: the host is up), or for a host behind a bastion a ``direct-tcpip``
    open from there (OpenSSH's bastion says "Connect failed" for refused and unreachable alike: no
    answer, unless it says refused). A bastion out of reach: so is the host."""
    import paramiko

    try:
        jump = jump_for(target)
    except ValueError:
        jump = None
    if jump is None:  # the address ssh dials: an ssh config's HostName for it, as through a bastion
        return reachable(hostname(target), target.port, timeout)
    try:
        hold = _BASTIONS.acquire(jump, target.host)
    except SSHError as exc:
        _raise_own_fault(exc)
        return False
    try:
        transport = hold.conn.client.get_transport()
        transport.open_channel("direct-tcpip", (hostname(target), target.port), ("127.0.0.1", 0), timeout=timeout).close()
        return True
    except paramiko.ChannelException as exc:
        return "refused" in str(exc.text).lower()
    except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
        _raise_own_fault(exc)
        return False
    finally:
        _BASTIONS.release(hold)


def _raise_own_fault(exc: BaseException) -> None:
    """The launcher out of descriptors or buffers says nothing of the host (``launcher.limits``)."""
    fault = own_fault(exc)
    if fault is not None:
        raise limit_error(fault, "watching the hosts") from None


def exec_command(conn: Connection, command: str, stdin: bytes = b"", timeout: float = 60.0) -> tuple[int, bytes, bytes]:
    """Run ``command`` on the host with ``stdin``; (exit status, stdout, stderr)."""
    return finish_command(conn, start_command(conn, command, stdin, timeout), command, timeout)


def start_command(conn: Connection, command: str, stdin: bytes, timeout: float) -> Channel:
    """``command`` started on the host with all of ``stdin`` sent; ``finish_command`` reads its end.
    Many hosts' commands can so run at once while one thread waits for them."""
    chan = open_channel(conn, command, timeout)
    try:
        send_all(chan, stdin)
        chan.shutdown_write()
    except OSError as exc:
        chan.close()
        raise SSHError(conn.host, f"`{command[:60]}` did not take its input within {timeout:g} s ({exc})") from None
    return chan


def send_all(chan: Channel, data: bytes) -> None:
    """``chan.sendall(data)`` at a cost linear in ``data`` (``SEND_CHUNK``)."""
    view = memoryview(data)
    for start in range(0, len(view), SEND_CHUNK):
        chan.sendall(bytes(view[start:start + SEND_CHUNK]))


def finish_command(conn: Connection, chan: Channel, command: str, timeout: float) -> tuple[int, bytes, bytes]:
    """The (exit status, stdout, stderr) of a ``start_command``, waited for up to ``timeout`` s."""
    try:
        chan.settimeout(timeout)
        out, err = bytearray(), bytearray()
        while True:
            data = chan.recv(65536)
            if not data:
                break
            out += data
        while chunk := chan.recv_stderr(65536):  # the channel is at EOF: this drains, then ends
            err += chunk
        return chan.recv_exit_status(), bytes(out), bytes(err)
    except OSError as exc:  # socket.timeout included
        raise SSHError(conn.host, f"`{command[:60]}` did not finish within {timeout:g} s ({exc})") from None
    finally:
        chan.close()


def open_channel(conn: Connection, command: str, timeout: float | None) -> Channel:
    """A session running ``command``; ``paramiko.ChannelException`` when sshd refuses another."""
    import paramiko

    transport = conn.client.get_transport()
    if transport is None or not transport.is_active():
        raise SSHError(conn.host, "the SSH connection was lost; check the host and the network")
    try:
        chan = transport.open_session(timeout=timeout)
        chan.settimeout(timeout)
        chan.exec_command(command)
    except paramiko.ChannelException:
        raise
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise SSHError(conn.host, f"could not open an SSH session ({exc}); check the host and the network") from None
    return chan


