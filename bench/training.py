"""8. Training throughput: the job kit against hand-written tf_keras on real data (issue 14).

Every process group is started directly (no tfl), the way the launcher's plan starts it,
so the figures are the jobs' own. Three kinds of runs:
- rounds: in each, jobs/mnist.py (the kit), bench/jobs/handwritten_mnist.py, the kit at one
  step per call, and the kit as it was before issue 14 (commit f29eab2, from `git archive`,
  skipped where the clone lacks it) run back to back at 1 process and at 2
  MultiWorkerMirroredStrategy workers, the order turning each round;
- fidelity and accuracy: 10 epochs at 1 process and 2 workers with an evaluator, in
  float32 (accuracy) and float64 (per-epoch loss, no rounding noise);
- batch scaling: 1, 2 and 4 replicas (MirroredStrategy over logical CPUs), per-replica
  batch fixed, the learning rate as it is against linear scaling with a 1-epoch warm-up;
- a profile of a 2-worker step (bench/jobs/mwms_profile.py): all-reduces and their cost.
Quick mode runs the rounds with the TF-free stand-in (its numbers say nothing).
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import FAKE_TRAIN, MNIST, ROOT, Workspace
from bench.config import Config
from bench.trainruns import GroupResult, run_group
from launcher.jobkit.datasets import read_idx_dir

HANDWRITTEN = ROOT / "bench" / "jobs" / "handwritten_mnist.py"
PROFILE = ROOT / "bench" / "jobs" / "mwms_profile.py"
FASHION = Path("/usr/share/datasets/fashion-mnist")
GLOBAL_BATCH = 128
TRAIN_EXAMPLES = 60000
KINDS = ("kit", "hand", "before", "old")  # before: today's kit at one step per call; old: the kit before issue 14
OLD_KIT = "f29eab2"  # the last commit before issue 14's work on the kit


@dataclass
class TrainingRuns:
    """Everything measured, by kind and size; lists are per round (same index = same round)."""

    rate: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # examples/s, epochs 2..E
    rss_mb: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # peak RSS, largest training task
    wall_s: dict[str, dict[int, list[float]]] = field(default_factory=dict)
    chosen_spe: list[str] = field(default_factory=list)  # the kit's "N steps per call" lines
    accuracy: dict[str, dict[int, list[tuple[int, float, float]]]] = field(default_factory=dict)  # dtype -> n -> epochs
    test_accuracy: dict[str, dict[int, float]] = field(default_factory=dict)
    scaling: dict[str, dict[int, dict[str, float]]] = field(default_factory=dict)  # lr scaling -> replicas -> values
    profile: dict[str, Any] = field(default_factory=dict)  # bench/jobs/mwms_profile.py's chief line
    skipped: str = ""  # why the TensorFlow parts were not measured

    def add(self, kind: str, n: int, result: GroupResult, examples_per_epoch: int) -> None:
        for table, value in ((self.rate, result.steady_rate(examples_per_epoch)), (self.rss_mb, result.peak_rss_mb),
                             (self.wall_s, result.wall_s)):
            table.setdefault(kind, {}).setdefault(n, []).append(value)


def training_runs(cfg: Config, ws: Workspace) -> TrainingRuns:
    runs = TrainingRuns()
    if not cfg.quick and not (FASHION / "train-images-idx3-ubyte.gz").exists():
        runs.skipped = f"{FASHION} is missing (apt-get install dataset-fashion-mnist)"
        return runs
    old = None if cfg.quick else _old_kit(ws)
    kinds = KINDS if old is not None or cfg.quick else KINDS[:-1]
    for rnd in range(cfg.train_rounds):
        for n in (1, 2):
            for kind in (kinds if rnd % 2 == 0 else tuple(reversed(kinds))):
                _one_round_run(cfg, ws, runs, kind, n, rnd, old)
    if cfg.quick:
        runs.skipped = "quick mode: no TensorFlow"
        return runs
    _accuracy_runs(cfg, ws, runs)
    _scaling_runs(cfg, ws, runs)
    profile = run_group(ws, "mwms-profile", PROFILE, 2, [])
    runs.profile = json.loads(next(line for _, line in profile.chief.lines if line.startswith("{")))
    return runs


def _old_kit(ws: Workspace) -> Path | None:
    """The kit and jobs as of OLD_KIT, with Fashion-MNIST as the .npz its loader takes; None without git or the commit."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_KIT, "launcher", "jobs"], capture_output=True,
                                 check=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    dest = ws.root / f"kit-{OLD_KIT}"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    (x_train, y_train), (x_test, y_test) = read_idx_dir(FASHION)
    np.savez(dest / "fashion_mnist.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return dest


def _one_round_run(cfg: Config, ws: Workspace, runs: TrainingRuns, kind: str, n: int, rnd: int,
                   old: Path | None) -> None:
    batch = str(GLOBAL_BATCH // n)
    epochs = str(cfg.throughput_epochs)
    if cfg.quick:  # the stand-in: same protocol (epoch lines), no TensorFlow
        steps = 20
        result = run_group(ws, f"{kind}-{n}-r{rnd}", FAKE_TRAIN, n, ["--epochs", epochs, "--steps-per-epoch", str(steps),
                                                                      "--batch-size", batch])
        runs.add(kind, n, result, steps * GLOBAL_BATCH)
        return
    steps_per_epoch = TRAIN_EXAMPLES // GLOBAL_BATCH
    if kind == "hand":
        args = ["--data", str(FASHION), "--model-dir", str(ws.root / f"hand-{n}-r{rnd}"), "--epochs", epochs,
                "--batch-size", batch]
        result = run_group(ws, f"{kind}-{n}-r{rnd}", HANDWRITTEN, n, args)
    elif kind == "old" and old is not None:
        args = ["--data", str(old / "fashion_mnist.npz"), "--epochs", epochs, "--batch-size", batch]
        result = run_group(ws, f"{kind}-{n}-r{rnd}", old / "jobs" / "mnist.py", n, args, env={"PYTHONPATH": str(old)})
    else:
        args = ["--dataset", "fashion_mnist", "--data", str(FASHION), "--epochs", epochs, "--batch-size", batch,
                *(["--steps-per-execution", "1"] if kind == "before" else [])]
        result = run_group(ws, f"{kind}-{n}-r{rnd}", MNIST, n, args)
        if kind == "kit":
            runs.chosen_spe += [line for _, line in result.chief.lines if "steps per call of the train function from" in line]
    runs.add(kind, n, result, steps_per_epoch * GLOBAL_BATCH)


def _accuracy_runs(cfg: Config, ws: Workspace, runs: TrainingRuns) -> None:
    for dtype in ("float32", "float64"):
        for n in (1, 2):
            args = ["--dataset", "fashion_mnist", "--data", str(FASHION), "--epochs", str(cfg.accuracy_epochs),
                    "--batch-size", str(GLOBAL_BATCH // n), "--dtype", dtype]
            result = run_group(ws, f"accuracy-{dtype}-{n}", MNIST, n, args, evaluator=True, timeout=1800)
            runs.accuracy.setdefault(dtype, {})[n] = [(e, loss, acc) for _, e, loss, acc in result.chief.epochs()]
            evals = result.tasks[-1].evals()
            runs.test_accuracy.setdefault(dtype, {})[n] = evals[-1][2] if evals else float("nan")


def _scaling_runs(cfg: Config, ws: Workspace, runs: TrainingRuns) -> None:
    for replicas in (1, 2, 4):
        for scaling in ("none", "linear"):
            if replicas == 1 and scaling == "linear":
                runs.scaling.setdefault(scaling, {})[1] = runs.scaling["none"][1]  # the same run: nothing to scale
                continue
            args = ["--dataset", "fashion_mnist", "--data", str(FASHION), "--epochs", str(cfg.scaling_epochs),
                    "--batch-size", "64", "--lr-scaling", scaling, "--warmup-epochs", "1" if scaling == "linear" else "0"]
            result = run_group(ws, f"scaling-{scaling}-{replicas}", MNIST, 1, args, evaluator=True, timeout=1800,
                               env={"TFL_VIRTUAL_DEVICES": str(replicas)})
            _, _, loss, acc = result.chief.epochs()[-1]
            evals = result.tasks[-1].evals()
            runs.scaling.setdefault(scaling, {})[replicas] = {
                "loss": loss, "accuracy": acc, "test_accuracy": evals[-1][2] if evals else float("nan")}
