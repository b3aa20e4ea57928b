"""What a task on an SSH host starts outside its process group (a daemon's double fork and setsid,
a child in a group of its own) ends with the task's agent session, as on the local engine: the
agent signalled only the task's group, so such a process stayed on the host after the run."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from launcher import contract
from launcher.engines.ssh.node import agent_tasks
from tests.procs import pid_alive
from tests.sshd import Sshd
from tests.test_hostile_jobs import ESCAPES, RESTARTED
from tests.test_ssh import only_run, tfl, two_hosts, write_job

pytestmark = pytest.mark.ssh


def test_the_agent_spells_the_contracts_marks() -> None:
    """The agent is sent alone (no import of the contract): its marker names must be the contract's."""
    assert agent_tasks.MARKS == (contract.RUN_ID, contract.RUN_DIR, contract.ATTEMPT, contract.TASK)


# The same escapes, ignoring SIGTERM (inherited by both): the agent gives them SIGTERM, 2 s, then SIGKILL as
# its session ends, and the launcher closed its side and returned without waiting for that, so they were
# still alive as `tfl launch` exited 0.
STUBBORN = textwrap.dedent(ESCAPES).replace("import os, subprocess, sys, time",
                                            "import os, signal, subprocess, sys, time\n"
                                            "signal.signal(signal.SIGTERM, signal.SIG_IGN)")


@pytest.mark.parametrize("escapes", [textwrap.dedent(ESCAPES), STUBBORN], ids=["plain", "ignoring-sigterm"])
def test_a_daemon_a_remote_task_left_is_gone_when_the_launch_returns(escapes: str, sshd: Sshd, tmp_path: Path,
                                                                     tfl_home: Path, child_env: dict[str, str]) -> None:
    pids = tmp_path / "pids"
    pids.mkdir(mode=0o777)  # the hosts' tasks write here (one machine: root on the loopback hosts)
    job = write_job(tmp_path / "src", escapes)
    cluster = two_hosts(tmp_path, sshd, tfl_home)
    escaped: list[int] = []
    try:
        result = tfl(["launch", str(job), "--cluster", str(cluster), "--", str(pids), "0"], child_env, timeout=180)
        escaped = [int(p.name.rsplit(".", 1)[1]) for p in pids.iterdir()]
        assert result.returncode == 0 and "succeeded" in result.stderr, result.stderr[-3000:]
        assert len(escaped) == 4, sorted(p.name for p in pids.iterdir())  # two per task: a daemon, a group of its own
        assert [p for p in escaped if pid_alive(p)] == [], f"left on the hosts as run {only_run(tfl_home)} returned"
    finally:
        for pid in escaped:
            if pid_alive(pid):
                os.kill(pid, 9)


def test_a_restart_on_a_host_begins_without_what_the_last_attempt_left(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                                      child_env: dict[str, str]) -> None:
    """The agent's session spans the attempts: it ends the last attempt's leftovers as the next one's tasks come."""
    pids = tmp_path / "pids"
    pids.mkdir(mode=0o777)
    job = write_job(tmp_path / "src", textwrap.dedent(RESTARTED))
    cluster = two_hosts(tmp_path, sshd, tfl_home)
    try:
        result = tfl(["launch", str(job), "--cluster", str(cluster), "--max-restarts", "1", "--", str(pids),
                      "--model-dir", str(tmp_path / "model")], child_env, timeout=180)  # one machine: a shared dir
        assert result.returncode == 0 and "1 restart(s)" in result.stderr, result.stderr[-3000:]
        # the chief's daemon surely started (attempt 0's chief waited for it); the worker may have been stopped before its own
        assert "[chief:0] attempt 0's daemon: gone" in result.stdout.replace("[chief:0]  ", "[chief:0] "), result.stdout
    finally:
        for pid in [int(p.name.rsplit(".", 1)[1]) for p in pids.iterdir()]:
            if pid_alive(pid):
                os.kill(pid, 9)
