"""Ctrl-C of the printed `ssh -L … 'mktemp … tensorboard …'` ends the TensorBoard on the host and
removes its private temp dir. Without a terminal on the remote side (no `-t`), sshd sends nothing
to the remote command when the client goes: the TensorBoard there served on and its temp dir stayed.

Run against the test sshd (loopback: the "remote" host is this machine), from a terminal of its own
(a pty, as a person's), with TensorBoard replaced by a sleeper that says its TMPDIR."""

from __future__ import annotations

import os
import pty
import re
import select
import shlex
import signal
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.store import RunStore
from launcher.views.tensorboard import REMOTE_TMPDIR
from tests.sshd import Sshd
from tests.test_tensorboard import add_run, task

pytestmark = pytest.mark.ssh
runner = CliRunner()
HANG_GUARD = 60.0  # far above the second or so each step takes
TMP_SAID = re.compile(rb"tmp=(\S+)\r?\n")


def printed_command(tfl_home: Path, sshd: Sshd, marker: str) -> list[str]:
    """The hint's command as printed, TensorBoard there replaced by a sleeper (marked, to be found)."""
    ssh = {**sshd.ssh_settings(), "host": "127.0.0.3"}
    add_run(RunStore(tfl_home), "remote", [task("chief:0", {"TFL_RUN_DIR": "/nowhere/remote"}, ssh=ssh)])
    result = runner.invoke(app, ["tensorboard", "remote", "--port", "6011"])
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout.splitlines()[1])
    assert argv[-1].startswith(REMOTE_TMPDIR) and " -m tensorboard.main " in argv[-1]
    sleeper = f"import os, time; print('tmp=' + os.environ['TMPDIR'], flush=True); time.sleep(600)  # {marker}"
    return [*argv[:-1], REMOTE_TMPDIR + shlex.join([sys.executable, "-c", sleeper])]


def marked(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in proc.info["cmdline"] or []):
            found.append(proc)
    return found


def read_until(fd: int, wanted: re.Pattern[bytes], deadline: float) -> bytes:
    seen = b""
    while not wanted.search(seen):
        assert time.monotonic() < deadline, f"never saw {wanted.pattern!r}: {seen!r}"
        if select.select([fd], [], [], 0.5)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the terminal's other side closed: ssh is gone
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_ctrl_c_of_the_printed_command_ends_tensorboard_there_and_removes_its_temp_dir(
        tfl_home: Path, tmp_path: Path, sshd: Sshd) -> None:
    marker = f"tfl-tb-{uuid.uuid4().hex}"
    argv = printed_command(tfl_home, sshd, marker)
    home = tmp_path / "home"  # no ~/.ssh of the account's: only what the command says
    home.mkdir()
    pid, terminal = pty.fork()  # ssh in a session of its own, this pty its controlling terminal: a person's
    if pid == 0:
        os.execvpe(argv[0], [*argv[:-1], "-o", "BatchMode=yes", argv[-1]],
                   {"HOME": str(home), "PATH": "/usr/bin:/bin", "TERM": "xterm"})
    deadline = time.monotonic() + HANG_GUARD
    try:
        said = read_until(terminal, TMP_SAID, deadline)
        tmp = Path(TMP_SAID.findall(said)[0].decode())
        assert tmp.is_dir() and tmp.name.startswith("tensorboard-tmp-"), said
        os.write(terminal, b"\x03")  # Ctrl-C, typed into the terminal the command runs in
        while (left := marked(marker)) or tmp.exists():
            assert time.monotonic() < deadline, (f"after Ctrl-C the TensorBoard there still runs ({[p.pid for p in left]}) "
                                                 f"or its temp dir {tmp} is still there ({tmp.exists()})")
            time.sleep(0.1)
    finally:
        for proc in marked(marker):
            proc.kill()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        os.close(terminal)
