"""Hosts that fail like real ones (``tests.netbed``): cut off, powered off, or left behind by a
launcher killed with -9. tfl names a lost host within seconds, ends the run with one root
cause naming it, and the agents' dead-man timer (``ssh.fence_after``) stops whatever a cut
host still runs. Every test ends with no process of its runs left on any host.

Tiny jobs here (no TensorFlow): they loop until stopped, as tasks stuck in an all-reduce do.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.describe.ports import free_port
from tests.netbed import NetBed
from tests.procs import pid_alive, tfl_processes
from tests.test_ssh import only_run, wait_for, write_job

pytestmark = pytest.mark.ssh

LOOPS = """
    import os, time
    print("up", os.environ["TFL_TASK"], os.getpid(), flush=True)
    while True:
        time.sleep(0.2)
"""
FENCE = 6.0  # the agents' dead-man timer in these tests (30 s by default)
LOST = re.compile(r"host (\S+) unreachable since (\d\d:\d\d:\d\d) \(no answer for (\d+) s")


def bed_cluster(tmp_path: Path, bed: NetBed, fence: float = FENCE) -> Path:
    """chief on the first host, a worker on each of the two others."""
    h1, h2, h3 = bed.addresses
    tasks = {"chief": [f"{h1}:{free_port()}"], "worker": [f"{h2}:{free_port()}", f"{h3}:{free_port()}"]}
    shared = tmp_path / "shared"  # storage every host sees: restarts are allowed
    shared.mkdir(exist_ok=True)
    return bed.cluster_file(tmp_path / "cluster.json", tasks, sys.executable, ssh={"fence_after": fence},
                            storage={"path": str(shared)})


def start(job: Path, cluster: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--cluster", str(cluster), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def tasks_up(home: Path, count: int, launcher: subprocess.Popen[str]) -> dict[str, int]:
    """task -> pid, once each of ``count`` tasks said it is up."""
    found: dict[str, int] = {}

    def up() -> bool:
        if launcher.poll() is not None:
            raise AssertionError(f"tfl ended early: {launcher.communicate()}")
        runs = list((home / "runs").glob("*/logs/*.log")) if (home / "runs").exists() else []
        for log in runs:
            if m := re.search(r"up (\S+) (\d+)", log.read_text()):
                found[m[1]] = int(m[2])
        return len(found) == count

    wait_for(up, timeout=120)
    return found


def worker_pids(run: str, host_pids: list[int]) -> list[int]:
    return [p.pid for p in tfl_processes(run_id=run) if p.pid in host_pids]


@pytest.mark.parametrize("fault", ["cut", "power-off"])
def test_a_lost_workers_host_is_named_within_seconds_and_the_run_ends_with_it_as_root_cause(
        fault: str, netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    launcher = start(write_job(tmp_path / "src", LOOPS), bed_cluster(tmp_path, netbed), child_env, "--max-restarts", "2")
    try:
        pids = tasks_up(tfl_home, 3, launcher)
        on_h2 = netbed.pids(netbed.host(h2))
        assert pids["worker:0"] in on_h2
        when = netbed.cut(h2) if fault == "cut" else netbed.power_off(h2)
        out, err = launcher.communicate(timeout=120)
        ended = time.time()
    finally:
        launcher.kill()
    assert launcher.returncode == 1, err[-3000:]
    summary = err[err.index(" failed after "):]
    assert "no restart on a host known lost" in summary and "restart 1" not in err, err[-3000:]
    assert len(LOST.findall(summary.splitlines()[0])) == 1
    host, since, silent = LOST.search(summary).groups()  # type: ignore[union-attr]
    assert host == h2 and int(silent) <= 15, summary
    assert f"root cause: worker:0 on {h2}" in summary and "lost worker:0" in summary
    assert "stopped because of it: chief:0, worker:1" in summary
    assert ended - when < 60, f"the run took {ended - when:.0f} s to end after the {fault}"
    survivors = [pids["chief:0"], pids["worker:1"]]
    assert not any(pid_alive(p) for p in survivors)  # stopped at once, not left to TensorFlow's timeouts
    run = only_run(tfl_home)
    if fault == "cut":  # the cut host's task runs on until its agent's dead-man timer stops it
        wait_for(lambda: not pid_alive(pids["worker:0"]), timeout=FENCE + 20)
    assert worker_pids(run, on_h2) == []


def test_a_cut_host_joined_after_the_run_ended_had_stopped_its_tasks_itself(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    launcher = start(write_job(tmp_path / "src", LOOPS), bed_cluster(tmp_path, netbed), child_env)
    try:
        pids = tasks_up(tfl_home, 3, launcher)
        netbed.cut(h2)
        launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    # The agent's dead-man timer, its grace, a margin: all while still cut off. Waited out only
    # until the task and the agents are gone (the same checks follow, after the host joins).
    deadline = time.monotonic() + FENCE + 8
    while time.monotonic() < deadline and (pid_alive(pids["worker:0"]) or _agents(netbed, h2)):
        time.sleep(0.2)
    stopped_while_cut = not pid_alive(pids["worker:0"])
    netbed.join(h2)
    assert stopped_while_cut, "the cut host's task outlived its agent's dead-man timer"
    assert tfl_processes(run_id=only_run(tfl_home)) == []
    assert _agents(netbed, h2) == []  # the agents exited too: only the host's sshd is left there


def _agents(netbed: NetBed, address: str) -> list[int]:
    return [p for p in netbed.pids(netbed.host(address)) if "tfl-agent" in _cmdline(p)]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_a_launcher_killed_with_sigkill_leaves_no_remote_task_beyond_the_fencing_time(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    launcher = start(write_job(tmp_path / "src", LOOPS), bed_cluster(tmp_path, netbed), child_env)
    try:
        pids = tasks_up(tfl_home, 3, launcher)
        run = only_run(tfl_home)
        wait_for(lambda: all(t.get("pid") for t in _record(tfl_home, run)["tasks"]), timeout=30)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        killed = time.monotonic()
        wait_for(lambda: not any(pid_alive(p) for p in pids.values()), timeout=FENCE + 20)
        gone_after = time.monotonic() - killed
    finally:
        launcher.kill()
    assert tfl_processes(run_id=run) == []
    # sshd saw each session end and the agents stopped their tasks: within the fence (and its grace), not later.
    assert gone_after < FENCE + 15, gone_after


def _record(home: Path, run: str) -> dict[str, Any]:
    import json

    try:
        return dict(json.loads((home / "runs" / run / "state.json").read_text()))
    except (OSError, ValueError):
        return {"tasks": []}


def test_fence_after_out_of_range_is_one_line_naming_the_field(netbed: NetBed, tmp_path: Path, tfl_home: Path,
                                                                  child_env: dict[str, str]) -> None:
    path = bed_cluster(tmp_path, netbed, fence=1)
    result = subprocess.run([sys.executable, "-m", "launcher", "launch", str(write_job(tmp_path / "src", LOOPS)),
                             "--cluster", str(path)], env=child_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "ssh.fence_after" in result.stderr and "5" in result.stderr


MNIST = str(Path(__file__).resolve().parent.parent / "jobs" / "mnist.py")


@pytest.mark.slow
def test_a_workers_host_cut_mid_training_ends_the_run_naming_it_and_folds_the_survivors_tracebacks(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """Real TensorFlow: the chief and the other worker hang in an all-reduce with the cut one."""
    from tests.hostenv import host_python

    h1, h2, h3 = netbed.addresses
    shared = tmp_path / "shared"
    shared.mkdir()
    tasks = {"chief": [f"{h1}:{free_port()}"], "worker": [f"{h2}:{free_port()}", f"{h3}:{free_port()}"]}
    path = netbed.cluster_file(tmp_path / "cluster.json", tasks, host_python("hostenv"), ssh={"fence_after": FENCE},
                               storage={"path": str(shared)}, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", MNIST, "--cluster", str(path), "--max-restarts", "2",
                                 "--", "--epochs", "50", "--steps-per-epoch", "20", "--batch-size", "16"],
                                env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: launcher.poll() is not None or _epoch(tfl_home, "worker-0") >= 2, timeout=400)
        assert launcher.poll() is None, launcher.communicate()
        on_h2 = netbed.pids(netbed.host(h2))
        when = netbed.cut(h2)
        out, err = launcher.communicate(timeout=200)
        ended = time.time()
    finally:
        launcher.kill()
    assert launcher.returncode == 1, err[-3000:]
    summary = err[err.index(" failed after "):]
    match = LOST.search(summary)
    assert match and match[1] == h2 and int(match[3]) <= 15, summary
    assert f"root cause: worker:0 on {h2}" in summary and "no restart on a host known lost" in summary, summary
    assert "restart 1" not in err and ended - when < 60, (ended - when, err[-3000:])
    assert "Traceback" not in out, out[-3000:]  # the survivors' tracebacks are folded (their logs keep them)
    run = only_run(tfl_home)
    wait_for(lambda: worker_pids(run, on_h2) == [], timeout=FENCE + 20)  # fenced on the cut host itself
    assert tfl_processes(run_id=run) == []


def _epoch(home: Path, slug: str) -> int:
    import json

    try:
        return int(json.loads(next((home / "runs").glob(f"*/progress/{slug}.json")).read_text()).get("epoch", 0))
    except (StopIteration, OSError, ValueError):
        return 0
