"""An agent that ends with no exit status (killed by a signal: sshd sends exit-signal, and paramiko
has no status; or its connection lost) is said as that, not as a wrong python (real sshd on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.describe.hosts import SSHTarget
from launcher.engines.ssh.connect import connect
from launcher.engines.ssh.failures import SSHError
from launcher.engines.ssh.wire import agent_request
from tests.sshd import Sshd

pytestmark = pytest.mark.ssh


def test_an_agent_killed_by_a_signal_is_not_blamed_on_the_python(sshd: Sshd, tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\nkill -9 $$\n")  # a python that the kernel kills as it starts
    python.chmod(0o755)
    conn = connect(SSHTarget(host="127.0.0.2", **sshd.ssh_settings()))
    try:
        with pytest.raises(SSHError) as info:
            agent_request(conn, str(python), {"mode": "info", "tasks": []}, timeout=30)
    finally:
        conn.close()
    assert str(info.value) == (f"127.0.0.2: the tfl agent under '{python}' ended with no exit status (killed by a "
                               "signal, or its SSH connection was lost); try again, and if it recurs check 127.0.0.2 "
                               "and hosts.127.0.0.2.python")
