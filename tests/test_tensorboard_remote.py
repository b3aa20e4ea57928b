"""`tfl tensorboard` of a run whose model dir is on an SSH host prints the `ssh -L` command that shows
it here. That command left out the cluster file's known_hosts and its bastion (`ssh.jump`): copied, it
checked the host key against ~/.ssh/known_hosts (a prompt, or a refusal in batch mode) and dialled the
host straight, which behind a bastion has no route. Run here against the test sshd, it now reaches the
host through the bastion with the run's key and known_hosts."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.store import RunStore
from tests.sshd import NOWHERE, Sshd
from tests.test_tensorboard import add_run, task

pytestmark = pytest.mark.ssh
runner = CliRunner()


def printed_ssh(tfl_home: Path, sshd: Sshd, jump: str) -> list[str]:
    """The hint's ssh command, its tunnel and TensorBoard left out: ``echo reached`` there instead, no prompt."""
    ssh = {**sshd.ssh_settings(), "host": "127.0.0.3", "jump": jump}
    add_run(RunStore(tfl_home), "remote", [task("chief:0", {"TFL_RUN_DIR": "/nowhere/remote"}, ssh=ssh)])
    result = runner.invoke(app, ["tensorboard", "remote", "--port", "6010"])
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout.splitlines()[1])
    assert argv[-1].endswith(" -m tensorboard.main --logdir /nowhere/remote/model --port 6010 --host 127.0.0.1")
    tunnel = argv.index("-L")
    assert argv[tunnel + 1] == "6010:127.0.0.1:6010"
    return [*argv[:tunnel], *argv[tunnel + 2:-2], "-o", "BatchMode=yes", argv[-2], "echo", "reached"]


@pytest.mark.parametrize(("bastion", "reached"), [("127.0.0.2", True), (NOWHERE, False)])
def test_the_printed_command_reaches_the_host_through_its_bastion(tfl_home: Path, tmp_path: Path, sshd: Sshd,
                                                                  bastion: str, reached: bool) -> None:
    argv = printed_ssh(tfl_home, sshd, f"{bastion}:{sshd.port}")
    home = tmp_path / "home"  # no ~/.ssh of the account's: only what the command says
    home.mkdir()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    if reached:
        assert done.returncode == 0 and done.stdout == "reached\n", done.stderr
    else:  # the bastion is on the way: where it does not answer, the host is not reached
        assert done.returncode == 255 and "reached" not in done.stdout, done.stderr
        assert NOWHERE in done.stderr
