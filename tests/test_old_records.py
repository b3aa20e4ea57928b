"""Run records written by tfl before the stage-package move (main 9bbb15a) still work with today's code:
`tfl status` renders them, `tfl stop` and `tfl resume` behave as for any run in their state.

tests/data/records-9bbb15a/ holds real records, written by `tfl launch --local 2` of the tiny jobs beside
them under TFL_HOME=/tmp/tm-rec/home (and a `tfl stop` of the detached sleeper). They are copied here into a
private run store, with the paths they name (home, job, python, working dir) moved to this machine's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from launcher.records.states import RunState
from launcher.records.store import RunStore

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "records-9bbb15a"
# Where the records were written: the store, the job scripts, the python and working dir of the launch.
RECORDED_HOME, RECORDED_JOBS = "/tmp/tm-rec/home", "/tmp/tm-rec/"
RECORDED_PYTHON, RECORDED_CWD = "/work/wt-tree-move/.venv/bin/python", "/work/wt-tree-move"
OK = "ok_job-20261125-191209-08731484eef3"
FAILED = "fail_job-20261125-191236-1de8431f4d28"
STOPPED = "sleep_job-20261125-191213-2e9129dbd17a"


def install(home: Path, jobs: Path) -> None:
    """The recorded store under `home`, its jobs under `jobs`, every recorded path moved."""
    shutil.copytree(DATA / "runs", home / "runs")
    jobs.mkdir()
    for job in DATA.glob("*.py"):
        shutil.copy(job, jobs / job.name)
    for path in (home / "runs").rglob("*.json"):
        text = (path.read_text().replace(RECORDED_HOME, str(home)).replace(RECORDED_JOBS, f"{jobs}/")
                .replace(RECORDED_PYTHON, sys.executable).replace(RECORDED_CWD, str(ROOT)))
        path.write_text(text)


def tfl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)


def test_the_records_of_main_9bbb15a_load_with_their_state(tfl_home: Path, tmp_path: Path) -> None:
    install(tfl_home, tmp_path / "jobs")
    store = RunStore(tfl_home)
    states = {run_id: store.load(run_id).state for run_id in (OK, FAILED, STOPPED)}
    assert states == {OK: RunState.SUCCEEDED, FAILED: RunState.FAILED, STOPPED: RunState.STOPPED}
    assert store.load(FAILED).failures[0].exit_code == 3


def test_status_stop_and_resume_of_old_records(tfl_home: Path, tmp_path: Path, child_env: dict[str, str]) -> None:
    install(tfl_home, tmp_path / "jobs")
    listing = tfl(child_env, "status")
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split()[2] for line in listing.stdout.splitlines()[1:]}
    assert rows == {OK: "succeeded", FAILED: "failed", STOPPED: "stopped"}, listing.stdout
    stopped = tfl(child_env, "status", STOPPED)
    assert stopped.returncode == 0 and "stopped by the user" in stopped.stdout, stopped.stdout + stopped.stderr
    failed = tfl(child_env, "status", FAILED)
    assert failed.returncode == 0 and "worker:0" in failed.stdout and "failed" in failed.stdout, failed.stdout
    as_json = json.loads(tfl(child_env, "status", OK, "--json").stdout)
    assert as_json["state"] == "succeeded", as_json

    # stop: every run here has ended; stop says so and changes nothing.
    for run_id, state in ((OK, "succeeded"), (FAILED, "failed"), (STOPPED, "stopped")):
        done = tfl(child_env, "stop", run_id)
        assert done.returncode == 0 and f"already {state}; nothing to stop" in done.stdout, done.stdout + done.stderr
        assert RunStore(tfl_home).load(run_id).state.value == state

    # resume: a succeeded run is refused; the failed one runs its next attempt (its job succeeds on attempt 1).
    refused = tfl(child_env, "resume", OK)
    assert refused.returncode == 2 and "there is nothing to resume" in refused.stderr, refused.stderr
    resumed = tfl(child_env, "resume", FAILED)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    record = RunStore(tfl_home).load(FAILED)
    assert (record.state, record.attempt, [r.attempt for r in record.restarts]) == (RunState.SUCCEEDED, 1, [1])
    assert {t.task: (t.attempt, t.exit_code) for t in record.tasks} == {"chief:0": (1, 0), "worker:0": (1, 0)}
    assert "attempt 1" in (tfl_home / "runs" / FAILED / "logs" / "worker-0.log").read_text()
    assert os.path.exists(tfl_home / "runs" / FAILED / "state.json")


def test_a_resumed_old_record_runs_and_stops(tfl_home: Path, tmp_path: Path, child_env: dict[str, str]) -> None:
    """The stopped sleeper resumed in the background (its next attempt), then `tfl stop`: stopped again, nothing left."""
    install(tfl_home, tmp_path / "jobs")
    started = tfl(child_env, "resume", STOPPED, "--detach", "--grace-period", "2")
    assert started.returncode == 0, started.stdout + started.stderr
    assert RunStore(tfl_home).load(STOPPED).attempt == 1
    done = tfl(child_env, "stop", STOPPED)
    assert done.returncode == 0 and "stopped" in done.stdout, done.stdout + done.stderr
    record = RunStore(tfl_home).load(STOPPED)
    assert record.state == RunState.STOPPED and [r.attempt for r in record.restarts] == [1]
    assert all(t.attempt == 1 and t.state.value == "stopped" for t in record.tasks), record.tasks


def test_a_recorded_slurm_plan_of_9bbb15a_runs_todays_task_driver() -> None:
    """A Slurm run's record keeps its whole batch script, which named the node driver by its old module
    (`python -m launcher.slurm.task`); `tfl resume` writes that script again, so the old name is read as today's.
    slurm_plan.json: LaunchPlan.to_dict() of a 2-node `slurm` description with an evaluator, built by 9bbb15a."""
    import importlib.util
    import re

    from launcher.plan.launch_plan import LaunchPlan

    recorded = json.loads((DATA / "slurm_plan.json").read_text())
    assert "-m launcher.slurm.task nodes" in recorded["unit"]["script"]  # what the old record says
    unit = LaunchPlan.from_dict(recorded).unit
    assert unit is not None and "launcher.slurm.task" not in unit.script
    lines = [unit.script, *(line for _, line in unit.steps)]
    modules = {m for text in lines for m in re.findall(r"-m (\S+)", text)}
    assert modules == {"launcher.engines.slurm.node.task"}
    assert all(importlib.util.find_spec(m) is not None for m in modules)
    assert len(re.findall(r"-m launcher\.engines\.slurm\.node\.task (?:nodes|training|evaluator)", unit.script)) >= 3
