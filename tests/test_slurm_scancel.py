"""An outside `scancel JOB` of a whole Slurm job is said about the run, not blamed on a task: tfl said
`chief:0 on n1 failed: Slurm step 3.0 was cancelled outside tfl` (or `worker:0 on n2 failed: killed by
SIGTERM`, the task srun reported first), naming a task that did nothing wrong."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.slurm_cluster import SlurmCluster
from tests.test_slurm_runs import assert_all_gone, description, job_id_of, only_run, sleeper, tfl, wait_status

pytestmark = pytest.mark.slurm


def test_an_outside_scancel_of_the_job_is_the_runs_cause_not_a_tasks(slurm_cluster: SlurmCluster, tfl_home: Path,
                                                                    tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", sleeper(tmp_path), "--cluster",
                                 str(description(tmp_path)), "--", "ok", "300"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        slurm_cluster.wait_for("the run", lambda: list(tfl_home.glob("runs/*/state.json")) != [])
        run = only_run(tfl_home)
        wait_status(env, run.name, lambda v: v["alive"] == 2, running=2)
        job = job_id_of(run)
        slurm_cluster.run("scancel", job)  # from another terminal: the whole job, not tfl's stop
        _, err = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
            launcher.communicate(timeout=60)
    assert launcher.returncode == 1, err[-3000:]
    cancelled = f"Slurm job {job} was cancelled outside tfl (scancel at "
    end = next(line for line in err.splitlines() if line.startswith(f"tfl: run {run.name} failed after "))
    assert end.split(": ", 2)[2].startswith(cancelled), err[-3000:]
    assert f"\n  root cause: {cancelled}" in err, err[-3000:]
    assert "chief:0 on n1" not in err and "worker:0 on n2" not in err, err[-3000:]  # no task did anything wrong
    said = tfl(env, "status", run.name).stdout
    assert f"\n  {cancelled}" in said and " failed: " not in said, said
    assert_all_gone(slurm_cluster, job)
