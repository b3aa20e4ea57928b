"""Preemption of a tfl run on the private Slurm cluster (tests/slurm_cluster.py), end to end
through ``tfl launch``: the notice from ``scancel --signal=TERM --batch`` (what
``slurm.preemption_notice`` makes Slurm send before the time limit), and Slurm's own
preemption (partition_prio, PreemptMode=REQUEUE, GraceTime) with the job requeued.

The job is a stand-in for the job kit: on SIGTERM it notes the signal and exits 170, as the
kit does after the agreed checkpoint. Each test proves that nothing of its job is left.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.jobkit_helpers import HELD_JOB, Hold
from tests.procs import tfl_processes
from tests.slurm_cluster import URGENT, SlurmCluster, start_cluster, stop_cluster
from tests.test_slurm_runs import MNIST, TF_ENV, assert_all_gone, job_id_of, mnist_data, only_run, status

__all__ = ["mnist_data"]  # the module's data fixture, shared

pytestmark = pytest.mark.slurm

# Attempt 0 waits for the notice (SIGTERM), notes it and leaves with the preempted code;
# later attempts note that they run and end well.
NOTICED = """\
import os, signal, sys, time
task, attempt, run_dir = os.environ["TFL_TASK"], os.environ["TFL_ATTEMPT"], os.environ["TFL_RUN_DIR"]
print(f"{task} attempt {attempt} on {os.environ['SLURMD_NODENAME']}", flush=True)
if attempt != "0":
    sys.exit(0)
def noticed(signum, frame):
    with open(os.path.join(run_dir, f"noticed-{task.replace(':', '-')}"), "a") as f:
        f.write(f"{signal.Signals(signum).name} {time.time()}\\n")
    sys.exit(170)
signal.signal(signal.SIGTERM, noticed)
open(os.path.join(run_dir, f"waiting-{task.replace(':', '-')}"), "w").close()
time.sleep(300)
sys.exit(1)
"""


# The job kit's notice watch without TensorFlow: a training task inside `fit` (its TF_CONFIG port
# listens, as TensorFlow's server does, and steps end every 20 ms). When the kit records a notice the
# task "saves", meets the others at a barrier (files in the run dir) and exits 170, as the kit does
# after the agreed checkpoint: no task leaves before every task has its notice. A teardown the kit
# ends itself.
KIT_STAND_IN = """\
import glob, os, socket, sys, time
from launcher.jobkit import notice
from launcher.jobkit.context import task_context
context = task_context(os.environ)
if context.attempt:
    sys.exit(0)
host, _, port = context.cluster[context.task_type][context.task_index].rpartition(":")
server = socket.create_server((host, int(port)))
notice.exit_on_notice(context, "before training began")
notice.training_begins()
run_dir, slug = os.environ["TFL_RUN_DIR"], f"{context.task_type}-{context.task_index}"
open(os.path.join(run_dir, f"waiting-{slug}"), "w").close()
while not notice.received():
    time.sleep(0.02)
    notice.step_done()
notice.saving()
print(f"{context.label}: the agreed checkpoint is saved", flush=True)
open(os.path.join(run_dir, f"saved-{slug}"), "w").close()
while len(glob.glob(os.path.join(run_dir, "saved-*"))) < context.num_training_tasks:
    time.sleep(0.02)
notice.leave_now(170)
"""


def launch(env: dict[str, str], tmp_path: Path, job_text: str = NOTICED, **slurm: Any) -> subprocess.Popen[str]:
    job = tmp_path / "noticed.py"
    job.write_text(job_text)
    desc = tmp_path / "slurm.json"
    desc.write_text(json.dumps({"slurm": {"nodes": 2, "tasks_per_node": 1, **slurm}}))
    return subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--cluster", str(desc),
                             "--max-restarts", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT)


def wait_both_waiting(cluster: SlurmCluster, home: Path, launcher: subprocess.Popen[str]) -> Path:
    def ready() -> bool:
        assert launcher.poll() is None, launcher.communicate()
        return len(list(home.glob("runs/*/waiting-*"))) == 2
    cluster.wait_for("both training tasks", ready, timeout=120)
    return only_run(home)


def finish(launcher: subprocess.Popen[str], timeout: float = 240) -> tuple[str, str]:
    try:
        return launcher.communicate(timeout=timeout)
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
            launcher.communicate(timeout=60)


def test_notice_to_the_batch_script_reaches_every_task_and_the_group_goes_on(
        slurm_cluster: SlurmCluster, tfl_home: Path, tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    launcher = launch(env, tmp_path, preemption_notice=60)
    try:
        run = wait_both_waiting(slurm_cluster, tfl_home, launcher)
        job_id = job_id_of(run)
        noticed_at = time.time()
        slurm_cluster.run("scancel", "--signal=TERM", "--batch", job_id)  # the batch shell only, as --signal=B:TERM@60
    finally:
        out, err = finish(launcher)
    assert launcher.returncode == 0, err  # --max-restarts 0: a preemption is no failure
    for task in ("chief-0", "worker-0"):  # every training task got SIGTERM, once, from the script
        (line,) = (run / f"noticed-{task}").read_text().splitlines()
        assert line.startswith("SIGTERM ") and float(line.split()[1]) >= noticed_at
    events = (run / "slurm" / "events").read_text().splitlines()
    assert events[:4] == ["training 0 start", "training 0 exit 170", "training 1 start", "training 1 exit 0"]
    assert "tfl: training preempted; restart without counting (1 of at most 100 preemptions)" in \
        (run / "slurm" / f"batch-{job_id}.out").read_text()
    assert "#SBATCH --signal=B:TERM@60" in (run / "slurm" / "job.sbatch").read_text()
    view = status(env, run.name)
    assert view["state"] == "succeeded" and [t["attempt"] for t in view["tasks"]] == [1, 1]
    assert "preempted" in err  # the restart's reason: the task saved and left with 170
    restarts = json.loads((run / "state.json").read_text())["restarts"]
    assert [r["kind"] for r in restarts] == ["preemption"], restarts  # not counted against --max-restarts
    assert_all_gone(slurm_cluster, job_id)


def test_a_failed_tasks_teardown_reaches_the_kit_as_a_teardown_not_a_notice(
        slurm_cluster: SlurmCluster, tfl_home: Path, tmp_path: Path) -> None:
    """srun --kill-on-bad-exit ends the survivor with SIGTERM, the signal of a notice: the kit sees
    that its peer is gone and ends at once, instead of waiting for an agreement that cannot come."""
    env = {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    launcher = launch(env, tmp_path, KIT_STAND_IN)
    try:
        run = wait_both_waiting(slurm_cluster, tfl_home, launcher)  # both inside "fit": the moment is the test's
        (victim,) = [p for p in tfl_processes(home=str(tfl_home)) if p.environ().get("TFL_TASK") == "worker:0"]
        victim.send_signal(signal.SIGKILL)
    finally:
        _, err = finish(launcher)
    assert launcher.returncode == 1, err
    chief = (run / "logs" / "chief-0.log").read_text()
    assert re.search(r"jobkit: SIGTERM while the training task at \S+ is gone: a teardown", chief), chief
    assert "jobkit: preemption notice" not in chief and "agreed checkpoint is saved" not in chief
    srun_err = (run / "slurm" / "training-0.err").read_text()
    assert "task 1: Killed" in srun_err and "task 0: Terminated" in srun_err, srun_err  # SIGTERM's own end: 143
    assert "worker:0 on n2 failed: killed by SIGKILL" in err and "stopped because of it: chief:0" in err, err
    assert (run / "slurm" / "events").read_text().splitlines()[:2] == ["training 0 start", "training 0 exit 143"]
    assert_all_gone(slurm_cluster, job_id_of(run))


def test_a_notice_reaches_the_kit_as_a_notice_while_every_peer_runs(
        slurm_cluster: SlurmCluster, tfl_home: Path, tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    launcher = launch(env, tmp_path, KIT_STAND_IN, preemption_notice=60)
    try:
        run = wait_both_waiting(slurm_cluster, tfl_home, launcher)
        slurm_cluster.run("scancel", "--signal=TERM", "--batch", job_id_of(run))
    finally:
        _, err = finish(launcher)
    assert launcher.returncode == 0, err
    for task in ("chief-0", "worker-0"):
        log = (run / "logs" / f"{task}.log").read_text()
        assert "jobkit: preemption notice (SIGTERM); every training task stops" in log and "teardown" not in log, log
        assert "the agreed checkpoint is saved" in log
    events = (run / "slurm" / "events").read_text().splitlines()
    assert events[:4] == ["training 0 start", "training 0 exit 170", "training 1 start", "training 1 exit 0"]
    assert_all_gone(slurm_cluster, job_id_of(run))


@pytest.mark.slow
def test_slurm_preempts_the_job_which_is_requeued_and_goes_on(slurm_cluster: SlurmCluster, tfl_home: Path,
                                                              tmp_path: Path) -> None:
    """On a cluster of its own (``slurm_cluster`` only for its skip/fail rule), with two
    partitions: a job in URGENT (PriorityTier 2) preempts tfl's in the default one."""
    cluster = start_cluster(tmp_path / "slurm", preemption=True)
    env = {**cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    try:
        launcher = launch(env, tmp_path, requeue=True)
        try:
            run = wait_both_waiting(cluster, tfl_home, launcher)
            job_id = job_id_of(run)
            preempted_at = time.time()
            urgent = cluster.sbatch(f"--partition={URGENT}", "--nodes=2", "--exclusive", "--output=/dev/null",
                                    "--wrap", "sleep 2")
        finally:
            out, err = finish(launcher)
        assert launcher.returncode == 0, err
        for task in ("chief-0", "worker-0"):  # Slurm's SIGTERM, straight to the tasks, at preemption
            (line,) = (run / f"noticed-{task}").read_text().splitlines()
            assert line.startswith("SIGTERM ") and float(line.split()[1]) >= preempted_at
        events = (run / "slurm" / "events").read_text().splitlines()
        assert events[:5] == ["training 0 start", "training 0 exit 170", "requeued 1", "training 1 start",
                              "training 1 exit 0"], events
        batch_out = (run / "slurm" / f"batch-{job_id}.out").read_text()
        assert f"tfl: Slurm preempts job {job_id}; it will be requeued" in batch_out  # appended to, not replaced
        assert "DUE TO PREEMPTION" in batch_out
        assert cluster.job_field(urgent, "%T") in ("COMPLETED", "")
        view = status(env, run.name)
        assert view["state"] == "succeeded" and [t["attempt"] for t in view["tasks"]] == [1, 1]
        assert view["backend_state"]["requeued"] == "1 time(s) by Slurm", view["backend_state"]
        record = json.loads((run / "state.json").read_text())
        assert [r["kind"] for r in record["restarts"]] == ["preemption"], record["restarts"]
        logs = (run / "logs" / "chief-0.log").read_text()
        assert "chief:0 attempt 0 on" in logs and "chief:0 attempt 1 on" in logs
        assert_all_gone(cluster, job_id)
    finally:
        stop_cluster(cluster)


def test_stop_then_resume_submits_the_next_attempt(slurm_cluster: SlurmCluster, tfl_home: Path, tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    launcher = launch(env, tmp_path)
    try:
        run = wait_both_waiting(slurm_cluster, tfl_home, launcher)
        first_job = job_id_of(run)
        stopped = subprocess.run([sys.executable, "-m", "launcher", "stop", run.name], env=env, capture_output=True,
                                 text=True, timeout=120, cwd=ROOT)
        assert stopped.returncode == 0, stopped.stderr
    finally:
        _, err = finish(launcher)
    assert launcher.returncode != 0 and status(env, run.name)["state"] == "stopped", err
    for task in ("chief-0", "worker-0"):  # tfl stop's SIGTERM reached the job's own handler
        assert (run / f"noticed-{task}").read_text().startswith("SIGTERM ")
    assert_all_gone(slurm_cluster, first_job)
    resumed = subprocess.run([sys.executable, "-m", "launcher", "resume", run.name], env=env, capture_output=True,
                             text=True, timeout=240, cwd=ROOT)
    assert resumed.returncode == 0, resumed.stderr
    second_job = job_id_of(run)
    assert second_job != first_job  # a new job, the same run dir
    assert (run / "slurm" / "first-attempt").read_text() == "1\n"
    assert (run / "slurm" / "events").read_text().splitlines()[:2] == ["training 1 start", "training 1 exit 0"]
    assert (run / "slurm" / "events-before-1").read_text().startswith("training 0 start\n")
    view = status(env, run.name)
    assert view["state"] == "succeeded" and [t["attempt"] for t in view["tasks"]] == [1, 1]
    assert "chief:0 attempt 1 on n1" in (run / "logs" / "chief-0.log").read_text()
    assert_all_gone(slurm_cluster, second_job)


@pytest.mark.slow
def test_real_tensorflow_saves_at_the_agreed_step_and_resumes_after_it(
        slurm_cluster: SlurmCluster, tfl_home: Path, tmp_path: Path, mnist_data: Path) -> None:
    """jobs/mnist.py on both nodes: the notice to the batch script mid-training; the job kit's
    agreed checkpoint, exit 170, the group again in the allocation, and no step lost.

    The moment: both tasks hold at step 6 of 36 (tests/jobs/held.py) while Slurm's notice reaches
    them, and go on only once each has taken it, so the agreed step comes long before the end on
    any machine (the notice sent after epoch 1 came after the last step on a fast one)."""
    env = {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    hold = Hold(tmp_path / "hold", 6)
    desc = tmp_path / "slurm.json"
    desc.write_text(json.dumps({"slurm": {"nodes": 2, "tasks_per_node": 1, "preemption_notice": 60},
                                "env": {**TF_ENV, **hold.env}}))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launcher", "launch", str(HELD_JOB), "--cluster", str(desc), "--max-restarts", "0", "--",
         MNIST, "--epochs", "3", "--steps-per-epoch", "12", "--batch-size", "16", "--dtype", "float64", "--seed", "7",
         "--backup-every-steps", "4", "--data", str(mnist_data)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        held = hold.wait(["chief:0", "worker:0"], alive=lambda: launcher.poll() is None, timeout_s=240,
                         why=lambda: launcher.communicate()[1][-4000:])
        run = only_run(tfl_home)
        slurm_cluster.run("scancel", "--signal=TERM", "--batch", job_id_of(run))

        def noticed() -> bool:
            assert launcher.poll() is None, launcher.communicate()
            return all("jobkit: preemption notice (SIGTERM);" in (run / "logs" / f"{t}.log").read_text(errors="replace")
                       for t in ("chief-0", "worker-0"))
        slurm_cluster.wait_for("the notice in both tasks", noticed, timeout=120)
        hold.release()
    finally:
        out, err = finish(launcher, timeout=300)
    assert launcher.returncode == 0, err[-3000:]
    first, second = (run / "logs" / "chief-0.log").read_text().split("--- tfl: attempt 1 of chief:0")
    saved = re.search(r"jobkit: preempted; every training task saved at global step (\d+)", first)
    assert saved and int(saved[1]) >= max(held.values()), first[-3000:]
    assert f"jobkit: resuming at global step {saved[1]}:" in second  # the next step is the agreed one + 1: none lost
    assert json.loads((run / "model" / "training_done.json").read_text())["global_step"] == 36
    assert (run / "slurm" / "events").read_text().splitlines()[:3] == ["training 0 start", "training 0 exit 170",
                                                                       "training 1 start"]
    view = status(env, run.name)
    assert view["state"] == "succeeded" and [t["attempt"] for t in view["tasks"]] == [1, 1]
    assert_all_gone(slurm_cluster, job_id_of(run))
