"""Starting real job processes for the job-kit tests (chief/worker/evaluator, single)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.procs import kill_group

REPO = Path(__file__).resolve().parents[1]
MNIST_JOB = REPO / "jobs" / "mnist.py"
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
EPOCH_LINE_PREFIX = "epoch "
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "grpc_proxy")


@dataclass
class JobProcess:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    progress_file: Path
    progress_log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def epoch_lines(self) -> list[str]:
        return [ln for ln in self.output().splitlines() if ln.startswith(EPOCH_LINE_PREFIX)]

    def step_records(self) -> list[dict[str, Any]]:
        if not self.progress_log.exists():
            return []
        return [json.loads(ln) for ln in self.progress_log.read_text().splitlines() if ln]


def require_fashion_mnist() -> Path:
    """Debian's Fashion-MNIST; the test is skipped without it, except in CI (CI=true), where it fails."""
    if not (FASHION_MNIST / "train-images-idx3-ubyte.gz").exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{FASHION_MNIST} is missing; CI must install dataset-fashion-mnist (see .ci/run)")
        pytest.skip("dataset-fashion-mnist is not installed (apt-get install dataset-fashion-mnist)")
    return FASHION_MNIST


def write_backup_at(model_dir: Path, step: int, steps_per_epoch: int) -> None:
    """The epoch and step keras' BackupAndRestore keeps, as a run stopped after global step `step`
    leaves them (no weights: they do not change where the input starts). Loads TensorFlow."""
    import tensorflow as tf

    epoch, batch = divmod(step - 1, steps_per_epoch)
    state = tf.train.Checkpoint(ckpt_saved_epoch=tf.Variable(epoch, dtype=tf.int64),
                                ckpt_saved_batch=tf.Variable(batch, dtype=tf.int64))
    tf.train.CheckpointManager(state, str(model_dir / "backup" / "chief"), max_to_keep=1).save()


def tf_config(cluster: Mapping[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": dict(cluster), "task": {"type": task_type, "index": index}})


def job_env(name: str, workdir: Path, *, launcher_env: bool = True) -> dict[str, str]:
    """The environment the launcher would give task `name` (or a bare one, run by hand).

    HOME (no keras MNIST cache), TMPDIR and a dead HTTPS proxy are private to the test,
    so the offline fallback data is used even on a machine with internet access.
    """
    sandbox = workdir.parent
    for private in ("home", "tmp"):
        (sandbox / private).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TF_CONFIG", "TFL_", "TF_USE_LEGACY_KERAS"))
           and k.lower() not in PROXY_VARIABLES}
    env.update({
        "HOME": str(sandbox / "home"), "TMPDIR": str(sandbox / "tmp"),
        "https_proxy": "http://127.0.0.1:9", "no_proxy": "localhost,127.0.0.1",
        # Several TF processes share two cores in CI; more threads only thrash.
        "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
    })
    if launcher_env:
        env.update({
            "TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1", "TFL_RUN_ID": "test-run",
            "TFL_TASK": name, "TFL_RUN_DIR": str(workdir), "TFL_ATTEMPT": "0",
            "TFL_PROGRESS_FILE": str(workdir / f"{name}.progress.json"),
            "TFL_PROGRESS_LOG": str(workdir / f"{name}.steps.jsonl"),
        })
    return env


def start_job(
    name: str, workdir: Path, args: Sequence[str], *, tf_config_json: str | None = None,
    extra_env: Mapping[str, str] | None = None, launcher_env: bool = True,
    cwd: Path | None = None, job: Path = MNIST_JOB,
) -> JobProcess:
    """Start `job` (default jobs/mnist.py) in its own session, output to `workdir/<name>.log`."""
    workdir.mkdir(parents=True, exist_ok=True)
    env = job_env(name, workdir, launcher_env=launcher_env)
    if tf_config_json is not None:
        env["TF_CONFIG"] = tf_config_json
    env.update(extra_env or {})
    log = workdir / f"{name.replace(':', '_')}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(
            [sys.executable, str(job), *args], stdout=handle, stderr=subprocess.STDOUT,
            env=env, cwd=str(cwd or workdir), start_new_session=True,
        )
    return JobProcess(name, popen, log, workdir / f"{name}.progress.json",
                      Path(env.get("TFL_PROGRESS_LOG", workdir / f"{name}.steps.jsonl")))


def wait_all(jobs: Iterable[JobProcess], timeout_s: float) -> dict[str, int]:
    """Exit codes by name; raises TimeoutError (with log tails) if any is still running."""
    jobs = list(jobs)
    deadline = time.monotonic() + timeout_s
    for job in jobs:
        try:
            job.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            tails = "\n".join(f"--- {j.name}\n{j.output()[-2000:]}" for j in jobs)
            raise TimeoutError(f"{job.name} still running after {timeout_s} s\n{tails}") from None
    return {job.name: job.popen.returncode for job in jobs}


def kill_all(jobs: Iterable[JobProcess]) -> None:
    """SIGKILL each job's process group; fine if it already exited."""
    for job in jobs:
        kill_group(job.popen)
        job.popen.wait(timeout=30)


def run_to_end(job: JobProcess, timeout_s: float) -> int:
    """Wait for one started job (its group is killed if it overruns), prove it gone, return its exit code."""
    try:
        codes = wait_all([job], timeout_s)
    finally:
        kill_all([job])
    assert_none_alive([job])
    return codes[job.name]


def assert_none_alive(jobs: Iterable[JobProcess]) -> None:
    alive = [job.name for job in jobs if psutil.pid_exists(job.popen.pid)
             and psutil.Process(job.popen.pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes still alive: {alive}"


HELD_JOB = REPO / "tests" / "jobs" / "held.py"


@dataclass
class Hold:
    """The test's side of tests/jobs/held.py: every training task of attempt 0 stops at `step`
    (the end of the first call of the train function at or past it) until `release()`."""

    directory: Path
    step: int

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        return {"HELD_JOB_HOLD": f"{self.step}:{self.directory}"}

    def held_at(self, task: str) -> int | None:
        marker = self.directory / f"held-{task.replace(':', '-')}"
        try:
            return int(marker.read_text())
        except (OSError, ValueError):
            return None

    def wait(self, tasks: Sequence[str], alive: Any, timeout_s: float = 300, why: Any = None) -> dict[str, int]:
        """The step each of `tasks` holds at, once all hold; `alive()` False fails at once (a hang guard),
        with `why()` (e.g. the launcher's output) in the message."""
        deadline = time.monotonic() + timeout_s
        while True:
            steps = {task: self.held_at(task) for task in tasks}
            if all(step is not None for step in steps.values()):
                return {task: int(step) for task, step in steps.items() if step is not None}
            assert alive(), f"a task ended before holding at step {self.step}: {steps}\n{why() if why else ''}"
            assert time.monotonic() < deadline, f"not held at step {self.step} in {timeout_s} s: {steps}"
            time.sleep(0.02)

    def release(self) -> None:
        (self.directory / "go").touch()


FASHION_RECORDS_JOB = REPO / "jobs" / "fashion_records.py"
PREPARE_FASHION_RECORDS = REPO / "jobs" / "prepare_fashion_records.py"
SHARDS, SHARD_RECORDS = 3, 200  # what write_fashion_shards writes: 600 examples, 200 a shard


def write_fashion_shards(out: Path, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """jobs/prepare_fashion_records.py: the first 600 Fashion-MNIST examples as PNG in 3 shards under `out`."""
    require_fashion_mnist()
    return subprocess.run([sys.executable, str(PREPARE_FASHION_RECORDS), "--out", str(out), "--shards", str(SHARDS),
                           "--limit", str(SHARDS * SHARD_RECORDS)], capture_output=True, text=True, timeout=300,
                          env=dict(env) if env is not None else {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


@pytest.fixture(scope="session")
def fashion_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shards of write_fashion_shards, once per session (a module-scoped fixture would keep its module's
    tests on one pytest-xdist worker: conftest)."""
    out = tmp_path_factory.mktemp("fashion-records") / "shards"
    done = write_fashion_shards(out)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [f"train-{i:05d}-of-{SHARDS:05d}.tfrecord" for i in range(SHARDS)]
    return out


def assert_trained_on_the_shards(model_dir: Path, shards: Path, chief_log: str, worker_log: str, epochs: int) -> None:
    """jobs/fashion_records.py read `shards`: the kit's record counts beside the run (input_records.json, written
    once it had scanned them), every epoch's loss on the chief and the worker (one group: the same loss)."""
    manifest = json.loads((model_dir / "input_records.json").read_text())
    assert [(s["name"], s["records"]) for s in manifest["shards"]] == [
        (f"train-{i:05d}-of-{SHARDS:05d}.tfrecord", SHARD_RECORDS) for i in range(SHARDS)], manifest
    assert [(s["name"], s["size"]) for s in manifest["shards"]] == [(p.name, p.stat().st_size) for p in sorted(shards.iterdir())]
    losses = [[ln.split("loss=")[1].split()[0] for ln in log.splitlines() if ln.startswith("epoch ") and "loss=" in ln]
              for log in (chief_log, worker_log)]
    assert len(losses[0]) == epochs and losses[0] == losses[1], (chief_log[-2000:], worker_log[-2000:])
    assert "strategy=MultiWorkerMirroredStrategy replicas=2" in chief_log
