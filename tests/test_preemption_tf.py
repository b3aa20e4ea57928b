"""Preemption with real TensorFlow: one agreed checkpoint on a notice, and an exact resume.

A chief and a worker (jobs/mnist.py, float64, fixed seed, the offline digits) run as real
processes with TF_CONFIG on loopback ports, as the launcher starts them. A notice
(SIGTERM) to the chief, the worker or both at a random step: every training task exits
PREEMPTED_EXIT_CODE with the agreed checkpoint on disk; the group restarted as the next
attempt resumes at the step after it and trains exactly as an uninterrupted run (the
control, one step per call, whatever the interrupted run's steps per call): same per-epoch
loss after the interruption, same final weights. kill -9 of a worker plus a restart: the
steps since the last backup run again on the same batches, with the same result. SIGTERM to the evaluator leaves
training alone.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from launcher.contract import PREEMPTED_EXIT_CODE, PreemptedRecord
from launcher.describe.ports import free_ports
from tests.jobkit_helpers import (
    HELD_JOB,
    MNIST_JOB,
    Hold,
    JobProcess,
    assert_none_alive,
    kill_all,
    start_job,
    tf_config,
    wait_all,
)

pytestmark = pytest.mark.slow

EPOCHS, STEPS, BACKUP_EVERY = 3, 12, 4
TOLERANCE = 1e-6  # float64; measured: equal to the last digit printed
TIMEOUT_S = 240


def job_args(model_dir: Path, steps_per_call: int) -> list[str]:
    return ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch-size", "16", "--dtype", "float64",
            "--seed", "7", "--backup-every-steps", str(BACKUP_EVERY), "--steps-per-execution", str(steps_per_call),
            "--model-dir", str(model_dir), "--eval-idle-timeout", "60"]


@dataclass
class Group:
    jobs: dict[str, JobProcess]
    model_dir: Path

    @property
    def chief(self) -> JobProcess:
        return self.jobs["chief:0"]

    def codes(self) -> dict[str, int]:
        try:
            return wait_all(self.jobs.values(), timeout_s=TIMEOUT_S)
        finally:
            kill_all(self.jobs.values())
            assert_none_alive(self.jobs.values())

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{job.output()[-2500:]}" for name, job in self.jobs.items())


def start_group(base: Path, model_dir: Path, attempt: int, steps_per_call: int, *, evaluator: bool = False,
                hold: Hold | None = None) -> Group:
    """jobs/mnist.py as a chief, a worker (and an evaluator); with `hold`, through tests/jobs/held.py."""
    kinds = ["chief", "worker", *(["evaluator"] if evaluator else [])]
    ports = free_ports(len(kinds))
    cluster = {kind: [f"localhost:{port}"] for kind, port in zip(kinds, ports, strict=True)}
    workdir = base / f"attempt{attempt}"
    args = job_args(model_dir, steps_per_call)
    job, args = (HELD_JOB, [str(MNIST_JOB), *args]) if hold else (MNIST_JOB, args)
    jobs = {f"{kind}:0": start_job(f"{kind}:0", workdir, args, job=job, tf_config_json=tf_config(cluster, kind, 0),
                                   extra_env={"TFL_ATTEMPT": str(attempt), **(hold.env if hold else {})})
            for kind in kinds}
    return Group(jobs, model_dir)


def epoch_losses(log: str) -> dict[int, float]:
    """{epoch: loss} from the chief's `epoch i/n loss=...` lines (the last attempt's own)."""
    losses = {}
    for line in log.splitlines():
        if line.startswith("epoch "):
            epoch = int(line.split()[1].split("/")[0])
            losses[epoch] = float(next(p for p in line.split() if p.startswith("loss=")).split("=")[1])
    return losses


def final_weights(model_dir: Path) -> dict[str, np.ndarray]:
    import tensorflow as tf  # here: collecting the fast tests must not load TF

    reader = tf.train.load_checkpoint(str(model_dir / "checkpoints" / f"ckpt-{EPOCHS}"))
    values = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    return {n: v for n, v in values.items() if isinstance(v, np.ndarray) and v.dtype.kind == "f"}


def hold_training(group: Group, hold: Hold) -> int:
    """Wait until the chief and the worker both hold (tests/jobs/held.py); the step they hold at."""
    held = hold.wait(["chief:0", "worker:0"], alive=lambda: all(j.popen.poll() is None for j in group.jobs.values()),
                     timeout_s=TIMEOUT_S)
    assert held["chief:0"] == held["worker:0"] >= hold.step, held
    return held["chief:0"]


@dataclass
class Control:
    losses: dict[int, float]
    weights: dict[str, np.ndarray]


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    """One uninterrupted run, one step per call: the control of every interrupted run here, whatever
    its steps per call. A call of four steps runs the same four steps on the same batches in float64,
    so a run of four steps per call must train like it too (the four-step test proves it to 1e-6): one
    control where there were two, two TensorFlow start-ups fewer."""
    base = tmp_path_factory.mktemp("control")
    group = start_group(base, base / "model", 0, 1)
    codes = group.codes()
    assert set(codes.values()) == {0}, group.logs()
    made = Control(epoch_losses(group.chief.output()), final_weights(group.model_dir))
    assert sorted(made.losses) == list(range(1, EPOCHS + 1))
    yield made


def assert_trains_like(control: Control, resumed: Group, after_epoch: int) -> None:
    """The epochs after `after_epoch` report the control's loss; the final weights are the control's."""
    losses = epoch_losses(resumed.chief.output())
    later = [e for e in range(after_epoch + 1, EPOCHS + 1)]
    assert later, "the interruption came too late to compare an epoch after it"
    for epoch in later:
        assert losses[epoch] == pytest.approx(control.losses[epoch], abs=TOLERANCE), (epoch, losses, control.losses)
    weights = final_weights(resumed.model_dir)
    assert weights.keys() == control.weights.keys()
    assert max(float(np.max(np.abs(weights[k] - control.weights[k]))) for k in weights) <= TOLERANCE


def preempt_and_resume(tmp_path: Path, control: Control, steps_per_call: int, victims: tuple[str, ...],
                       seed: int) -> None:
    rng = random.Random(seed)
    # The moment: the group holds at a step of epoch 1's first half (the end of the first call at
    # or past it) and the notice comes while it holds; a victim goes on only once TensorFlow's
    # handler has taken the notice in (tests/jobs/held.py), so the agreed step is at most two
    # calls later: at most step 6 + 2 with one step per call, 4 + 8 with four. Epoch 2 (or 3) is
    # left to compare however fast the machine trains: no progress record or timer decides it.
    hold = Hold(tmp_path / "hold", rng.randrange(2, STEPS // 2 + 1) if steps_per_call == 1 else steps_per_call)
    model_dir = tmp_path / "model"
    first = start_group(tmp_path, model_dir, 0, steps_per_call, hold=hold)
    try:
        seen = hold_training(first, hold)
        for name in victims:
            os.kill(first.jobs[name].popen.pid, signal.SIGTERM)
        for name in victims:
            wait_for_line(first.jobs[name], "jobkit: preemption notice (SIGTERM);", list(first.jobs.values()))
        hold.release()
        codes = first.codes()
    finally:
        kill_all(first.jobs.values())
    assert codes == {"chief:0": PREEMPTED_EXIT_CODE, "worker:0": PREEMPTED_EXIT_CODE}, first.logs()
    record = PreemptedRecord.from_dict(json.loads((model_dir / "preempted.json").read_text()))
    assert record is not None and record.attempt == 0 and record.steps_per_epoch == STEPS
    assert record.global_step >= seen  # nothing trained before the notice is lost
    assert record.global_step == (record.epoch - 1) * STEPS + record.step
    assert record.notice_from in victims
    for job in first.jobs.values():  # the launcher reads the agreed step from each task's last record
        last = job.step_records()[-1]
        assert (last["phase"], last["global_step"]) == ("preempted", record.global_step), job.name
    assert not (model_dir / "training_done.json").exists()

    second = start_group(tmp_path, model_dir, 1, steps_per_call)
    codes = second.codes()
    assert set(codes.values()) == {0}, second.logs()
    chief = second.chief.output()
    # Steps lost: 0. The input starts right after the steps trained; keras goes on at the next one.
    assert f"resuming at global step {record.global_step}:" in chief, chief[-3000:]
    assert not (model_dir / "preempted.json").exists()
    assert json.loads((model_dir / "training_done.json").read_text())["global_step"] == EPOCHS * STEPS
    assert_trains_like(control, second, after_epoch=record.epoch)


def test_sigterm_to_the_chief_one_step_per_call(tmp_path: Path, control: Control) -> None:
    preempt_and_resume(tmp_path, control, 1, ("chief:0",), seed=1)


def test_sigterm_to_the_worker_four_steps_per_call(tmp_path: Path, control: Control) -> None:
    preempt_and_resume(tmp_path, control, 4, ("worker:0",), seed=2)


def test_sigterm_to_both_at_once_gives_one_checkpoint(tmp_path: Path, control: Control) -> None:
    preempt_and_resume(tmp_path, control, 1, ("chief:0", "worker:0"), seed=3)



def test_kill_9_of_a_worker_then_a_restart_redoes_the_steps_since_the_backup_on_the_same_batches(
        tmp_path: Path, control: Control) -> None:
    model_dir = tmp_path / "model"
    hold = Hold(tmp_path / "hold", STEPS + 3)  # held in epoch 2, after the backup of step 12
    first = start_group(tmp_path, model_dir, 0, 1, hold=hold)
    try:
        seen = hold_training(first, hold)
        os.kill(first.jobs["worker:0"].popen.pid, signal.SIGKILL)
        first.jobs["worker:0"].popen.wait(timeout=30)
        hold.release()
        # The launcher's teardown: the notice to the survivor. Its peer is gone, so no
        # step can be agreed: it stops without a checkpoint and claims no preemption.
        time.sleep(0.5)
        os.kill(first.jobs["chief:0"].popen.pid, signal.SIGTERM)
        codes = first.codes()
    finally:
        kill_all(first.jobs.values())
    assert codes["worker:0"] == -signal.SIGKILL
    assert codes["chief:0"] != PREEMPTED_EXIT_CODE, first.logs()
    assert not (model_dir / "preempted.json").exists()

    second = start_group(tmp_path, model_dir, 1, 1)
    codes = second.codes()
    assert set(codes.values()) == {0}, second.logs()
    chief = second.chief.output()
    resumed_at = int(chief.split("resuming at global step ")[1].split(":")[0])
    # The last backup (every 4 steps): the steps after it are trained again.
    assert resumed_at % BACKUP_EVERY == 0 and STEPS <= resumed_at < EPOCHS * STEPS, chief[-3000:]
    assert seen == STEPS + 3
    assert_trains_like(control, second, after_epoch=-(-resumed_at // STEPS))


def test_sigterm_to_the_evaluator_leaves_training_alone(tmp_path: Path, control: Control) -> None:
    hold = Hold(tmp_path / "hold", STEPS + 2)  # training holds in epoch 2: the evaluator is still following it
    group = start_group(tmp_path, tmp_path / "model", 0, 1, evaluator=True, hold=hold)
    try:
        hold_training(group, hold)
        os.kill(group.jobs["evaluator:0"].popen.pid, signal.SIGTERM)
        group.jobs["evaluator:0"].popen.wait(timeout=60)
        hold.release()
        codes = group.codes()
    finally:
        kill_all(group.jobs.values())
    assert codes["evaluator:0"] == -signal.SIGTERM
    assert codes["chief:0"] == 0 and codes["worker:0"] == 0, group.logs()
    assert "preemption notice" not in group.chief.output() + group.jobs["worker:0"].output()
    assert_trains_like(control, group, after_epoch=0)


# --- a custom training loop: jobkit.preemption_handler -------------------------------------------

CUSTOM_LOOP = Path(__file__).resolve().parents[1] / "jobs" / "custom_loop.py"
# Enough steps after the notice (sent at step 15) for TensorFlow's handler to see it: it polls the
# kit's notice flag once a second. With 40 tiny steps a quiet machine finished the loop first
# (exit 0: right, but not what the test is about).
LOOP_STEPS = 400


def start_loop(base: Path, model_dir: Path, attempt: int) -> Group:
    ports = free_ports(2)
    cluster = {kind: [f"localhost:{port}"] for kind, port in zip(("chief", "worker"), ports, strict=True)}
    args = ["--steps", str(LOOP_STEPS), "--dtype", "float64", "--seed", "3", "--model-dir", str(model_dir)]
    jobs = {f"{kind}:0": start_job(f"{kind}:0", base / f"attempt{attempt}", args, job=CUSTOM_LOOP,
                                   tf_config_json=tf_config(cluster, kind, 0), extra_env={"TFL_ATTEMPT": str(attempt)})
            for kind in ("chief", "worker")}
    return Group(jobs, model_dir)


def loop_losses(log: str) -> dict[int, float]:
    return {int(line.split()[1]): float(line.split("loss=")[1]) for line in log.splitlines() if line.startswith("step ")}


def digest(log: str) -> str:
    return next(line for line in log.splitlines() if "weights digest" in line).split()[-1]


def wait_for_line(job: JobProcess, prefix: str, others: list[JobProcess]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if any(line.startswith(prefix) for line in job.output().splitlines()):
            return
        if any(j.popen.poll() is not None for j in others):
            break
        time.sleep(0.02)
    raise AssertionError(f"{prefix!r} never came\n" + "\n".join(j.output()[-2000:] for j in others))


def test_custom_loop_resumes_exactly_after_a_notice(tmp_path: Path) -> None:
    control = start_loop(tmp_path / "control", tmp_path / "control" / "model", 0)
    codes = control.codes()
    assert set(codes.values()) == {0}, control.logs()
    reference = loop_losses(control.chief.output())
    assert sorted(reference) == list(range(1, LOOP_STEPS + 1))

    model_dir = tmp_path / "run" / "model"
    first = start_loop(tmp_path / "run", model_dir, 0)
    try:
        wait_for_line(first.chief, "step 15 ", list(first.jobs.values()))
        os.kill(first.jobs["worker:0"].popen.pid, signal.SIGTERM)
        codes = first.codes()
    finally:
        kill_all(first.jobs.values())
    assert codes == {"chief:0": PREEMPTED_EXIT_CODE, "worker:0": PREEMPTED_EXIT_CODE}, first.logs()
    done = max(loop_losses(first.chief.output()))
    assert 15 <= done < LOOP_STEPS

    second = start_loop(tmp_path / "run", model_dir, 1)
    codes = second.codes()
    assert set(codes.values()) == {0}, second.logs()
    resumed = loop_losses(second.chief.output())
    assert f"custom loop: resuming after step {done}" in second.chief.output()
    assert sorted(resumed) == list(range(done + 1, LOOP_STEPS + 1))  # steps lost: 0, none done twice
    for number, loss in resumed.items():
        assert loss == pytest.approx(reference[number], abs=TOLERANCE), number
    assert digest(second.chief.output()) == digest(control.chief.output())
