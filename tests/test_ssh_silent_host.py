"""A host whose port accepts connections but whose sshd never greets (hung, overloaded, or not an
sshd at all) is one line naming the port and the fix. paramiko's transport thread logged its failure,
tracebacks and all, through Python's last-resort handler onto the terminal; and when the
negotiation's deadline (ssh.connect_timeout) came before the banner's (the same number), the line
was paramiko's `SSHException: No existing session`."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sshd import NOWHERE, Sshd, cluster_file
from tests.test_ssh import write_job

pytestmark = pytest.mark.ssh


@pytest.mark.parametrize("command", ["launch", "doctor"])
def test_a_port_that_never_greets_is_one_line_without_paramiko_s_traceback(
        command: str, sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    job = write_job(tmp_path / "src", "print('never runs')\n")
    with socket.socket() as silent:  # accepts connections (the kernel does), never says a word
        silent.bind((NOWHERE, 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        cluster = cluster_file(tmp_path / "cluster.json", sshd, {"chief": [f"{NOWHERE}:2222"]}, {NOWHERE: None},
                               ssh={"port": port, "connect_timeout": 1})
        args = ["launch", str(job), "--cluster", str(cluster)] if command == "launch" else ["doctor", "--cluster", str(cluster)]
        done = subprocess.run([sys.executable, "-m", "launcher", *args], env=child_env, capture_output=True, text=True,
                              timeout=120)
    said = f"port {port} answers, but no SSH server spoke within 1 s; is ssh.port the sshd's port? (a busy sshd: raise ssh.connect_timeout)"
    assert "Traceback" not in done.stderr and "paramiko" not in done.stderr, done.stderr
    if command == "launch":
        assert done.returncode == 2 and done.stderr.splitlines() == [f"tfl: error: {NOWHERE}: {said}"], done.stderr
    else:
        assert done.returncode == 1 and said in done.stdout and done.stderr == "", (done.stdout, done.stderr)
