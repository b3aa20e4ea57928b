"""jobs/mnist.py on real data (Fashion-MNIST, offline): 2 workers train like 1 process with
the same global batch, the evaluator sees real learning, and the chief leaves last.

A short form of what the bench reports in full (10 epochs, accuracy >= 0.88): 2 epochs of
150 steps with the kit's own choice of steps per call, which the two workers must agree on.
In float64: in float32, two workers sum each gradient in another order than one process
does, the results differ in the last bits, and training magnifies that (measured: epoch 2's
loss 1.2e-3 apart; one process with oneDNN off against on is 3.8e-4 apart the same way).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from launcher.describe.ports import free_ports
from tests.jobkit_helpers import (
    JobProcess,
    assert_none_alive,
    kill_all,
    require_fashion_mnist,
    start_job,
    tf_config,
)

pytestmark = pytest.mark.slow

EPOCHS, STEPS, GLOBAL_BATCH = 2, 150, 128
TOLERANCE = 1e-4
MIN_ACCURACY = 0.80  # after 300 steps (0.64 epoch of 128); measured 0.846 (the bench: >= 0.88 after 10 epochs)
EPOCH_LINE = re.compile(r"^epoch (\d+)/\d+ loss=(\S+) accuracy=(\S+)$", re.M)
EVAL_LINE = re.compile(r"^eval checkpoint=ckpt-(\d+) epoch=\d+ loss=\S+ accuracy=(\S+)$", re.M)
LEFT = re.compile(r" leaves(?: last)? at ([0-9.]+),")
CHOSEN = re.compile(r"^jobkit: .* ms per step .*; (\d+) steps per call", re.M)


def args(per_replica_batch: int) -> list[str]:
    return ["--dataset", "fashion_mnist", "--dtype", "float64", "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS),
            "--batch-size", str(per_replica_batch)]


@dataclass
class Runs:
    chief: JobProcess
    worker: JobProcess
    evaluator: JobProcess
    single: JobProcess
    exited: dict[str, float]  # time.monotonic() at each job's exit
    codes: dict[str, int]


def wait_recording_exits(jobs: list[JobProcess], timeout_s: float) -> tuple[dict[str, int], dict[str, float]]:
    exited: dict[str, float] = {}

    def wait(job: JobProcess) -> None:
        job.popen.wait()
        exited[job.name] = time.monotonic()

    threads = [threading.Thread(target=wait, args=(job,), daemon=True) for job in jobs]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.1, deadline - time.monotonic()))
    late = [job.name for job in jobs if job.name not in exited]
    assert not late, f"still running after {timeout_s} s: {late}\n" + "\n".join(j.output()[-1500:] for j in jobs)
    return {job.name: job.popen.returncode for job in jobs}, exited


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    require_fashion_mnist()
    base = tmp_path_factory.mktemp("fashion")
    ports = free_ports(3)
    cluster = {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"],
               "evaluator": [f"localhost:{ports[2]}"]}
    jobs: list[JobProcess] = []
    try:
        for kind in ("chief", "worker", "evaluator"):
            jobs.append(start_job(f"{kind}:0", base / "group", args(GLOBAL_BATCH // 2),
                                  tf_config_json=tf_config(cluster, kind, 0)))
        jobs.append(start_job("single", base / "single", args(GLOBAL_BATCH)))
        codes, exited = wait_recording_exits(jobs, timeout_s=420)
    finally:
        kill_all(jobs)
    assert_none_alive(jobs)
    yield Runs(*jobs, exited=exited, codes=codes)


def epochs_of(job: JobProcess) -> list[tuple[int, float, float]]:
    return [(int(e), float(loss), float(acc)) for e, loss, acc in EPOCH_LINE.findall(job.output())]


def test_every_task_trained_on_fashion_mnist(runs: Runs) -> None:
    for job in (runs.chief, runs.worker, runs.evaluator, runs.single):
        assert runs.codes[job.name] == 0, job.output()[-3000:]
        assert "jobkit: fashion_mnist from Debian's dataset-fashion-mnist" in job.output()
    assert "strategy=MultiWorkerMirroredStrategy replicas=2" in runs.chief.output()


def test_two_workers_train_like_one_process(runs: Runs) -> None:
    single = epochs_of(runs.single)
    assert [e for e, _, _ in single] == [1, 2]
    for job in (runs.chief, runs.worker):
        for (epoch, loss, acc), (_, loss1, acc1) in zip(epochs_of(job), single, strict=True):
            assert loss == pytest.approx(loss1, abs=TOLERANCE), f"{job.name} epoch {epoch}"
            assert acc == pytest.approx(acc1, abs=TOLERANCE), f"{job.name} epoch {epoch}"


def test_workers_agree_on_the_steps_per_call_and_report_true_values(runs: Runs) -> None:
    chosen = {job.name: CHOSEN.findall(job.output()) for job in (runs.chief, runs.worker)}
    assert len(chosen["chief:0"]) == 1 and chosen["chief:0"] == chosen["worker:0"], chosen
    per_call = int(chosen["chief:0"][0])
    single = {(r["epoch"], r["step"]): r for r in runs.single.step_records() if r["phase"] == "train"}
    for job in (runs.chief, runs.worker):
        records = {(r["epoch"], r["step"]): r for r in job.step_records() if r["phase"] == "train"}
        # Before the choice a record per step; after it, one per call (and at the epoch's end).
        late = sorted(step for epoch, step in records if epoch == EPOCHS)
        assert all(step % per_call == 0 or step == STEPS for step in late), late
        common = records.keys() & single.keys()
        assert len(common) >= 35  # the measured steps at one per call, at least
        for key in common:
            # tf_keras' own per-step logs would be 2x here under 2 workers.
            assert records[key]["loss"] == pytest.approx(single[key]["loss"], abs=TOLERANCE), f"{job.name} {key}"
            assert records[key]["metrics"]["accuracy"] == pytest.approx(single[key]["metrics"]["accuracy"], abs=TOLERANCE)


def test_the_evaluator_sees_real_learning(runs: Runs) -> None:
    evals = [(int(c), float(acc)) for c, acc in EVAL_LINE.findall(runs.evaluator.output())]
    assert [c for c, _ in evals] == [1, 2], runs.evaluator.output()[-2000:]
    assert evals[-1][1] >= MIN_ACCURACY, evals


def test_the_chief_leaves_last(runs: Runs) -> None:
    # The chief hosts the coordination service: leaving first can strand a worker on
    # TensorFlow's slow path (failing heartbeats) before its last reply arrives.
    left = {job.name: LEFT.search(job.output()) for job in (runs.chief, runs.worker)}
    # A string, not a list: pytest shortens a list's repr to a line, and the lines that say why are in the middle.
    assert left["chief:0"] and left["worker:0"], "\n".join(f"--- {job.name} (exit {runs.codes[job.name]}):\n{job.output()[-4000:]}"
                                                          for job in (runs.chief, runs.worker))
    assert float(left["chief:0"][1]) > float(left["worker:0"][1])
    assert "did not say it was leaving" not in runs.chief.output()
    # The worker was not stranded: its goodbye was answered before the chief left (else it
    # says so), and it failed no heartbeat (TensorFlow's slow path) once the chief was gone.
    assert "got no answer from the chief" not in runs.worker.output()
    assert "Failed to send RPC to coordination service" not in runs.worker.output()
    # No bound on the time between the two exits (this test had < 1 s): it measures the loaded
    # kernel, not the protocol. Issue 26's loaded runs: both tasks left the fast way and in
    # order, their last lines milliseconds apart, yet were seen to exit 2.15 s apart (load 50);
    # each exit was seen 0.46-1.46 s after the task's own last line (load 21-42).
