"""Elastic runs on Slurm (issue 21, item 7), end to end on a private two-node cluster of this
module's own (tests/slurm_cluster.py): one slurmd is killed by pid mid-run, as a node lost
for good. The job, submitted with --no-kill, keeps its allocation; Slurm takes the silent node
out of the job (SlurmdTimeout = 6 s and MessageTimeout = 5 s on this module's cluster:
tests/slurm_cluster.py) and srun ends the training step; the batch script
starts the next attempt on the node left (--min-tasks 1), or ends naming the lost node
(--min-tasks 2).

On this machine the node's processes outlive its slurmd (both "nodes" are this host): each
test starts the slurmd again at its end, after which Slurm ends what was left of the job
there, and proves that no task, job or daemon is left.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.procs import tfl_processes
from tests.slurm_cluster import (
    LOST_NODE_MESSAGE_TIMEOUT,
    LOST_NODE_SLURMD_TIMEOUT,
    SBIN,
    SlurmCluster,
    _daemon,
    _nodes_idle,
    missing_packages,
    start_cluster,
    stop_cluster,
)
from tests.test_slurm_cluster import assert_job_gone
from tests.test_slurm_runs import EPOCH_LINE, MNIST, TF_ENV, epochs_in, job_id_of, mnist_data, only_run, status

pytestmark = pytest.mark.slurm
__all__ = ["mnist_data"]  # a fixture, used by name

# A job that checkpoints and resumes through a file in its run dir (on storage both nodes share):
# the chief writes the next step after each one; every attempt starts from it. Attempt 0 holds
# before its last step: only the lost node ends it, however long Slurm takes to notice. Steps of
# 0.05 s: the attempt after the loss counts what is left in a second or two (8 s at 0.25 s).
STEPPER = """\
import json, os, sys, time
from pathlib import Path
task, attempt, node = os.environ["TFL_TASK"], os.environ["TFL_ATTEMPT"], os.environ["SLURMD_NODENAME"]
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
size = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
saved = Path(os.environ["TFL_RUN_DIR"]) / "saved-step"
start = int(saved.read_text()) if saved.exists() else 0
print(f"{task} attempt {attempt} on {node} size {size} batch {os.environ.get('TFL_GLOBAL_BATCH')} from {start}", flush=True)
for step in range(start, int(sys.argv[1])):
    time.sleep(0.05)
    while attempt == "0" and step + 1 == int(sys.argv[1]):
        time.sleep(0.05)
    if task == "chief:0":
        saved.with_suffix(".tmp").write_text(str(step + 1))
        os.replace(saved.with_suffix(".tmp"), saved)
print(f"{task} done", flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A cluster of this module's own: a killed slurmd must not disturb the other Slurm tests."""
    missing = missing_packages()
    if missing:
        pytest.skip(f"Slurm not installed ({', '.join(missing)})")
    own = start_cluster(tmp_path_factory.mktemp("slurm-elastic"), slurmd_timeout=LOST_NODE_SLURMD_TIMEOUT,
                        message_timeout=LOST_NODE_MESSAGE_TIMEOUT)
    yield own
    stop_cluster(own)


def description(tmp_path: Path, **slurm: Any) -> Path:
    path = tmp_path / "slurm.json"
    path.write_text(json.dumps({"slurm": {"nodes": 2, "tasks_per_node": 1, **slurm}, "env": TF_ENV}))
    return path


def launch(cluster: SlurmCluster, home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "launcher", "launch", *args],
                            env={**cluster.env, "TFL_HOME": str(home), "PYTHONUNBUFFERED": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def kill_n2_when(cluster: SlurmCluster, launcher: subprocess.Popen[str], ready: Any, what: str,
                 down: bool = False) -> tuple[str, str]:
    """Kill n2's slurmd by pid once ``ready()``; the launcher's output once it has ended.
    ``down``: also set n2 DOWN at once (as a node health check would), instead of waiting for
    slurmctld to find its slurmd silent (SlurmdTimeout, up to ~1.5 x that)."""
    try:
        cluster.wait_for(what, lambda: launcher.poll() is not None or ready(), timeout=240)
        assert launcher.poll() is None, f"the run ended before {what}: {launcher.communicate()[1][-3000:]}"
        cluster.procs["n2"].kill()
        cluster.procs["n2"].wait(10)
        if down:
            cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=tfl-test")
        return launcher.communicate(timeout=400)
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
            launcher.communicate(timeout=60)


def bring_n2_back(cluster: SlurmCluster, home: Path) -> None:
    """n2's slurmd again: Slurm ends what was left of the job there; the node is idle again."""
    if cluster.procs["n2"].poll() is not None:
        cluster.procs["n2"] = _daemon(cluster, "slurmd-n2", [str(SBIN / "slurmd"), "-D", "-N", "n2"])
    cluster.wait_for("the lost node's tasks to end", lambda: not tfl_processes(home=str(home)), timeout=180)
    if "down" in cluster.run("sinfo", "-h", "-n", "n2", "-o", "%T").stdout:  # set DOWN by hand: back by hand
        cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
    cluster.wait_for("both nodes idle again", lambda: _nodes_idle(cluster), timeout=120)


def tfl(cluster: SlurmCluster, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env={**cluster.env, "TFL_HOME": str(home)},
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_a_lost_node_leaves_the_run_going_on_the_other(cluster: SlurmCluster, tfl_home: Path, tmp_path: Path) -> None:
    job = tmp_path / "stepper.py"
    job.write_text(STEPPER)
    launcher = launch(cluster, tfl_home, str(job), "--cluster", str(description(tmp_path)), "--min-tasks", "1",
                      "--global-batch", "64", "--", "40")
    saved = lambda: [int(p.read_text() or 0) for p in tfl_home.glob("runs/*/saved-step")]  # noqa: E731
    try:
        out, err = kill_n2_when(cluster, launcher, lambda: any(s >= 8 for s in saved()), "8 steps saved")
        assert launcher.returncode == 0, err[-3000:]
        run = only_run(tfl_home)
        job_id = job_id_of(run)
        # attempt 0 on both nodes; attempt 1 on n1 alone, from the saved step, the global batch kept
        assert re.search(r"^\[chief:0\] +chief:0 attempt 0 on n1 size 2 batch 64 from 0$", out, re.M), out[-3000:]
        resumed = re.search(r"^\[chief:0\] +chief:0 attempt 1 on n1 size 1 batch 64 from (\d+)$", out, re.M)
        assert resumed and int(resumed[1]) >= 8, out[-3000:]
        assert (run / "saved-step").read_text() == "40"
        events = (run / "slurm" / "events").read_text().splitlines()
        assert "lost 0 2 1 n1,n2 n1" in events and "training 1 start" in events and events[-1] == "end 0", events
        assert "#SBATCH --no-kill" in (run / "slurm" / "job.sbatch").read_text()
        assert "resize at attempt 1: 2 -> 1 training tasks; lost: n2 (node failure: Slurm took it out of job" in err, err
        assert "tfl: resize: 2 -> 1 training tasks; lost: n2 (node failure: Slurm took it out of job" in err, err  # live
        view = status({**cluster.env, "TFL_HOME": str(tfl_home)}, run.name)
        assert view["state"] == "succeeded" and view["restarts"] == 0 and view["min_tasks"] == 1
        assert (view["training_tasks"], view["full_training_tasks"]) == (1, 2)
        assert list(view["lost_hosts"]) == ["n2"]
        (resize,) = view["resizes"]
        assert (resize["attempt"], resize["from_tasks"], resize["to_tasks"], resize["hosts"]) == (1, 2, 1, ["n2"])
        assert [(t["task"], t["host"], t["exit_code"], t["attempt"]) for t in view["tasks"]] == [("chief:0", "n1", 0, 1)]
        text = tfl(cluster, tfl_home, "status", run.name).stdout
        assert "  elastic: 1 of 2 training tasks (--min-tasks 1); lost: n2 (node failure" in text, text
        assert "  resize at attempt 1: 2 -> 1 tasks; lost: n2" in text, text
        bring_n2_back(cluster, tfl_home)
        assert_job_gone(cluster, job_id)
    finally:
        bring_n2_back(cluster, tfl_home)


def test_below_the_minimum_the_run_fails_naming_the_lost_node(cluster: SlurmCluster, tfl_home: Path, tmp_path: Path) -> None:
    job = tmp_path / "stepper.py"
    job.write_text(STEPPER)
    launcher = launch(cluster, tfl_home, str(job), "--cluster", str(description(tmp_path)), "--min-tasks", "2",
                      "--global-batch", "64", "--", "40")
    try:  # n2 set DOWN at once: the silent slurmd's SlurmdTimeout is the test above's
        _, err = kill_n2_when(cluster, launcher, lambda: len(list(tfl_home.glob("runs/*/slurm/tasks/*.json"))) == 2,
                              "both tasks", down=True)
        assert launcher.returncode == 1, err[-3000:]
        run = only_run(tfl_home)
        job_id = job_id_of(run)
        assert f"worker:0 on n2 failed: node n2 failed: Slurm took it out of job {job_id}, which goes on (--no-kill)" in err, err
        assert "; 1 training task left, below --min-tasks 2 (lost: n2)\n" in err, err
        batch = (run / "slurm" / f"batch-{job_id}.out").read_text()
        assert "tfl: lost node(s) n2: 1 training task(s) left, below --min-tasks 2" in batch, batch
        events = (run / "slurm" / "events").read_text().splitlines()
        assert "lost 0 2 1 n1,n2 n1" in events and "training 1 start" not in events, events
        view = status({**cluster.env, "TFL_HOME": str(tfl_home)}, run.name)
        assert view["state"] == "failed" and view["resizes"] == []
        bring_n2_back(cluster, tfl_home)
        assert_job_gone(cluster, job_id)
    finally:
        bring_n2_back(cluster, tfl_home)


@pytest.mark.slow
def test_mnist_goes_on_on_the_node_left_from_its_checkpoint(cluster: SlurmCluster, tfl_home: Path, tmp_path: Path,
                                                           mnist_data: Path) -> None:
    """Real TensorFlow: MultiWorkerMirroredStrategy on both nodes, n2 lost after epoch 1 (its slurmd
    killed and the node set DOWN: mid-epoch 2, not after the few seconds' training has ended); the
    chief goes on alone (one replica) from the shared model dir's checkpoint, and ends 0."""
    launcher = launch(cluster, tfl_home, MNIST, "--cluster", str(description(tmp_path)), "--min-tasks", "1",
                      "--global-batch", "32", "--", "--epochs", "3", "--steps-per-epoch", "200", "--data", str(mnist_data))
    chief_log = lambda: [*tfl_home.glob("runs/*/logs/chief-0.log")]  # noqa: E731
    try:
        _, err = kill_n2_when(cluster, launcher, lambda: bool(chief_log()) and bool(epochs_in(chief_log()[0].read_text())),
                              "epoch 1", down=True)
        assert launcher.returncode == 0, err[-3000:]
        run = only_run(tfl_home)
        first, second = (run / "logs" / "chief-0.log").read_text().split("--- tfl: attempt 1 of chief:0")
        assert "strategy=MultiWorkerMirroredStrategy replicas=2" in first and "training_tasks=2 attempt=0" in first
        assert "replicas=1 devices=1xCPU training_tasks=1 attempt=1" in second  # alone: the kit's default strategy
        assert re.search(r"^jobkit: resuming at global step [1-9]\d*", second, re.M), second[-2000:]
        resumed = [int(m[1]) for m in EPOCH_LINE.finditer(second)]
        assert resumed and resumed[0] >= 2 and resumed[-1] == 3, second[-2000:]  # from the checkpoint, not epoch 1
        assert "resize at attempt 1: 2 -> 1 training tasks; lost: n2" in err, err
        bring_n2_back(cluster, tfl_home)
        assert_job_gone(cluster, job_id_of(run))
    finally:
        bring_n2_back(cluster, tfl_home)
