"""How much to measure (full or quick) and on what machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from bench.common import FAKE_TRAIN, MNIST


@dataclass(frozen=True)
class Config:
    """Repetitions and sizes. The full suite uses MNIST; quick mode a TF-free stand-in."""

    quick: bool
    reps: int  # repetitions of every launch-type measure (the issue asks for >= 5)
    train_reps: int  # … of the training-job launches (§2, 5, 7): noisier, so a few more
    cli_reps: int
    teardown_reps: int  # tiny-task teardowns; enough for a p95
    tf_alone_reps: int  # the same crash without tfl: TensorFlow noticing on its own
    local_ns: tuple[int, ...]
    ssh_ns: tuple[int, ...]
    train_job: Path
    epochs: int
    steps_per_epoch: int
    global_batch: int
    train_workers: tuple[int, ...]  # throughput at these sizes; launch overhead at those > 1
    backup_every: int  # restart measure: backup interval (steps) …
    crash_step: int  # … and the step at which a worker is killed
    train_rounds: int = 4  # 8. training throughput: rounds of kit, hand-written, before at 1 and 2 workers
    throughput_epochs: int = 3  # … epochs per run (the first is left out of the rate)
    accuracy_epochs: int = 10  # … Fashion-MNIST accuracy and fidelity runs
    scaling_epochs: int = 3  # … batch-scaling runs
    store_runs: int = 50  # runs in the store for `tfl status`
    store_runs_many: int = 3000  # … and a store after weeks of sweeps
    chaos_trials: int = 20  # §9: runs, each with one task killed at a random moment
    lost_host_trials: int = 10  # §13: trials of each lost-host measure (a cut host, a launcher killed -9)
    tfl_preemption_trials: int = 3  # §12: trials local and over SSH (each two TensorFlow start-ups, twice)
    elastic_reps: int = 3  # §14: repetitions of each elastic run (TF-free, then real TensorFlow)
    elastic_intervals: tuple[int, ...] = (5, 20, 50)  # §14: backup intervals B of the real-TensorFlow runs
    many_hosts: tuple[int, ...] = (16, 64, 128, 256)  # §18: hosts, one task each …
    many_wide: tuple[int, int] = (32, 8)  # … and hosts × tasks per host
    many_idle_s: float = 60.0  # … the launcher's idle window

    @classmethod
    def full(cls) -> Config:
        return cls(quick=False, reps=5, train_reps=9, cli_reps=21, teardown_reps=20, tf_alone_reps=5,
                   local_ns=(1, 2, 4, 8, 16, 32), ssh_ns=(1, 2, 4, 8), train_job=MNIST,
                   epochs=2, steps_per_epoch=40, global_batch=128, train_workers=(1, 2, 4),
                   backup_every=10, crash_step=37)

    @classmethod
    def quick_mode(cls) -> Config:
        # One repetition of each measure: quick mode proves that every phase runs and reports
        # (tests/test_bench_quick.py), its numbers say nothing; more repetitions cost CI minutes.
        return cls(quick=True, reps=1, train_reps=1, cli_reps=2, teardown_reps=3, tf_alone_reps=0, store_runs_many=300,
                   local_ns=(1, 4), ssh_ns=(1, 2), train_job=FAKE_TRAIN,
                   epochs=2, steps_per_epoch=10, global_batch=64, train_workers=(1, 2),
                   backup_every=5, crash_step=12, train_rounds=2, throughput_epochs=3, chaos_trials=3,
                   lost_host_trials=1, tfl_preemption_trials=0, elastic_reps=1, elastic_intervals=(),
                   many_hosts=(4,), many_wide=(2, 2), many_idle_s=3.0)

    def with_trials(self, trials: int) -> Config:
        """``--trials N``: N trials or repetitions of each trial-based phase (hosts, tfl-preemption, elastic)."""
        return replace(self, lost_host_trials=trials, tfl_preemption_trials=trials,
                       elastic_reps=trials, chaos_trials=trials)

    @property
    def uses_mnist(self) -> bool:
        return self.train_job == MNIST

    @property
    def job_label(self) -> str:
        return "MNIST (jobs/mnist.py)" if self.uses_mnist else "fake_train (TF-free quick-mode stand-in)"


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    return {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "memory": f"{_mem_total_gib():.1f} GiB",
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "tensorflow": _version("tensorflow"),
        "tf-keras": _version("tf-keras"),
        "typer / pydantic / psutil": " / ".join(_version(p) for p in ("typer", "pydantic", "psutil")),
        "openssh": _sshd_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _sshd_version() -> str:
    try:
        out = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=5)
        return (out.stderr or out.stdout).strip().split(",")[0] or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "not installed"


def timestamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z")
