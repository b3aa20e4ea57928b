"""SSH connections to the hosts of a plan: fabric, strict host keys, one-line errors.

fabric (and paramiko under it) is imported on first connect only, so nothing that merely
imports this module (``tfl status`` of a local run, ``--help``) pays for it.

Host keys are checked against known_hosts, always. fabric's default would add any unknown
host silently (AutoAddPolicy); here an unknown host is refused with the command that
fixes it, unless the user opted in to accepting *new* keys. A changed key is never
accepted. Every failure becomes an ``SSHError`` naming the host, the cause and the fix.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.describe.hosts import SSHTarget
from launcher.errors import LaunchError

if TYPE_CHECKING:
    from fabric import Connection
    from paramiko import Channel



class SSHError(LaunchError):
    """A host could not be reached, authenticated, or used; the message says which and why."""

    def __init__(self, host: str, message: str, task: str | None = None) -> None:
        super().__init__(f"{task} on {host}: {message}" if task else f"{host}: {message}")
        self.host, self.cause = host, message


def connect(target: SSHTarget) -> Connection:
    """An open, authenticated connection, or an ``SSHError`` with the fix."""
    import paramiko
    from fabric import Connection

    key = os.path.expanduser(target.identity_file) if target.identity_file else None
    if key and not os.path.isfile(key):
        raise SSHError(target.host, f"identity file {key} not found (fix ssh.identity_file in the cluster file)")
    timeout = target.connect_timeout
    # With an explicit key, only that key is offered (like ssh's IdentitiesOnly): no surprises
    # from whatever an ssh-agent or ~/.ssh happens to hold.
    kwargs: dict[str, Any] = {"banner_timeout": timeout, "auth_timeout": timeout}
    if key:
        kwargs.update(key_filename=[key], allow_agent=False, look_for_keys=False)
    conn = Connection(target.host, user=target.user, port=target.port, connect_timeout=max(1, round(timeout)),
                      connect_kwargs=kwargs)
    conn.client.set_missing_host_key_policy(_host_key_policy(target))
    known = target.known_hosts_file
    if os.path.isfile(known):
        conn.client.load_system_host_keys(known)  # read-only: never rewritten behind the user's back
    try:
        conn.open()
    except Exception as exc:  # paramiko raises many unrelated types; each becomes one line
        conn.close()
        raise _explain(target, exc, paramiko) from None
    return conn


class UnknownHostKey(Exception):
    pass


def _host_key_policy(target: SSHTarget) -> Any:
    import paramiko

    class Reject(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise UnknownHostKey(f"{key.get_name()} {key.fingerprint}")

    class AcceptNew(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
        """ssh's StrictHostKeyChecking=accept-new: remember an unknown host's key."""

        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            path = Path(target.known_hosts_file)
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with _KNOWN_HOSTS_LOCK, path.open("a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")

    return AcceptNew() if target.accept_new_host_keys else Reject()


_KNOWN_HOSTS_LOCK = threading.Lock()


def _explain(target: SSHTarget, exc: Exception, paramiko: Any) -> SSHError:
    host, port, known = target.host, target.port, target.known_hosts_file
    if isinstance(exc, UnknownHostKey):
        keyscan = f"ssh-keyscan -p {port} {host} >> {known}" if port != 22 else f"ssh-keyscan {host} >> {known}"
        return SSHError(host, f"host key of {target.address} is not in {known} ({exc}); refusing an unknown host: "
                              f"check the fingerprint, then add it with `{keyscan}` (or pass --accept-new-host-keys)")
    if isinstance(exc, paramiko.BadHostKeyException):
        return SSHError(host, f"HOST KEY CHANGED for {target.address}: {known} holds another key (a reinstalled host, "
                              "or someone in the middle); if the change is expected remove the old one with "
                              f"`ssh-keygen -R '{target.address}' -f {known}`")
    if isinstance(exc, paramiko.AuthenticationException):
        who = target.user or "the default user"
        keys = target.identity_file or "ssh-agent / ~/.ssh keys"
        return SSHError(host, f"ssh authentication refused for {who} with {keys}; add the public key to "
                              f"~/.ssh/authorized_keys on {host} or fix ssh.user / ssh.identity_file")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) or isinstance(exc, ConnectionRefusedError):
        return SSHError(host, f"connection refused on port {port}; is sshd running there, and is ssh.port right?")
    if isinstance(exc, TimeoutError) or "timed out" in str(exc).lower():
        return SSHError(host, f"no answer on port {port} within {target.connect_timeout:g} s; check the host name and "
                              "the network / firewall, or raise ssh.connect_timeout")
    if "protocol banner" in str(exc):
        return SSHError(host, f"port {port} answers, but no SSH server spoke within {target.connect_timeout:g} s; "
                              "is ssh.port the sshd's port?")
    if isinstance(exc, socket.gaierror):
        return SSHError(host, f"unknown host name ({exc}); fix the host in the cluster file")
    return SSHError(host, f"ssh to {target} failed: {type(exc).__name__}: {exc}")


def exec_command(conn: Connection, command: str, stdin: bytes = b"", timeout: float = 60.0) -> tuple[int, bytes, bytes]:
    """Run ``command`` on the host with ``stdin``; (exit status, stdout, stderr)."""
    chan = open_channel(conn, command, timeout)
    try:
        chan.sendall(stdin)
        chan.shutdown_write()
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


