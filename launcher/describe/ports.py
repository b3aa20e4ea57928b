"""Free ports for the tasks that tfl places itself (``--local N``; the tests' clusters too).

A port that the kernel hands out for ``bind(port 0)`` comes from its ephemeral range. Every
outgoing connection on the machine, and every other ``bind(0)``, draws from the same range. A
task's TensorFlow server binds its port seconds after tfl picks it, and in that gap anything else
may take it: CI saw an sshd's port picked that way, held on 127.0.0.2 while the pick was checked
on 127.0.0.1 only. So tfl picks at random from the ports above the ephemeral range (61000-65535
with Linux's defaults), which nothing hands out unasked and which tfl's Slurm engine leaves alone
(its port blocks lie in 10000-32767). It checks each port on the wildcard address, which is how
TensorFlow binds it, so a port held on any address of the machine is skipped. A machine whose
range leaves too few ports above it is served from the kernel instead.
"""

from __future__ import annotations

import contextlib
import errno
import random
import socket
from pathlib import Path

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_HIGHEST = 65535
_ROOM = 1000  # fewer ports than this above the ephemeral range: ask the kernel
_TRIES = 200


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports that no address of this machine holds now, from above the
    ephemeral range (or, where that range leaves no room, from the kernel)."""
    above = range(_ephemeral_end() + 1, _HIGHEST + 1)
    if len(above) < max(_ROOM, 10 * count):
        return _kernel_ports(count)
    picked: list[int] = []
    held: list[socket.socket] = []
    try:
        for port in random.sample(above, min(_TRIES * count, len(above))):
            sock = _hold(port)
            if sock is not None:
                held.append(sock)
                picked.append(port)
                if len(picked) == count:
                    return picked
    finally:
        for sock in held:
            sock.close()
    return picked + _kernel_ports(count - len(picked))


def _hold(port: int) -> socket.socket | None:
    """A socket bound to ``port`` on the IPv4 wildcard, once IPv6's is free too; None if either is held."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("0.0.0.0", port))
    except OSError:
        sock.close()
        return None
    if socket.has_ipv6:
        with contextlib.suppress(OSError), socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as six:
            six.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                six.bind(("::", port))
            except OSError as exc:
                if exc.errno not in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):  # else: no IPv6 here
                    sock.close()
                    return None
    return sock


def _kernel_ports(count: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("0.0.0.0", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _ephemeral_end() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 60999  # Linux's default
