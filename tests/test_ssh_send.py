"""What tfl sends down an SSH channel costs about its size, not its size squared: paramiko's
``Channel.sendall`` copies all that is left after each 32 KiB packet, so a 300 MB ``--sync``
took the launcher 13 minutes of CPU before a host got it (``connect.send_all``)."""

from __future__ import annotations

import os
from typing import Any

import paramiko
import pytest

from launcher.describe.hosts import SSHTarget
from launcher.engines.ssh.connect import connect, exec_command
from launcher.engines.ssh.wire import MARK, converse
from tests.sshd import Sshd

SIZE = 4 << 20  # 4 MiB: copied about 128 times over (256 MiB) by a bare sendall, about once here


class _Counted:
    """Wraps ``paramiko.Channel.send`` (its ``sendall`` calls it): the bytes handed to it, summed.
    Each call is given all that sendall has left, so the sum is what sendall copied."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.given = 0
        real = paramiko.Channel.send

        def send(chan: paramiko.Channel, s: bytes) -> int:
            self.given += len(s)
            return int(real(chan, s))

        monkeypatch.setattr(paramiko.Channel, "send", send)


@pytest.mark.ssh
def test_a_large_stdin_reaches_the_host_whole_and_is_copied_about_once(sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    conn = connect(SSHTarget(host="127.0.0.2", **sshd.ssh_settings()))
    try:
        counted = _Counted(monkeypatch)
        data = os.urandom(SIZE)
        code, out, _ = exec_command(conn, "sha256sum", data, timeout=120)
    finally:
        conn.close()
    import hashlib

    assert code == 0 and out.split()[0].decode() == hashlib.sha256(data).hexdigest()
    assert SIZE <= counted.given <= 3 * SIZE, counted.given  # a bare sendall: about 256 MiB


class _Channel:
    """A channel that takes one SSH packet (32 KiB) per ``send``, as paramiko's does, with paramiko's
    own ``sendall``; it answers the request with an empty JSON object."""

    sendall = paramiko.Channel.sendall

    def __init__(self) -> None:
        self.received = bytearray()
        self.given = 0
        self.answered = False

    def send(self, s: bytes) -> int:
        self.given += len(s)
        self.received += s[:32768]
        return min(len(s), 32768)

    def recv(self, size: int) -> bytes:
        if self.answered:
            return b""
        self.answered = True
        return MARK + b"{}\n"


def test_an_unpack_request_with_megabytes_of_code_is_copied_about_once() -> None:
    chan = _Channel()
    request: dict[str, Any] = {"mode": "unpack", "archives": [{"dest": "/x", "data": "A" * SIZE}]}
    assert converse(chan, request, "gpu1", "python3") == {}
    assert bytes(chan.received).startswith(b'{"mode": "unpack"') and len(chan.received) > SIZE
    assert chan.given <= 3 * len(chan.received), (chan.given, len(chan.received))
