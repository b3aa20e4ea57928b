"""Why an SSH open failed, as one line that names the host and the fix (``explain``), and the
error every SSH failure of tfl is (``SSHError``). paramiko is imported only when a failure is
explained."""

from __future__ import annotations

import errno
import socket

from launcher.describe.hosts import SSHTarget
from launcher.engines.ssh.hostkeys import UnknownHostKey
from launcher.engines.ssh.jump import Jump
from launcher.errors import LaunchError


class SSHError(LaunchError):
    """A host could not be reached, authenticated, or used; the message says which and why."""

    def __init__(self, host: str, message: str, task: str | None = None) -> None:
        super().__init__(f"{task} on {host}: {message}" if task else f"{host}: {message}")
        self.host, self.cause = host, message


def cause_of(exc: BaseException) -> str:
    """What went wrong with a host, without the host's name an ``SSHError`` puts first (for a line that names it)."""
    return exc.cause if isinstance(exc, SSHError) else str(exc) or type(exc).__name__


NO_ROUTE = (errno.EHOSTUNREACH, errno.ENETUNREACH)
DROPS = (EOFError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)


def dropped(exc: BaseException) -> bool:
    """An open the far side closed before its greeting (sshd's MaxStartups), or a bastion short of channels."""
    import paramiko

    if isinstance(exc, paramiko.ChannelException):
        return bool(exc.code == paramiko.common.OPEN_FAILED_RESOURCE_SHORTAGE)
    if isinstance(exc, (UnknownHostKey, paramiko.BadHostKeyException, paramiko.AuthenticationException)):
        return False
    return any(isinstance(e, DROPS) for e in (exc, exc.__context__, exc.__cause__))


def explain(target: SSHTarget, exc: Exception, jump: Jump | None, tries: int, bastion_of: str | None = None) -> SSHError:
    """``exc``, raised opening ``target`` (``tries`` times, the last one failed), as one line naming the fix.
    ``bastion_of``: the target is a bastion, set there (``Jump.origin``)."""
    import paramiko

    host, port, known = target.host, target.port, target.known_hosts_file
    # a bastion's user and port are its jump's ([user@]host[:port]; ssh.user and 22 by default), never ssh.port
    user_field = f"the user of {bastion_of} (default ssh.user)" if bastion_of else "ssh.user"
    port_field = f"the port of {bastion_of} (default 22)" if bastion_of else "ssh.port"
    if dropped(exc):
        via = f" (through {jump.describe()})" if jump else ""
        return SSHError(host, f"sshd on {target.address}{via} closed the connection before its greeting, {tries} times "
                              "(more connections at once than its MaxStartups lets in?); try again, or raise MaxStartups "
                              "in its sshd_config")
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
                              f"~/.ssh/authorized_keys on {host} or fix {user_field} / ssh.identity_file")
    if (why := _no_route(exc)) is not None:
        fix = (f"check the bastion's address in {bastion_of}" if bastion_of else "check the host name and the network; "
               "a host reached only through a bastion needs ssh.jump (or a ProxyJump in the ssh config)")
        return SSHError(host, f"no route to {target.address} ({why}): the host is down, or on a network this machine "
                              f"does not reach; {fix}")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError) or isinstance(exc, ConnectionRefusedError):
        return SSHError(host, f"connection refused on port {port}; is sshd running there, and is {port_field} right?")
    if isinstance(exc, TimeoutError) or "timed out" in str(exc).lower():
        return SSHError(host, f"no answer on port {port} within {target.connect_timeout:g} s; check the host name and "
                              "the network / firewall, or raise ssh.connect_timeout")
    # paramiko ends the negotiation's wait at connect_timeout without a word when the banner's (the same
    # number) has not fired yet; its next step then finds "No existing session": the same silence.
    if "protocol banner" in str(exc) or (isinstance(exc, paramiko.SSHException) and str(exc) == "No existing session"):
        return SSHError(host, f"port {port} answers, but no SSH server spoke within {target.connect_timeout:g} s; "
                              f"is {port_field} the sshd's port? (a busy sshd: raise ssh.connect_timeout)")
    if isinstance(exc, socket.gaierror):
        return SSHError(host, f"unknown host name ({exc}); fix the host in the cluster file")
    return SSHError(host, f"ssh to {target} failed: {type(exc).__name__}: {exc}")


def _no_route(exc: Exception) -> str | None:
    """Why the host has no route (EHOSTUNREACH: down, nothing answered its ARP; ENETUNREACH: no route
    to its network), or None. paramiko folds EHOSTUNREACH into "no valid connections" with refusals,
    which it said as refused; one refusal among its addresses means something answered: refused."""
    errors = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError: one error per address
    found = list(errors.values()) if isinstance(errors, dict) else [exc]
    routeless = [e for e in found if isinstance(e, OSError) and e.errno in NO_ROUTE]
    if not routeless or len(routeless) < len(found):
        return None
    return str(routeless[0].strerror or routeless[0])
