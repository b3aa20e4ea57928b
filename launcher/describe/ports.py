"""Free ports for the tasks that tfl places itself (``--local N``; the tests' clusters too).

A task's TensorFlow server binds every address of the machine (``0.0.0.0:PORT``). So a port is
free for it only if no address holds it: CI saw a port picked on 127.0.0.1 alone while an sshd
held it on 127.0.0.2, and the launch was refused. tfl asks the kernel for a port on the wildcard
address (the kernel never hands out one that any address holds), checks that IPv6's wildcard is
free too, and holds all the ports it picks until it has them all, so that they are distinct.
Between the pick and the server's bind, seconds later, something else may still take the port;
the launch's port check then names the holder.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from pathlib import Path

_PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_LINUX_DEFAULT_RANGE = (32768, 60999)
_TRIES = 50  # per port asked for: the kernel hands out a port IPv6 holds only by rare chance


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that no address of this machine holds now."""
    held: list[socket.socket] = []
    picked: list[int] = []
    try:
        for _ in range(_TRIES * max(count, 1)):
            if len(picked) == count:
                break
            sock = _wildcard(0)  # the kernel's port; held until the end, so it is not handed out twice
            if sock is None:
                continue
            held.append(sock)
            port = int(sock.getsockname()[1])
            if _ipv6_free(port):
                picked.append(port)
    finally:
        for sock in held:
            sock.close()
    if len(picked) < count:
        raise OSError(errno.EADDRINUSE, f"no {count} free ports found on this machine")
    return picked


def kernel_port_range() -> tuple[int, int]:
    """The ports the kernel hands out for port 0 (``net.ipv4.ip_local_port_range``), which ``free_ports`` picks from."""
    try:
        low, high = (int(v) for v in Path(_PORT_RANGE).read_text().split())
    except (OSError, ValueError):
        return _LINUX_DEFAULT_RANGE
    return low, high


def free_everywhere(port: int) -> bool:
    """True if a server could bind ``port`` on every IPv4 and IPv6 address now."""
    sock = _wildcard(port)
    if sock is None:
        return False
    sock.close()
    return _ipv6_free(port)


def _wildcard(port: int) -> socket.socket | None:
    """A socket bound to IPv4's wildcard address at ``port`` (0: the kernel's choice), or None
    if an address holds it. The one bind that decides "free", for the picker and the check."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        return None
    return sock


def _ipv6_free(port: int) -> bool:
    if not socket.has_ipv6:
        return True
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as six:
        six.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            six.bind(("::", port))
        except OSError as exc:
            return exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)  # else held; these: no IPv6 here
    return True
