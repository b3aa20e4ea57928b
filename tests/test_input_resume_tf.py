"""A resume far into a run starts as quickly as one at step 0 (real TensorFlow, jobs/mnist.py).

A hang guard against the replay coming back: before addressed input, the job reached step
10,000,000 by replaying ten million batches (hours); now it starts the input there. The bound
is wide (3x the step-0 time plus a minute); the figures themselves are the bench's
(bench/input_resume.py, docs/benchmarks.md).

The far backup is written by the test: the epoch and step keras' BackupAndRestore keeps
(`ckpt_saved_epoch`, `ckpt_saved_batch`), as a run stopped at that step leaves them; the
model's weights are not in it (they do not change what the input reads).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.jobkit_helpers import JobProcess, assert_none_alive, kill_all, start_job, wait_all, write_backup_at

pytestmark = pytest.mark.slow

BATCH, STEPS = 16, 93  # the offline digits: 1,500 examples, 93 batches of 16 per epoch
FAR_STEP = 10_000_000  # epoch 107,527 (0-based 107,526), step 82 of 93
FAR_EPOCH = (FAR_STEP - 1) // STEPS
GUARD_FACTOR, GUARD_SLACK_S = 3.0, 60.0


def job_args(model_dir: Path, epochs: int) -> list[str]:
    return ["--epochs", str(epochs), "--batch-size", str(BATCH), "--seed", "3", "--model-dir", str(model_dir),
            "--steps-per-execution", "1", "--backup-every-steps", "1000000"]


def seconds_to_first_step(job: JobProcess, limit_s: float) -> float:
    """From the process's start to its first trained step's record; fails (the hang guard) past `limit_s`."""
    began = time.monotonic()
    while time.monotonic() - began < limit_s:
        if any(r["phase"] == "train" for r in job.step_records()):
            return time.monotonic() - began
        if job.popen.poll() is not None:
            raise AssertionError(f"{job.name} ended ({job.popen.returncode}) before its first step\n{job.output()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no step {limit_s:.0f} s after the start (the hang guard): the input replays what came "
                         f"before the resume?\n{job.output()[-3000:]}")


def test_a_resume_at_step_ten_million_starts_as_quickly_as_one_at_step_0(tmp_path: Path) -> None:
    fresh = start_job("chief:0", tmp_path / "fresh", job_args(tmp_path / "fresh_model", 1))
    try:
        at_zero = seconds_to_first_step(fresh, 600)
        assert wait_all([fresh], 300) == {"chief:0": 0}, fresh.output()[-3000:]
    finally:
        kill_all([fresh])
    assert_none_alive([fresh])

    model_dir = tmp_path / "far_model"
    write_backup_at(model_dir, FAR_STEP, STEPS)
    far = start_job("chief:0", tmp_path / "far", job_args(model_dir, FAR_EPOCH + 1))
    try:
        limit = GUARD_FACTOR * at_zero + GUARD_SLACK_S
        far_s = seconds_to_first_step(far, limit)
        codes = wait_all([far], 300)
    finally:
        kill_all([far])
    assert_none_alive([far])
    assert codes == {"chief:0": 0}, far.output()[-3000:]
    output = far.output()
    assert "resuming at global step 10000000: the input starts there (nothing replayed)" in output, output[-3000:]
    trained = [r for r in far.step_records() if r["phase"] == "train"]
    assert trained[-1]["epoch"] == FAR_EPOCH + 1 and trained[-1]["step"] == STEPS, trained[-1]
    print(f"first step: {at_zero:.1f} s at step 0, {far_s:.1f} s at step 10,000,000 (bound {limit:.0f} s)")


@pytest.mark.parametrize("replay", [True, False])
def test_a_plain_pipeline_says_what_it_replays_or_what_skipping_it_gives_up(tmp_path: Path, replay: bool) -> None:
    model_dir = tmp_path / "model"
    write_backup_at(model_dir, 150, STEPS)  # epoch 2, step 57
    args = [*job_args(model_dir, 2), "--input", "pipeline", *([] if replay else ["--no-replay"])]
    job = start_job("chief:0", tmp_path / "run", args)
    try:
        codes = wait_all([job], 600)
    finally:
        kill_all([job])
    assert_none_alive([job])
    assert codes == {"chief:0": 0}, job.output()[-3000:]
    lines = [ln for ln in job.output().splitlines() if ln.startswith("jobkit: re")]
    if replay:
        assert any(ln.startswith("jobkit: resuming at global step 150: the input replays the 150 batches") for ln in lines)
        took = [ln for ln in lines if ln.startswith("jobkit: replayed 150 batches to reach the resume step; the first step came ")]
        assert len(took) == 1 and "replay=False" in took[0], lines
    else:
        assert any(ln.startswith("jobkit: resuming at global step 150 without a replay (replay=False)") and "not exact" in ln
                   for ln in lines), lines
        assert not any("replayed" in ln for ln in lines)
