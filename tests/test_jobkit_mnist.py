"""jobs/mnist.py for real: by hand, and as a 2-worker MWMS group with an evaluator.

A restart from the last step backup is proven where it is also compared with an uninterrupted
run: kill -9 mid-epoch, then the next attempt resumes at the last backup's step and trains like
the control (tests/test_preemption_tf.py, the same job); the kit's step counting, in-process
(tests/test_jobkit_training.py::test_backups_count_steps_not_calls).

The group's numbers are compared with one process using the same global batch; with
DATA sharding they must agree per epoch *and per step* (keras' raw per-step logs
under MWMS are num_workers times too large, which these comparisons would catch).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.describe.ports import free_ports
from tests.jobkit_helpers import (
    REPO,
    JobProcess,
    assert_none_alive,
    kill_all,
    run_to_end,
    start_job,
    tf_config,
    wait_all,
)

pytestmark = pytest.mark.slow

EPOCHS, STEPS, PER_REPLICA_BATCH = 2, 6, 32
EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+) loss=(\d+\.\d{6}) accuracy=(\d+\.\d{6})$")
FALLBACK_NOTICE = "falling back to scikit-learn's 8x8 digits"


def small_run(batch_size: int) -> list[str]:
    return ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch-size", str(batch_size)]


def epoch_values(job: JobProcess, epochs: int = EPOCHS) -> list[tuple[int, float, float]]:
    values = []
    for line in job.epoch_lines():
        match = EPOCH_LINE.match(line)
        assert match, f"{job.name}: malformed epoch line {line!r}"
        assert int(match[2]) == epochs
        values.append((int(match[1]), float(match[3]), float(match[4])))
    return values


def per_step(job: JobProcess) -> dict[tuple[int, int], tuple[float, float]]:
    """(epoch, step) -> (loss, accuracy) from every per-batch progress record."""
    records = [r for r in job.step_records() if r["phase"] == "train"]
    return {(r["epoch"], r["step"]): (r["loss"], r["metrics"]["accuracy"]) for r in records}


@dataclass
class GroupRun:
    chief: JobProcess
    worker: JobProcess
    evaluator: JobProcess
    single: JobProcess
    model_dir: Path
    exit_codes: dict[str, int]


@pytest.fixture(scope="module")
def group_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupRun]:
    """chief + worker + evaluator (one cluster) and a lone process, all at once."""
    base = tmp_path_factory.mktemp("group")
    ports = free_ports(3)
    cluster = {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"],
               "evaluator": [f"localhost:{ports[2]}"]}
    jobs: list[JobProcess] = []
    try:
        for task_type in ("chief", "worker", "evaluator"):
            jobs.append(start_job(f"{task_type}:0", base / "group", small_run(PER_REPLICA_BATCH),
                                  tf_config_json=tf_config(cluster, task_type, 0)))
        jobs.append(start_job("single", base / "single", small_run(2 * PER_REPLICA_BATCH)))
        codes = wait_all(jobs, timeout_s=300)
    finally:
        kill_all(jobs)
    assert_none_alive(jobs)
    yield GroupRun(*jobs, model_dir=base / "group" / "model", exit_codes=codes)


def test_all_tasks_succeed_on_fallback_data(group_run: GroupRun) -> None:
    for job in (group_run.chief, group_run.worker, group_run.evaluator, group_run.single):
        assert group_run.exit_codes[job.name] == 0, job.output()[-3000:]
        assert FALLBACK_NOTICE in job.output()
    assert "strategy=MultiWorkerMirroredStrategy replicas=2" in group_run.chief.output()
    assert "role=evaluator strategy=default replicas=1" in group_run.evaluator.output()
    assert "strategy=default replicas=1" in group_run.single.output()


def test_epoch_lines_match_one_process_with_the_same_global_batch(group_run: GroupRun) -> None:
    single = epoch_values(group_run.single)
    assert [epoch for epoch, _, _ in single] == [1, 2]
    for job in (group_run.chief, group_run.worker):
        assert job.epoch_lines() == group_run.chief.epoch_lines()  # what the launcher checks
        for (epoch, loss, acc), (_, loss1, acc1) in zip(epoch_values(job), single, strict=True):
            assert loss == pytest.approx(loss1, abs=1e-4), f"{job.name} epoch {epoch}"
            assert acc == pytest.approx(acc1, abs=1e-4), f"{job.name} epoch {epoch}"


def test_per_step_progress_is_the_true_global_value(group_run: GroupRun) -> None:
    single = per_step(group_run.single)
    assert len(single) == EPOCHS * STEPS
    for job in (group_run.chief, group_run.worker):
        steps = per_step(job)
        assert steps.keys() == single.keys()
        for key, (loss, acc) in steps.items():
            # Raw tf_keras logs would be 2x here (loss ~4.6, accuracy up to 1.7).
            assert loss == pytest.approx(single[key][0], rel=1e-4), f"{job.name} {key}"
            assert acc == pytest.approx(single[key][1], abs=1e-4), f"{job.name} {key}"
            assert 0.0 <= acc <= 1.0


def test_only_the_chief_writes_the_model_dir(group_run: GroupRun) -> None:
    model_dir = group_run.model_dir
    assert {p.name for p in (model_dir / "checkpoints").iterdir()} == {
        "checkpoint", "ckpt-1.index", "ckpt-1.data-00000-of-00001",
        "ckpt-2.index", "ckpt-2.data-00000-of-00001"}
    assert list((model_dir / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert not [p for p in model_dir.rglob("*") if "workertemp" in p.name]
    assert not list((model_dir / "backup").iterdir())  # removed after successful training
    done = json.loads((model_dir / "training_done.json").read_text())
    assert done["final_checkpoint"] == "ckpt-2" and done["global_step"] == EPOCHS * STEPS
    scratch = re.search(r"writes go to scratch dir (\S+)", group_run.worker.output())
    assert scratch, "the worker should announce its scratch dir"
    assert not Path(scratch[1]).exists()
    assert "scratch dir" not in group_run.chief.output()


def test_progress_files_end_in_done(group_run: GroupRun) -> None:
    for job in (group_run.chief, group_run.worker):
        progress = json.loads(job.progress_file.read_text())
        last_epoch = epoch_values(job)[-1]
        assert progress["task"] == job.name and progress["attempt"] == 0
        assert progress["phase"] == "done"
        assert (progress["epoch"], progress["epochs"]) == (EPOCHS, EPOCHS)
        assert (progress["step"], progress["steps_per_epoch"]) == (STEPS, STEPS)
        assert progress["global_step"] == EPOCHS * STEPS
        assert progress["loss"] == pytest.approx(last_epoch[1], abs=1e-6)
        assert progress["metrics"]["accuracy"] == pytest.approx(last_epoch[2], abs=1e-6)
        assert progress["examples_per_sec"] > 0


def test_evaluator_follows_the_chief_until_training_is_done(group_run: GroupRun) -> None:
    lines = [ln for ln in group_run.evaluator.output().splitlines() if ln.startswith("eval ")]
    assert lines and lines[-1].startswith("eval checkpoint=ckpt-2 epoch=2 loss=")
    assert all(re.match(r"^eval checkpoint=ckpt-\d epoch=\d loss=\d+\.\d{6} accuracy=\d+\.\d{6}$", ln)
               for ln in lines)
    events = list((group_run.model_dir / "tensorboard" / "eval").glob("events.out.tfevents.*"))
    assert events and b"epoch_loss" in events[0].read_bytes()
    done = json.loads((group_run.model_dir / "training_done.json").read_text())
    progress = json.loads(group_run.evaluator.progress_file.read_text())
    assert progress["phase"] == "done" and progress["epoch"] == EPOCHS
    assert progress["time"] >= done["time"]  # it did not leave before training finished


def test_by_hand_run_needs_no_launcher(tmp_path: Path) -> None:
    """No TF_CONFIG, no TFL_* variables, started from an unrelated cwd."""
    job = start_job("by-hand", tmp_path / "job", small_run(16), launcher_env=False, cwd=tmp_path)
    code = run_to_end(job, timeout_s=180)
    assert code == 0, job.output()[-3000:]
    assert FALLBACK_NOTICE in job.output()
    assert [epoch for epoch, _, _ in epoch_values(job)] == [1, 2]
    model_dir = Path(re.search(r"jobkit: model dir (\S+)", job.output())[1])  # type: ignore[index]
    assert model_dir.parent == tmp_path / "tmp"  # a fresh temp dir, not in the repo
    assert REPO not in model_dir.parents
    assert (model_dir / "checkpoints" / "checkpoint").exists()
    assert list((model_dir / "tensorboard" / "train").glob("events.out.tfevents.*"))
    assert json.loads((model_dir / "training_done.json").read_text())["final_checkpoint"] == "ckpt-2"
    assert not job.progress_file.exists() and not job.progress_log.exists()
