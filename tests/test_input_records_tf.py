"""TFRecord input with real TensorFlow: jobs/fashion_records.py resumes exactly (float64, 1e-6).

Shards are written by jobs/prepare_fashion_records.py (600 Fashion-MNIST examples as PNG in 3
shards; Debian's package). A chief and a worker train with per-example augmentation; an
uninterrupted run is the control. Interrupted runs (a notice, kill -9 of the worker then a
restart) must report the control's loss, within 1e-6, for every epoch wholly after the
interruption. The interruption comes while every training task is held at a chosen step
(tests/jobs/held.py), so no machine speed decides where it falls.
The first attempt learns the shards' record counts and keeps them beside the run; the resume
reads them back, and a changed shard is refused in one line.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.contract import PREEMPTED_EXIT_CODE
from launcher.describe.ports import free_ports
from tests.jobkit_helpers import (
    FASHION_RECORDS_JOB,
    HELD_JOB,
    Hold,
    JobProcess,
    assert_none_alive,
    kill_all,
    start_job,
    tf_config,
    wait_all,
)

pytestmark = pytest.mark.slow

JOB = FASHION_RECORDS_JOB
EPOCHS, STEPS, BACKUP_EVERY, INTERRUPT_AT = 8, 10, 4, 6
TOLERANCE = 1e-6
TIMEOUT_S = 400


def job_args(records: Path, model_dir: Path) -> list[str]:
    return ["--records", str(records), "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch-size", "8",
            "--dtype", "float64", "--seed", "11", "--window", "64", "--backup-every-steps", str(BACKUP_EVERY),
            "--steps-per-execution", "1", "--model-dir", str(model_dir)]


def start_group(records: Path, base: Path, model_dir: Path, attempt: int,
                hold: Hold | None = None) -> dict[str, JobProcess]:
    ports = free_ports(2)
    cluster = {kind: [f"localhost:{port}"] for kind, port in zip(("chief", "worker"), ports, strict=True)}
    job, args = (HELD_JOB, [str(JOB), *job_args(records, model_dir)]) if hold else (JOB, job_args(records, model_dir))
    return {f"{kind}:0": start_job(f"{kind}:0", base / f"attempt{attempt}", args, job=job,
                                   tf_config_json=tf_config(cluster, kind, 0),
                                   extra_env={"TFL_ATTEMPT": str(attempt), **(hold.env if hold else {})})
            for kind in ("chief", "worker")}


def finish(jobs: dict[str, JobProcess]) -> dict[str, int]:
    try:
        return wait_all(jobs.values(), timeout_s=TIMEOUT_S)
    finally:
        kill_all(jobs.values())
        assert_none_alive(jobs.values())


def logs(jobs: dict[str, JobProcess]) -> str:
    return "\n".join(f"--- {name}\n{job.output()[-2500:]}" for name, job in jobs.items())


def epoch_losses(log: str) -> dict[int, float]:
    return {int(line.split()[1].split("/")[0]): float(line.split("loss=")[1].split()[0])
            for line in log.splitlines() if line.startswith("epoch ")}


def hold_training(jobs: dict[str, JobProcess], hold: Hold) -> int:
    """Wait until the chief and the worker both hold (tests/jobs/held.py); the step they hold at."""
    held = hold.wait(list(jobs), alive=lambda: all(j.popen.poll() is None for j in jobs.values()), timeout_s=TIMEOUT_S)
    assert held["chief:0"] == held["worker:0"] >= hold.step, held
    return held["chief:0"]


@pytest.fixture(scope="module")
def control(fashion_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, float]]:
    base = tmp_path_factory.mktemp("control")
    jobs = start_group(fashion_shards, base, base / "model", 0)
    codes = finish(jobs)
    assert set(codes.values()) == {0}, logs(jobs)
    losses = epoch_losses(jobs["chief:0"].output())
    assert sorted(losses) == list(range(1, EPOCHS + 1))
    manifest = json.loads((base / "model" / "input_records.json").read_text())
    assert [s["records"] for s in manifest["shards"]] == [200, 200, 200]
    yield losses


def assert_like_the_control(control: dict[int, float], log: str, resumed_at: int) -> None:
    losses = epoch_losses(log)
    later = range(resumed_at // STEPS + 2, EPOCHS + 1)  # the epochs wholly after the resume
    assert len(later) >= 5, resumed_at  # held at step <= 9: epochs 3 to 8 compared
    for epoch in later:
        assert losses[epoch] == pytest.approx(control[epoch], abs=TOLERANCE), (epoch, losses[epoch], control[epoch])


def resumed_step(log: str) -> int:
    line = next(ln for ln in log.splitlines() if "resuming at global step" in ln)
    assert "the input starts there (a seek to its file and record" in line, line
    return int(line.split("resuming at global step ")[1].split(":")[0])


def test_a_notice_then_the_next_attempt_trains_like_the_control(fashion_shards: Path, control: dict[int, float],
                                                                tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    hold = Hold(tmp_path / "hold", INTERRUPT_AT)
    first = start_group(fashion_shards, tmp_path, model_dir, 0, hold)
    try:
        held = hold_training(first, hold)
        os.kill(first["worker:0"].popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + TIMEOUT_S  # the notice taken in (held.py goes on once the handler has it)
        while "jobkit: preemption notice (SIGTERM);" not in first["worker:0"].output():
            assert time.monotonic() < deadline and first["worker:0"].popen.poll() is None, logs(first)
            time.sleep(0.02)
        hold.release()
        codes = finish(first)
    finally:
        kill_all(first.values())
    assert codes == {"chief:0": PREEMPTED_EXIT_CODE, "worker:0": PREEMPTED_EXIT_CODE}, logs(first)
    preempted_at = json.loads((model_dir / "preempted.json").read_text())["global_step"]
    assert held <= preempted_at <= held + 2, (held, preempted_at)  # the agreed step: at most two calls on
    second = start_group(fashion_shards, tmp_path, model_dir, 1)
    codes = finish(second)
    assert set(codes.values()) == {0}, logs(second)
    assert resumed_step(second["chief:0"].output()) == preempted_at
    saved = json.loads((model_dir / "training_done.json").read_text())
    assert saved["global_step"] == EPOCHS * STEPS
    assert_like_the_control(control, second["chief:0"].output(), resumed_step(second["chief:0"].output()))


def test_kill_9_of_the_worker_then_a_restart_trains_like_the_control(fashion_shards: Path, control: dict[int, float],
                                                                     tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    hold = Hold(tmp_path / "hold", 2 * BACKUP_EVERY + 1)  # after the backup of step 8
    first = start_group(fashion_shards, tmp_path, model_dir, 0, hold)
    try:
        hold_training(first, hold)
        os.kill(first["worker:0"].popen.pid, signal.SIGKILL)
        first["worker:0"].popen.wait(timeout=30)
        hold.release()
        time.sleep(0.5)
        os.kill(first["chief:0"].popen.pid, signal.SIGTERM)  # the launcher's teardown of the survivor
        codes = finish(first)
    finally:
        kill_all(first.values())
    assert codes["worker:0"] == -signal.SIGKILL, logs(first)
    second = start_group(fashion_shards, tmp_path, model_dir, 1)
    codes = finish(second)
    assert set(codes.values()) == {0}, logs(second)
    at = resumed_step(second["chief:0"].output())
    assert at == 2 * BACKUP_EVERY, at  # the last backup before the hold: the steps after it are trained again
    assert_like_the_control(control, second["chief:0"].output(), at)


def test_a_changed_shard_is_refused_in_one_line(fashion_shards: Path, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    copy = tmp_path / "shards"
    copy.mkdir()
    for path in fashion_shards.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    recorded = [{"name": p.name, "size": p.stat().st_size, "records": 200} for p in sorted(copy.iterdir())]
    (model_dir / "input_records.json").write_text(json.dumps({"shards": recorded}))
    victim = sorted(copy.iterdir())[1]
    victim.write_bytes(victim.read_bytes()[:-100])
    job = start_job("chief:0", tmp_path / "run", job_args(copy, model_dir), job=JOB)
    codes = finish({"chief:0": job})
    assert codes["chief:0"] != 0
    errors = [ln for ln in job.output().splitlines() if "TFRecord files changed since this run began" in ln]
    assert len(errors) == 1 and errors[0].startswith("fashion_records: "), job.output()[-3000:]
    assert f"changed size: {victim.name}" in errors[0] and "Traceback" not in job.output(), job.output()[-3000:]
