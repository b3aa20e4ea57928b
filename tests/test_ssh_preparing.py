"""A detached SSH launch whose hosts are still being made ready (reached, code shipped) has no run
record yet: `tfl status` from a second terminal listed nothing, so a user could launch again, and
`tfl stop` could not name it. Now it is listed as preparing, and `tfl stop RUN` calls it off."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.sshd import HOSTS, Sshd
from tests.test_ssh import wait_for
from tests.test_ssh_prepare_signals import held_launch, shipped

pytestmark = pytest.mark.ssh


def tfl(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True, timeout=120)


def test_a_detached_launch_being_prepared_is_listed_and_stop_calls_it_off(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                                          child_env: dict[str, str]) -> None:
    background: list[psutil.Process] = []
    stop: subprocess.Popen[str] | None = None
    try:
        with held_launch(sshd, tmp_path, child_env, "--detach") as held:  # 127.0.0.3's login held: still preparing
            launcher, before = held.launcher, held.before
            background = psutil.Process(launcher.pid).children()
            (run,) = [p.name for p in (tfl_home / "runs").iterdir()]

            listed = tfl(["status"], child_env)
            assert listed.returncode == 0, listed.stderr
            assert listed.stdout.splitlines()[1].split()[:4] == [run, "job.py", "preparing", "0/2"], listed.stdout
            one = tfl(["status", run[:12]], child_env)
            assert one.returncode == 0, one.stderr
            assert one.stdout.startswith(f"run {run}  preparing  (0/2 tasks alive"), one.stdout
            assert f"is making the hosts ready (checks, code shipped); the run is recorded once they are, and `tfl stop {run}` " \
                   "calls it off" in one.stdout
            as_json = json.loads(tfl(["status", "--json"], child_env).stdout)
            assert [(r["run_id"], r["state"]) for r in as_json] == [(run, "preparing")]

            stop = subprocess.Popen([sys.executable, "-m", "launcher", "stop", run], env=child_env, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            wait_for(lambda: (tfl_home / "runs" / run / "stop_requested").exists() or stop.poll() is not None, timeout=60)
            held.go.touch()  # 127.0.0.3 goes on: what was shipped there must go as well
            stopped_out, stopped_err = stop.communicate(timeout=120)
            _, err = launcher.communicate(timeout=120)
    finally:
        if stop is not None and stop.poll() is None:
            stop.kill()
            stop.wait()
        gone, alive = psutil.wait_procs(background, timeout=60)
        for proc in alive:
            proc.kill()
    assert not alive
    assert stop.returncode == 0, stopped_err
    assert stopped_out.strip() == (f"run {run}: called off while its hosts were being made ready: no task started, and what "
                                   "was shipped to them is removed")
    assert launcher.returncode == 143, err
    assert err.splitlines()[-1] == ("tfl: error: stopped by `tfl stop` while the hosts were being made ready: no task "
                                    "started, and what was shipped to them is removed"), err
    assert {host: shipped(sshd, host, before) for host in HOSTS} == {host: [] for host in HOSTS}
    assert list((tfl_home / "runs").iterdir()) == [] and list((tfl_home / "active").iterdir()) == []
    assert tfl(["status"], child_env).stdout.startswith("no runs yet")
