"""SIGTERM or SIGHUP while ``tfl launch`` makes the SSH hosts ready (the terminal closed, ``timeout``,
a batch system) ends it as Ctrl-C does: what was shipped to the hosts so far is removed, for there is
no run record yet that ``tfl rm`` could find it by. Their default action left the run's dirs and code
on every host already reached (a large ``--sync`` makes that window seconds long). A Ctrl-C while
``--detach`` waits for its background launcher calls the launch off, not only the waiting."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from launcher.describe.ports import free_port
from tests.sshd import HOSTS, Sshd, cluster_file
from tests.test_ssh import SLEEP_JOB, wait_for, write_job

pytestmark = pytest.mark.ssh


def shipped(sshd: Sshd, host: str, before: dict[str, set[Path]] | None = None) -> list[Path]:
    """What tfl left in ``host``'s per-user run dirs (the sshd is the worker's, shared with the other
    SSH tests it runs: only what is new since ``before``)."""
    found = set((sshd.home(host) / ".cache" / "tfl" / "runs").glob("*"))
    return sorted(found - (before or {}).get(host, set()))


def snapshot(sshd: Sshd) -> dict[str, set[Path]]:
    return {host: set(shipped(sshd, host)) for host in HOSTS}


@dataclass
class HeldLaunch:
    launcher: subprocess.Popen[str]
    go: Path  # touch it: 127.0.0.3's login goes on
    before: dict[str, set[Path]]  # what the hosts' run dirs held before (``shipped``)


@contextmanager
def held_launch(sshd: Sshd, tmp_path: Path, env: dict[str, str], *options: str) -> Iterator[HeldLaunch]:
    """``tfl launch`` of a sleeping job on 127.0.0.2 (chief) and 127.0.0.3 (worker), 127.0.0.3's login
    held by its .bashrc until ``go``: yielded once the code is on 127.0.0.2, the launch still making the
    hosts ready. Afterwards the launcher is killed if it is still there, and the login let go."""
    go = tmp_path / "go"
    held = sshd.home("127.0.0.3") / ".bashrc"
    before = snapshot(sshd)
    held.write_text(f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done\n")
    launcher: subprocess.Popen[str] | None = None
    try:
        job = write_job(tmp_path / "src", SLEEP_JOB)
        cluster = cluster_file(tmp_path / "cluster.json", sshd, {"chief": [f"127.0.0.2:{free_port()}"],
                                                                 "worker": [f"127.0.0.3:{free_port()}"]},
                               {"127.0.0.2": None, "127.0.0.3": None})
        launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--cluster", str(cluster),
                                     *options], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: any(p.glob("*/code/job.py") for p in shipped(sshd, "127.0.0.2", before)), timeout=120)
        yield HeldLaunch(launcher, go, before)
    finally:
        if launcher is not None and launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        held.unlink()
        go.touch()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])  # SIGINT: a Ctrl-C
def test_a_signal_while_the_hosts_are_made_ready_removes_what_was_shipped(
        signum: signal.Signals, sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    # 127.0.0.3's login is held: 127.0.0.2 is ready by the time the signal comes
    with held_launch(sshd, tmp_path, child_env) as held:
        held.launcher.send_signal(signum)
        held.go.touch()  # 127.0.0.3 goes on: its dirs are made too, and must go as well
        _, err = held.launcher.communicate(timeout=120)
    launcher, before = held.launcher, held.before
    assert {host: shipped(sshd, host, before) for host in HOSTS} == {host: [] for host in HOSTS}
    assert launcher.returncode == 128 + signum, err
    errors = [line for line in err.splitlines() if line.startswith("tfl: error:")]
    assert errors == [f"tfl: error: stopped by {signum.name} while the hosts were being made ready: no task started, "
                      "and what was shipped to them is removed"], err
    assert "Traceback" not in err
    assert list((tfl_home / "runs").glob("*/state.json")) == []  # no run was recorded


def test_ctrl_c_while_a_detached_launch_waits_calls_the_launch_off(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                                   child_env: dict[str, str]) -> None:
    """`tfl launch --detach` waits for its background launcher to make the hosts ready; a Ctrl-C meanwhile
    ended only the waiting: the background launcher, in a session of its own, went on and ran the job."""
    background: list[psutil.Process] = []
    try:
        with held_launch(sshd, tmp_path, child_env, "--detach") as held:
            launcher, before = held.launcher, held.before
            background = psutil.Process(launcher.pid).children()
            assert len(background) == 1 and "_supervise" in background[0].cmdline()
            launcher.send_signal(signal.SIGINT)
            # It passes the SIGINT on, then waits for the background launcher: 127.0.0.3 goes on only then.
            wait_for(lambda: launcher.poll() is not None or Path(f"/proc/{launcher.pid}/wchan").read_text() == "do_wait",
                     timeout=60)
            held.go.touch()
            _, err = launcher.communicate(timeout=120)
    finally:
        gone, alive = psutil.wait_procs(background, timeout=60)  # without the fix it runs the job: end it
        for proc in alive:
            proc.kill()
    assert len(gone) == 1 and not alive  # it ended with the launch (not ours to reap: no exit code here)
    assert {host: shipped(sshd, host, before) for host in HOSTS} == {host: [] for host in HOSTS}
    assert launcher.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines()[-1] == ("tfl: error: stopped by SIGINT while the hosts were being made ready: no task started, "
                                    "and what was shipped to them is removed"), err
    assert list((tfl_home / "runs").iterdir()) == []  # no run, and no run dir left without a record
