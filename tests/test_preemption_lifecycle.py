"""Preemption, stop and resume with real processes: a tiny job that behaves as the job kit does.

On SIGTERM a task of ``saver.py`` leaves a notice for the others (as TensorFlow's
coordination service does), saves its step, writes the kit's last progress record (phase
``preempted``, the agreed step) and exits PREEMPTED_EXIT_CODE; a task that sees the notice
does the same. A new attempt resumes from the saved step. Every test runs under
``tfl_home``, which fails it if any task outlives it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.contract import PREEMPTED_EXIT_CODE
from launcher.records.store import RunStore
from tests.procs import tfl_processes
from tests.test_lifecycle import wait_for

SAVER = """
    import json, os, signal, sys, time
    task, attempt = os.environ["TFL_TASK"], int(os.environ["TFL_ATTEMPT"])
    run_dir = os.environ["TFL_RUN_DIR"]
    saved = os.path.join(run_dir, "saved-" + task.replace(":", "-"))
    notice = os.path.join(run_dir, "notice-%d" % attempt)
    step = int(open(saved).read()) if os.path.exists(saved) else 0
    print("start", task, "attempt", attempt, "step", step, flush=True)

    def save_and_leave(*_):
        open(notice, "a").close()
        with open(saved, "w") as f:
            f.write(str(step))
        progress = os.environ["TFL_PROGRESS_FILE"]
        with open(progress + ".tmp", "w") as f:
            json.dump({"task": task, "attempt": attempt, "phase": "preempted", "global_step": step}, f)
        os.replace(progress + ".tmp", progress)
        print("saved", task, "at step", step, flush=True)
        os._exit(170)

    signal.signal(signal.SIGTERM, save_and_leave)
    steps = int(sys.argv[1])
    while step < steps:
        time.sleep(0.05)
        step += 1
        if os.path.exists(notice):
            save_and_leave()
    print("done", task, "at step", step, flush=True)
"""


@pytest.fixture
def saver(tmp_path: Path) -> str:
    path = tmp_path / "saver.py"
    path.write_text(textwrap.dedent(SAVER))
    return str(path)


def tfl(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True, timeout=timeout)


def only_run(home: Path) -> str:
    (run,) = [p.name for p in (home / "runs").iterdir()]
    return run


def running(home: Path, attempt: int = 0) -> bool:
    """(This job's tasks save where each is, not at one agreed step: that is TensorFlow's part.)
    Every task of the only run has started (its log says so) and is recorded with its pid."""
    runs = list((home / "runs").glob("*/state.json"))
    if len(runs) != 1:
        return False
    record = RunStore(home).load(runs[0].parent.name)
    logs = [Path(t.log_path) for t in record.tasks]
    return (all(t.pid and t.attempt == attempt for t in record.tasks)
            and all(p.exists() and f"attempt {attempt} step" in p.read_text() for p in logs))


def log(home: Path, task: str) -> str:
    return (home / "runs" / only_run(home) / "logs" / f"{task}.log").read_text()


def started_at(home: Path, task: str, attempt: int) -> int:
    found = re.search(rf"start \S+ attempt {attempt} step (\d+)", log(home, task))
    assert found, log(home, task)
    return int(found.group(1))


def test_a_preempted_worker_restarts_the_group_without_counting_a_restart(saver: str, child_env: dict[str, str],
                                                                         tfl_home: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", saver, "--local", "2", "--max-restarts", "0",
                                 "--", "120"], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: running(tfl_home))
    time.sleep(0.5)
    os.kill(RunStore(tfl_home).load(only_run(tfl_home)).task("worker:0").pid or 0, signal.SIGTERM)
    out, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 0, err[-3000:]
    step = started_at(tfl_home, "worker-0", 1)
    assert step > 0 and started_at(tfl_home, "chief-0", 1) > 0  # both saved on the notice and resumed there
    # The line names the first preempted task tfl reaped: the worker, or, when both had exited by the
    # supervisor's next poll (a loaded machine), the chief, which saved on the notice the worker passed on.
    named = re.search(r"restart 1: (chief|worker):0 on 127\.0\.0\.1: preempted: saved the agreed checkpoint at step (\d+)", err)
    assert named, err[-3000:]
    assert int(named.group(2)) == started_at(tfl_home, f"{named.group(1)}-0", 1)  # where that task resumed
    assert "succeeded" in err and "1 restart(s): 1 after a preemption" in err
    record = RunStore(tfl_home).load(only_run(tfl_home))
    assert [r.kind for r in record.restarts] == ["preemption"] and record.attempt == 1
    assert "done chief:0 at step 120" in log(tfl_home, "chief-0")
    status = tfl(["status", only_run(tfl_home)], child_env).stdout
    assert "1 restart(s), 1 after a preemption" in status and "preempted: saved the agreed checkpoint" in status


def test_launcher_sigterm_saves_and_says_how_to_resume_then_resume_finishes(saver: str, child_env: dict[str, str],
                                                                         tfl_home: Path) -> None:
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", saver, "--local", "2", "--", "120"],
                                env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: running(tfl_home))
    time.sleep(0.5)
    launcher.send_signal(signal.SIGTERM)  # the launcher's machine is going away
    _, err = launcher.communicate(timeout=120)
    run = only_run(tfl_home)
    assert launcher.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    assert f"tfl: run {run} preempted after" in err and "every training task saved the agreed checkpoint" in err
    assert f"tfl resume {run}" in err
    assert tfl_processes(home=str(tfl_home)) == []
    view = json.loads(tfl(["status", run, "--json"], child_env).stdout)
    assert view["state"] == "preempted" and {t["state"] for t in view["tasks"]} == {"preempted"}

    resumed = tfl(["resume", run], child_env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert started_at(tfl_home, "chief-0", 1) > 0 and started_at(tfl_home, "worker-0", 1) > 0
    assert "done worker:0 at step 120" in resumed.stdout  # its output, from this attempt only
    assert "start chief:0 attempt 0" not in resumed.stdout
    assert "resumed by `tfl resume` (the run was preempted: preempted: tfl got SIGTERM" in resumed.stderr
    again = tfl(["resume", run], child_env)
    assert again.returncode == 2 and again.stderr.strip() == (
        f"tfl: error: run {run} succeeded: there is nothing to resume (launch the job again for a new run)")


def test_stop_then_resume_detached_and_the_refusals(saver: str, child_env: dict[str, str], tfl_home: Path) -> None:
    # Steps enough that neither attempt ends by itself (400 did: the resumed one finished before
    # the second `tfl stop` under load): only the stops end them.
    started = tfl(["launch", saver, "--local", "2", "--detach", "--", "100000"], child_env)
    run = started.stdout.strip()
    assert started.returncode == 0, started.stderr
    wait_for(lambda: running(tfl_home))
    busy = tfl(["resume", run], child_env)
    assert busy.returncode == 2 and busy.stderr.startswith(f"tfl: error: run {run} is still running (launcher pid ")
    assert f"`tfl stop {run}`" in busy.stderr and len(busy.stderr.strip().splitlines()) == 1

    launcher_pid = RunStore(tfl_home).load(run).launcher_pid or 0
    os.kill(launcher_pid, signal.SIGKILL)  # its tasks live on
    wait_for(lambda: not os.path.exists(f"/proc/{launcher_pid}") or _zombie(launcher_pid))
    orphaned = tfl(["resume", run], child_env)
    assert orphaned.returncode == 2 and orphaned.stderr.strip() == (
        f"tfl: error: run {run}: its launcher is gone but 2 task(s) still run (chief:0, worker:0): "
        f"stop them first with `tfl stop {run}`, then resume")
    assert len(tfl_processes(home=str(tfl_home))) == 2  # the refusal touched nothing

    stopped = tfl(["stop", run], child_env)
    assert stopped.returncode == 0 and "stopped 2 process(es)" in stopped.stdout
    step = int(Path(tfl_home / "runs" / run / "saved-chief-0").read_text())
    assert step > 0  # the notice reached the tasks and they saved

    resumed = tfl(["resume", run, "--detach"], child_env)
    assert resumed.returncode == 0 and resumed.stdout.strip() == run, resumed.stderr
    wait_for(lambda: running(tfl_home, attempt=1))
    assert started_at(tfl_home, "chief-0", 1) == step
    stop_again = tfl(["stop", run], child_env)  # a resumed run stops like any other, and saves again
    assert stop_again.returncode == 0 and stop_again.stdout.strip() == f"run {run}: stopped"
    record = RunStore(tfl_home).load(run)
    assert record.state.value == "stopped" and record.exit_code == 130 and record.attempt == 1
    assert (record.message or "").startswith("stopped by the user; every training task saved the agreed checkpoint")
    assert [r.kind for r in record.restarts] == ["resume"]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
