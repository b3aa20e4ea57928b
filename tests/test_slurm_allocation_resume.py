"""`tfl resume` of a run launched inside an allocation (`salloc -N 2 --ntasks-per-node 1 tfl launch JOB --slurm`).

That allocation ends with the command it ran, so the resume runs in another one. It was refused
in every allocation, with a fix that could not be followed: "this launcher is not inside
allocation 31 (SLURM_JOB_ID differs); run tfl launch --slurm inside it", while the run's own
summary said "resume it from its last checkpoint: tfl resume RUN". Now the run's steps move to
the allocation the resume runs in when it has the run's shape, and are refused in one line with
the salloc to use otherwise.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.describe.hosts import RemoteOptions
from launcher.engines.slurm.node.batch import SlurmJobPlan
from launcher.engines.slurm.plan import build_slurm_plan, in_allocation
from launcher.engines.slurm.settings import allocation_cluster
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.run_options import SupervisorConfig
from tests.conftest import ROOT
from tests.slurm_cluster import SlurmCluster
from tests.test_slurm_runs import assert_all_gone, only_run, status, tfl

ALLOCATION = {"SLURM_JOB_ID": "31", "SLURM_TASKS_PER_NODE": "1(x2)"}
# Attempt 0 waits to be stopped; the resumed attempt says where it runs and ends.
JOB = """\
import os, time
attempt = os.environ["TFL_ATTEMPT"]
print(os.environ["TFL_TASK"], "attempt", attempt, "in job", os.environ["SLURM_JOB_ID"], flush=True)
time.sleep(600 if attempt == "0" else 0)
"""


def plan_in(environ: dict[str, str]) -> LaunchPlan:
    return build_slurm_plan(allocation_cluster(environ, evaluator=True), "job.py", (), run_id="r", run_dir="/runs/r",
                            python="python3", cwd="/work", remote=RemoteOptions(), virtual_devices=None,
                            config=SupervisorConfig())


def test_a_plan_inside_its_own_allocation_is_kept() -> None:
    plan = plan_in(ALLOCATION)
    assert in_allocation(plan, ALLOCATION) is plan


def test_a_resume_inside_another_allocation_of_the_same_shape_moves_there() -> None:
    plan = plan_in(ALLOCATION)
    moved = in_allocation(plan, {"SLURM_JOB_ID": "32", "SLURM_TASKS_PER_NODE": "1(x2)"})
    assert isinstance(moved, LaunchPlan) and isinstance(moved.unit, SlurmJobPlan) and moved.unit.allocation == "32"
    assert moved.tasks == plan.tasks and dataclasses.replace(moved.unit, allocation="31") == plan.unit


@pytest.mark.parametrize(("environ", "where"), [
    ({}, "no allocation here"),
    ({"SLURM_JOB_ID": "32", "SLURM_TASKS_PER_NODE": "2"}, "allocation 32 has 2 tasks per node"),
    ({"SLURM_JOB_ID": "32", "SLURM_TASKS_PER_NODE": "1(x3)"}, "allocation 32 has 1(x3) tasks per node"),
])
def test_a_resume_elsewhere_is_one_line_with_the_salloc_to_use(environ: dict[str, str], where: str) -> None:
    said = in_allocation(plan_in(ALLOCATION), environ)
    assert said == (f"run r ran inside allocation 31 (2 node(s) x 1 task(s)) and {where}; resume it inside an "
                    "allocation of that shape: `salloc -N 2 --ntasks-per-node 1 tfl resume r`")


@pytest.mark.slurm
def test_a_run_stopped_inside_salloc_resumes_inside_a_new_one(slurm_cluster: SlurmCluster, tfl_home: Path,
                                                                tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    job = tmp_path / "job.py"
    job.write_text(JOB)
    salloc = ["salloc", "-N", "2", "--ntasks-per-node", "1", sys.executable, "-m", "launcher"]
    first = subprocess.Popen([*salloc, "launch", str(job), "--slurm"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        slurm_cluster.wait_for("both tasks", lambda: all(
            "attempt 0" in (p.read_text() if p.exists() else "")
            for run in tfl_home.glob("runs/*") for p in (run / "logs" / "chief-0.log", run / "logs" / "worker-0.log")
        ) and list(tfl_home.glob("runs/*")) != [], timeout=120)
        run = only_run(tfl_home).name
        assert tfl(env, "stop", run).returncode == 0
        _, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 130, err
    old = re.search(r"Granted job allocation (\d+)", err)
    assert old, err
    outside = tfl(env, "resume", run)
    assert outside.returncode == 2 and f"salloc -N 2 --ntasks-per-node 1 tfl resume {run}" in outside.stderr, outside.stderr
    resumed = subprocess.run([*salloc, "resume", run], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    new = re.search(r"Granted job allocation (\d+)", resumed.stderr)
    assert new and new[1] != old[1], resumed.stderr
    for task in ("chief-0", "worker-0"):
        log = (tfl_home / "runs" / run / "logs" / f"{task}.log").read_text()
        assert f"attempt 1 in job {new[1]}" in log, log
    view = status(env, run)
    assert view["state"] == "succeeded" and view["backend_state"]["allocation"] == new[1]
    assert_all_gone(slurm_cluster, new[1])
