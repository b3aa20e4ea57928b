"""Distributed training must train like one process with the same global batch.

Two cases, each against a lone process with the same seed, data order and global batch:
- MultiWorkerMirroredStrategy, 2 workers (jobs/reuters.py: its embedding has sparse
  gradients), each also split into 2 logical CPUs, which MWMS must leave idle;
- MirroredStrategy over 4 logical CPUs, launched as `tfl launch jobs/mnist.py --local 1
  --virtual-devices 4`, seed 001's 4-replica run.
Compared: the final checkpoint (every weight and optimizer slot), the per-epoch loss and
metrics, and every per-step value tfl reports, which must be the true global value
(tf_keras' own per-batch logs are N times too large under MWMS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from launcher.describe.ports import free_ports
from tests.conftest import ROOT
from tests.jobkit_helpers import (
    JobProcess,
    assert_none_alive,
    job_env,
    kill_all,
    start_job,
    tf_config,
    wait_all,
)

pytestmark = pytest.mark.slow

EPOCHS, STEPS = 2, 4
TOLERANCE = 1e-4  # the bound; measured here: ~1e-6 or better
REUTERS, MNIST = ROOT / "jobs" / "reuters.py", ROOT / "jobs" / "mnist.py"


def small_run(per_replica_batch: int) -> list[str]:
    return ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch-size", str(per_replica_batch)]


def epoch_values(log: str) -> list[dict[str, float]]:
    """Each `epoch i/n name=value ...` line as {name: value}, in order."""
    rows = []
    for line in log.splitlines():
        if line.startswith("epoch "):
            rows.append({k: float(v) for k, v in (part.split("=") for part in line.split()[2:])})
    return rows


def step_values(records: list[dict[str, Any]]) -> dict[tuple[int, int], dict[str, float]]:
    """(epoch, step) -> loss and metrics of every per-batch progress record."""
    return {(r["epoch"], r["step"]): {"loss": r["loss"], **r["metrics"]}
            for r in records if r["phase"] == "train"}


def final_weights(model_dir: Path) -> dict[str, np.ndarray]:
    """Every numeric variable of the last checkpoint: the model's weights and the optimizer's state."""
    from launcher import jobkit

    jobkit.select_tf_keras()  # this process may load a job module later (tests/test_jobs_reuters.py)
    import tensorflow as tf  # here, not at the top: collecting fast tests must not load TF

    reader = tf.train.load_checkpoint(str(model_dir / "checkpoints" / f"ckpt-{EPOCHS}"))
    values = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    return {name: v for name, v in values.items() if isinstance(v, np.ndarray) and v.dtype.kind in "fiu"}


def max_weight_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    assert any("embeddings" in k or "kernel" in k for k in a)
    return max(float(np.max(np.abs(a[k].astype(np.float64) - b[k].astype(np.float64)))) for k in a)


def assert_same_training(runs: list[str], epochs: list[list[dict[str, float]]], steps: list[dict[Any, Any]],
                         reference_epochs: list[dict[str, float]], reference_steps: dict[Any, Any]) -> None:
    assert len(reference_epochs) == EPOCHS and len(reference_steps) == EPOCHS * STEPS
    for name, rows, per_step in zip(runs, epochs, steps, strict=True):
        assert len(rows) == EPOCHS, name
        for row, ref in zip(rows, reference_epochs, strict=True):
            assert row.keys() == ref.keys()
            for key in ref:
                assert row[key] == pytest.approx(ref[key], abs=TOLERANCE), f"{name} epoch {key}"
        assert per_step.keys() == reference_steps.keys(), name
        for key, values in per_step.items():
            for metric, value in values.items():
                # Raw tf_keras logs would be N x here (e.g. loss ~7.6 for 2 workers, accuracy > 1).
                assert value == pytest.approx(reference_steps[key][metric], abs=TOLERANCE), f"{name} {key} {metric}"


def report(label: str, weight_diff: float, steps: dict[Any, dict[str, float]], reference: dict[Any, dict[str, float]]) -> None:
    """Shown with `pytest -s`; the numbers docs/devices.md quotes."""
    loss = max(abs(steps[k]["loss"] - reference[k]["loss"]) for k in reference)
    metric = max(abs(v - reference[k][m]) for k in reference for m, v in steps[k].items() if m != "loss")
    print(f"\nfidelity {label}: max |weight diff| {weight_diff:.1e}; per step: max |loss diff| {loss:.1e}, "
          f"max |metric diff| {metric:.1e}")


# --- MultiWorkerMirroredStrategy: 2 workers vs 1 process ------------------------------------------

@dataclass
class GroupRun:
    chief: JobProcess
    worker: JobProcess
    single: JobProcess
    base: Path


@pytest.fixture(scope="module")
def mwms_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupRun]:
    base = tmp_path_factory.mktemp("mwms")
    ports = free_ports(2)
    cluster = {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    jobs: list[JobProcess] = []
    try:
        for task_type in ("chief", "worker"):
            jobs.append(start_job(f"{task_type}:0", base / "group", small_run(16), job=REUTERS,
                                  tf_config_json=tf_config(cluster, task_type, 0),
                                  extra_env={"TFL_VIRTUAL_DEVICES": "2"}))
        jobs.append(start_job("single", base / "single", small_run(32), job=REUTERS))
        codes = wait_all(jobs, timeout_s=300)
    finally:
        kill_all(jobs)
    assert_none_alive(jobs)
    for job in jobs:
        assert codes[job.name] == 0, job.output()[-3000:]
    yield GroupRun(*jobs, base=base)


def test_mwms_uses_one_cpu_per_worker_and_says_so(mwms_run: GroupRun) -> None:
    chief = mwms_run.chief.output()
    assert "strategy=MultiWorkerMirroredStrategy replicas=2 devices=2xCPU(logical,on 1)" in chief
    assert "1 of this task's 2 logical CPUs stay idle" in chief
    assert "strategy=default replicas=1 devices=1xCPU" in mwms_run.single.output()
    assert "falling back to synthetic newswire-like sequences" in mwms_run.single.output()


def test_mwms_trains_like_one_process(mwms_run: GroupRun) -> None:
    reference_epochs = epoch_values(mwms_run.single.output())
    assert set(reference_epochs[0]) == {"loss", "accuracy", "top5_accuracy"}
    group = [mwms_run.chief, mwms_run.worker]
    assert_same_training([j.name for j in group], [epoch_values(j.output()) for j in group],
                         [step_values(j.step_records()) for j in group],
                         reference_epochs, step_values(mwms_run.single.step_records()))
    diff = max_weight_diff(final_weights(mwms_run.base / "group" / "model"),
                           final_weights(mwms_run.base / "single" / "model"))
    report("MWMS 2 workers vs 1 process (reuters)", diff, step_values(mwms_run.chief.step_records()),
           step_values(mwms_run.single.step_records()))
    assert diff < TOLERANCE


# --- MirroredStrategy on 4 logical CPUs (through tfl) vs 1 device ---------------------------------

def test_mirrored_on_four_logical_cpus_trains_like_one_device(tmp_path: Path, tfl_home: Path) -> None:
    steps_log = tmp_path / "tfl-steps.jsonl"
    # The launcher's environment reaches the task: a private HOME (no keras cache), no
    # network, and the per-step log (one task only, so it is the chief's).
    env = {**job_env("launcher", tmp_path / "tfl", launcher_env=False), "TFL_HOME": str(tfl_home),
           "TFL_PROGRESS_LOG": str(steps_log)}
    single: list[JobProcess] = []
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launcher", "launch", str(MNIST), "--local", "1", "--virtual-devices", "4", "--",
         *small_run(8)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        start_new_session=True)
    try:
        single.append(start_job("single", tmp_path / "single", small_run(32)))
        out, _ = launcher.communicate(timeout=300)
        codes = wait_all(single, timeout_s=300)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, 9)
            launcher.wait(30)
        kill_all(single)
    assert_none_alive(single)
    assert launcher.returncode == 0, out[-3000:]
    assert codes["single"] == 0, single[0].output()[-3000:]
    (run,) = (tfl_home / "runs").iterdir()
    chief_log = (run / "logs" / "chief-0.log").read_text()
    assert "strategy=MirroredStrategy replicas=4 devices=4xCPU(logical,on 1)" in chief_log

    reference_epochs = epoch_values(single[0].output())
    records = [json.loads(line) for line in steps_log.read_text().splitlines()]
    assert_same_training(["chief:0"], [epoch_values(chief_log)], [step_values(records)],
                         reference_epochs, step_values(single[0].step_records()))
    diff = max_weight_diff(final_weights(run / "model"), final_weights(tmp_path / "single" / "model"))
    report("MirroredStrategy 4 logical CPUs vs 1 device (mnist)", diff, step_values(records),
           step_values(single[0].step_records()))
    assert diff < TOLERANCE
