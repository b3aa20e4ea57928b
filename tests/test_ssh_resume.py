"""`tfl stop` then `tfl resume` of a run on two SSH hosts with shared storage (real sshd on loopback
hosts, the tiny saver job of ``test_preemption_lifecycle``, which saves into the model dir as the
job kit does): the stop's notice reaches the remote tasks, which save; the resume starts the next
attempt on both hosts at the saved step. That TensorFlow then trains like the uninterrupted run is
the job's part (tests/test_input_records_tour_tf.py compares the losses); by hand, jobs/mnist.py
over these two hosts, stopped at step 50 of 90 and resumed, reported epoch 3's loss as the
uninterrupted run (0.123879 both)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from launcher.describe.ports import free_port
from launcher.records.store import RunStore
from tests.sshd import Sshd, cluster_file
from tests.test_lifecycle import wait_for
from tests.test_preemption_lifecycle import SAVER, running, started_at, tfl

pytestmark = pytest.mark.ssh
# The saver's state on the shared model dir, where a job keeps its checkpoints, not in the host's run dir.
SHARED_SAVER = textwrap.dedent(SAVER).replace('run_dir = os.environ["TFL_RUN_DIR"]',
                                              'run_dir = os.environ["TFL_MODEL_DIR"]; os.makedirs(run_dir, exist_ok=True)')


def test_stop_then_resume_on_two_ssh_hosts_starts_both_at_the_saved_step(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                                         child_env: dict[str, str]) -> None:
    assert "TFL_MODEL_DIR" in SHARED_SAVER
    job = tmp_path / "saver.py"
    job.write_text(SHARED_SAVER)
    shared = tmp_path / "shared"
    tasks = {"chief": [f"127.0.0.2:{free_port()}"], "worker": [f"127.0.0.3:{free_port()}"]}
    cluster = cluster_file(tmp_path / "c.json", sshd, tasks, {"127.0.0.2": None, "127.0.0.3": None},
                           storage={"path": str(shared)})
    started = tfl(["launch", str(job), "--cluster", str(cluster), "--detach", "--", "100000"], child_env)
    run = started.stdout.strip()
    assert started.returncode == 0, started.stderr
    wait_for(lambda: running(tfl_home))

    stopped = tfl(["stop", run], child_env)
    assert stopped.returncode == 0 and stopped.stdout.strip() == f"run {run}: stopped", stopped.stdout + stopped.stderr
    record = RunStore(tfl_home).load(run)
    assert record.state.value == "stopped" and {t.state.value for t in record.tasks} == {"preempted"}, record.message
    (saved,) = shared.rglob("saved-chief-0")
    step = int(saved.read_text())
    assert step > 0 and int((saved.parent / "saved-worker-0").read_text()) > 0  # both remote tasks had the notice

    resumed = tfl(["resume", run, "--detach"], child_env)
    assert resumed.returncode == 0 and resumed.stdout.strip() == run, resumed.stderr
    wait_for(lambda: running(tfl_home, attempt=1))
    assert started_at(tfl_home, "chief-0", 1) == step
    assert started_at(tfl_home, "worker-0", 1) == int((saved.parent / "saved-worker-0").read_text())
    again = tfl(["stop", run], child_env)
    assert again.returncode == 0, again.stdout + again.stderr
    record = RunStore(tfl_home).load(run)
    assert record.state.value == "stopped" and record.attempt == 1 and [r.kind for r in record.restarts] == ["resume"]
