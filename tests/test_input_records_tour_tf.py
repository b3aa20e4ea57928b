"""The TFRecord job (jobs/fashion_records.py) under `tfl` as a user meets it: README's tour, then
`tfl stop` and `tfl resume`. Real TensorFlow, float64, 600 Fashion-MNIST examples as PNG in 3 shards.

The tour (module fixture): jobs/prepare_fashion_records.py writes the shards; `tfl launch --local 2
--evaluator` trains on them; while the chief and the worker hold at a chosen step (tests/jobs/held.py:
the run is known to be mid-training, whatever the machine's speed) `tfl status RUN` and `tfl status`;
afterwards `tfl logs RUN --task chief:0`, `tfl tensorboard RUN` (ended by Ctrl-C) and `tfl rm RUN`.
The held run trains as an unheld one, so its losses are the control of the stop-and-resume test:
every epoch that ran wholly after `tfl resume` must report the control's loss within 1e-6.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from launcher.describe.ports import free_port
from launcher.records.store import RunStore
from tests.jobkit_helpers import FASHION_RECORDS_JOB, HELD_JOB, Hold, write_fashion_shards
from tests.procs import assert_none_left, pid_alive, tfl_processes
from tests.test_preemption_e2e_tf import env_for, notice_taken, tfl, wait_until

pytestmark = pytest.mark.slow

JOB = str(FASHION_RECORDS_JOB)
EPOCHS, STEPS, HOLD_AT = 4, 10, 6
EPOCH_LINE = re.compile(r"^(?:\[chief:0\] +)?epoch (\d+)/\d+ loss=([0-9.]+)", re.M)
TOLERANCE = 1e-6
TIMEOUT = 400


def job_args(records: Path) -> list[str]:
    return ["--records", str(records), "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch-size", "8",
            "--dtype", "float64", "--seed", "11", "--window", "64", "--backup-every-steps", "4",
            "--steps-per-execution", "1"]


def losses_in(text: str) -> dict[int, float]:
    """{epoch: loss} of the chief's epoch lines (a later attempt's win)."""
    return {int(m[1]): float(m[2]) for m in EPOCH_LINE.finditer(text)}


@dataclass
class Tour:
    records: Path
    prepared: subprocess.CompletedProcess[str]
    run: str
    launch: subprocess.CompletedProcess[str]
    held_at: int
    status_run: subprocess.CompletedProcess[str]
    status_all: subprocess.CompletedProcess[str]
    logs: subprocess.CompletedProcess[str]
    tensorboard_first_line: str
    tensorboard_exit: int
    tensorboard_left: bool
    rm: subprocess.CompletedProcess[str]
    manifest: dict[str, object]
    losses: dict[int, float]
    run_dir_after_rm: bool


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tour]:
    home = tmp_path_factory.mktemp("tour") / "tfl-home"
    env = env_for(home)
    records = home.parent / "fashion-records"
    prepared = write_fashion_shards(records, env)
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    hold = Hold(home.parent / "hold", HOLD_AT)
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(HELD_JOB), "--local", "2", "--evaluator",
                                 "--", JOB, *job_args(records)], env={**env, **hold.env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        held = hold.wait(["chief:0", "worker:0"], alive=lambda: launcher.poll() is None,
                         why=lambda: launcher.communicate()[1][-4000:], timeout_s=TIMEOUT)
        (run,) = [p.name for p in (home / "runs").iterdir()]
        status_run, status_all = tfl(["status", run], env, timeout=60), tfl(["status"], env, timeout=60)
        hold.release()
        out, err = launcher.communicate(timeout=TIMEOUT)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    launch = subprocess.CompletedProcess(launcher.args, launcher.returncode, out, err)
    logs = tfl(["logs", run, "--task", "chief:0"], env, timeout=60)
    model = home / "runs" / run / "model"
    manifest = json.loads((model / "input_records.json").read_text()) if (model / "input_records.json").exists() else {}
    losses = losses_in((home / "runs" / run / "logs" / "chief-0.log").read_text())
    first_line, board_exit, board_left = tensorboard(run, env)
    rm = tfl(["rm", run], env, timeout=60)
    yield Tour(records, prepared, run, launch, held["chief:0"], status_run, status_all, logs, first_line, board_exit,
               board_left, rm, manifest, losses, (home / "runs" / run).exists())
    assert_none_left(str(home))


def tensorboard(run: str, env: dict[str, str]) -> tuple[str, int, bool]:
    """`tfl tensorboard RUN`, then Ctrl-C: its first line, its exit code, and whether its TensorBoard outlived it."""
    board = subprocess.Popen([sys.executable, "-m", "launcher", "tensorboard", run, "--port", str(free_port())], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert board.stdout is not None
        first = board.stdout.readline()
        children = [p.pid for p in psutil.Process(board.pid).children(recursive=True)]
        board.send_signal(signal.SIGINT)
        board.communicate(timeout=60)
    finally:
        if board.poll() is None:
            board.kill()
            board.communicate()
    return first, board.returncode, any(pid_alive(pid) for pid in children)


def test_the_prepare_script_writes_the_shards(tour: Tour) -> None:
    assert tour.prepared.stdout.splitlines()[-1] == f"wrote 600 examples in 3 shards to {tour.records}", tour.prepared.stdout
    assert sorted(p.name for p in tour.records.iterdir()) == [f"train-0000{i}-of-00003.tfrecord" for i in range(3)]


def test_the_launch_trains_on_the_shards_and_ends_0(tour: Tour) -> None:
    assert tour.launch.returncode == 0, tour.launch.stderr[-4000:]
    assert tour.launch.stderr.startswith(f"tfl: run {tour.run}: chief:0, worker:0, evaluator:0;"), tour.launch.stderr[:500]
    assert f"tfl: run {tour.run} succeeded in " in tour.launch.stderr and "(0 restart(s))" in tour.launch.stderr
    for epoch in range(1, EPOCHS + 1):  # streamed to the console with the tasks' prefixes
        assert re.search(rf"^\[chief:0\] +epoch {epoch}/{EPOCHS} loss=", tour.launch.stdout, re.M), epoch
        assert re.search(rf"^\[worker:0\] +epoch {epoch}/{EPOCHS} loss=", tour.launch.stdout, re.M), epoch
    assert re.search(rf"^\[evaluator:0\] +eval checkpoint=ckpt-{EPOCHS} ", tour.launch.stdout, re.M), tour.launch.stdout[-3000:]
    assert "strategy=MultiWorkerMirroredStrategy replicas=2" in tour.launch.stdout
    assert sorted(tour.losses) == list(range(1, EPOCHS + 1))
    # The kit learnt the shards' record counts once and kept them beside the run.
    assert [(s["name"], s["records"]) for s in tour.manifest["shards"]] == [  # type: ignore[index, union-attr]
        (f"train-0000{i}-of-00003.tfrecord", 200) for i in range(3)]


def test_status_during_training_shows_the_run_and_its_tasks(tour: Tour) -> None:
    assert tour.status_run.returncode == 0 and tour.status_all.returncode == 0, tour.status_run.stderr
    lines = tour.status_run.stdout.splitlines()
    assert re.match(rf"run {tour.run}  running  \(3/3 tasks alive, ", lines[0]), tour.status_run.stdout
    header = next(i for i, line in enumerate(lines) if line.startswith("TASK "))
    rows = {line.split()[0]: line.split() for line in lines[header + 1:]}
    assert set(rows) == {"chief:0", "worker:0", "evaluator:0"}, lines
    assert all(row[2] == "running" for row in rows.values()), lines
    assert tour.held_at == HOLD_AT  # one step per call: held right at step 6 of 10, in epoch 1
    assert " ".join(rows["chief:0"]).count(f"epoch 1/{EPOCHS} step ") == 1, lines
    (row,) = [line for line in tour.status_all.stdout.splitlines() if line.startswith(tour.run)]
    # The job tfl started is the hold's wrapper (tests/jobs/held.py), which runs jobs/fashion_records.py.
    assert row.split()[1:4] == ["held.py", "running", "3/3"], tour.status_all.stdout


def test_logs_show_the_chiefs_epochs(tour: Tour) -> None:
    assert tour.logs.returncode == 0, tour.logs.stderr
    assert losses_in(tour.logs.stdout) == tour.losses
    assert all(line.startswith("[chief:0]") for line in tour.logs.stdout.splitlines() if line.strip()), tour.logs.stdout[:2000]


def test_tensorboard_serves_the_run_until_ctrl_c_and_rm_removes_it(tour: Tour) -> None:
    assert tour.tensorboard_first_line.startswith(f"TensorBoard for run {tour.run}: http://127.0.0.1:"), tour.tensorboard_first_line
    assert tour.tensorboard_exit in (0, 130) and not tour.tensorboard_left
    assert tour.rm.returncode == 0 and tour.rm.stdout.startswith(f"removed {tour.run} ("), tour.rm.stdout + tour.rm.stderr
    assert not tour.run_dir_after_rm


def test_stop_then_resume_trains_like_the_uninterrupted_run(tour: Tour, tfl_home: Path) -> None:
    env = env_for(tfl_home)
    hold = Hold(tfl_home.parent / "hold", HOLD_AT)  # the moment: both hold at step 6 of 40 while `tfl stop` comes
    started = tfl(["launch", str(HELD_JOB), "--local", "2", "--detach", "--", JOB, *job_args(tour.records)],
                  {**env, **hold.env})
    run = started.stdout.strip()
    assert started.returncode == 0, started.stderr
    held = hold.wait(["chief:0", "worker:0"], alive=lambda: True, timeout_s=TIMEOUT)
    assert held == {"chief:0": HOLD_AT, "worker:0": HOLD_AT}, held  # one step per call
    stopping = subprocess.Popen([sys.executable, "-m", "launcher", "stop", run], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    wait_until(lambda: notice_taken(tfl_home, "chief:0") and notice_taken(tfl_home, "worker:0"), "the notices")
    hold.release()
    out, err = stopping.communicate(timeout=TIMEOUT)
    assert stopping.returncode == 0 and out.strip() == f"run {run}: stopped", out + err
    record = RunStore(tfl_home).load(run)
    assert record.state.value == "stopped" and {t.state.value for t in record.tasks} == {"preempted"}, record.message
    assert tfl_processes(home=str(tfl_home)) == []
    model = tfl_home / "runs" / run / "model"
    saved = json.loads((model / "preempted.json").read_text())["global_step"]
    assert HOLD_AT <= saved <= HOLD_AT + 2, saved  # the agreed step: at most two calls after the hold

    resumed = tfl(["resume", run], env)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    line = next(ln for ln in resumed.stdout.splitlines() if "resuming at global step" in ln)
    assert f"resuming at global step {saved}:" in line and "the input starts there (a seek to its file and record" in line, line
    got = losses_in((tfl_home / "runs" / run / "logs" / "chief-0.log").read_text())
    later = range((saved - 1) // STEPS + 2, EPOCHS + 1)  # the epochs wholly after the resume: 2 to 4
    assert list(later) == [2, 3, 4], saved
    for epoch in later:
        assert got[epoch] == pytest.approx(tour.losses[epoch], abs=TOLERANCE), (epoch, got, tour.losses)
    assert json.loads((model / "training_done.json").read_text())["global_step"] == EPOCHS * STEPS
