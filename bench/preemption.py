"""11. Preemption in the job (issue 19): what the notice watch and the input position cost, and how
long a notice takes to become the agreed checkpoint on disk.

- rounds: jobs/mnist.py on Fashion-MNIST with today's kit and with the kit just before
  issue 19 (commit BEFORE, from `git archive`), back to back at 1 process and at 2
  MultiWorkerMirroredStrategy workers, the order turning each round; examples/s of the
  epochs after the first, ratio within each round;
- notices: 2 workers; SIGTERM to the worker once the chief reports a step of epoch 2; the
  time from the signal to the chief's `preempted.json` (written once the agreed checkpoint
  is on disk), against the step time the chief reported just before.
Quick mode runs the rounds with the TF-free stand-in (its numbers say nothing) and skips
the notices.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import FAKE_TRAIN, MNIST, PYTHON, ROOT, BenchError, Section, Stats, Workspace, assert_none_left, ratio_stats, verdict
from bench.config import Config
from bench.runs import free_ports
from bench.trainruns import run_group, tf_config
from launcher.contract import PREEMPTED_EXIT_CODE, ModelDirLayout, PreemptedRecord

FASHION = Path("/usr/share/datasets/fashion-mnist")
BEFORE = "b0058f9"  # main just before issue 19's kit work
GLOBAL_BATCH, TRAIN_EXAMPLES = 128, 60000
SPEED_TARGET = 0.98
NOTICES = 3


@dataclass
class PreemptionRuns:
    rate: dict[str, dict[int, list[float]]] = field(default_factory=dict)  # kind -> tasks -> examples/s per round
    notice_s: list[float] = field(default_factory=list)  # SIGTERM -> preempted.json written
    step_s: list[float] = field(default_factory=list)  # the step time just before the notice
    check_us: float | None = None  # the handler's check, once per call of the train function
    skipped: str = ""


def preemption_runs(cfg: Config, ws: Workspace) -> PreemptionRuns:
    runs = PreemptionRuns()
    if not cfg.quick and not (FASHION / "train-images-idx3-ubyte.gz").exists():
        runs.skipped = f"{FASHION} is missing (apt-get install dataset-fashion-mnist)"
        return runs
    before = None if cfg.quick else _kit_before(ws)
    kinds = ("kit", "before")
    for rnd in range(cfg.train_rounds):
        for n in (1, 2):
            for kind in (kinds if rnd % 2 == 0 else tuple(reversed(kinds))):
                runs.rate.setdefault(kind, {}).setdefault(n, []).append(_rate(cfg, ws, kind, n, rnd, before))
    if cfg.quick:
        runs.skipped = "quick mode: no TensorFlow"
        return runs
    runs.check_us = _check_cost()
    for i in range(NOTICES):
        notice_s, step_s = _notice(ws, f"notice-{i}")
        runs.notice_s.append(notice_s)
        runs.step_s.append(step_s)
    return runs


CHECK_CODE = """
import os, time
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf
from launcher.jobkit.context import TaskContext
from launcher.jobkit.preemption import preemption_handler
unused = tf.train.CheckpointManager(tf.train.Checkpoint(), "/nonexistent/unused", max_to_keep=1)
handler = preemption_handler(tf.distribute.get_strategy(), unused, save=lambda: None, exit=lambda: None,
                             context=TaskContext("chief", 0))
n = 20000
started = time.perf_counter()
for _ in range(n):
    handler.save_checkpoint_if_preempted()
print((time.perf_counter() - started) / n * 1e6)
"""


def _check_cost() -> float:
    """Microseconds per call of the check the kit makes after each call of the train function."""
    out = subprocess.run([PYTHON, "-c", CHECK_CODE], capture_output=True, text=True, check=True, cwd=ROOT, timeout=300)
    return float(out.stdout.strip().splitlines()[-1])


def _kit_before(ws: Workspace) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE, "launcher", "jobs"], capture_output=True,
                             check=True, timeout=120).stdout
    dest = ws.root / f"kit-{BEFORE}"
    dest.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def _rate(cfg: Config, ws: Workspace, kind: str, n: int, rnd: int, before: Path | None) -> float:
    batch, epochs = str(GLOBAL_BATCH // n), str(cfg.throughput_epochs)
    if cfg.quick:
        steps = 20
        result = run_group(ws, f"pre-{kind}-{n}-r{rnd}", FAKE_TRAIN, n,
                           ["--epochs", epochs, "--steps-per-epoch", str(steps), "--batch-size", batch])
        return result.steady_rate(steps * GLOBAL_BATCH)
    args = ["--dataset", "fashion_mnist", "--data", str(FASHION), "--epochs", epochs, "--batch-size", batch]
    if kind == "before" and before is not None:
        result = run_group(ws, f"pre-{kind}-{n}-r{rnd}", before / "jobs" / "mnist.py", n, args,
                           env={"PYTHONPATH": str(before)})
    else:
        result = run_group(ws, f"pre-{kind}-{n}-r{rnd}", MNIST, n, args)
    return result.steady_rate(TRAIN_EXAMPLES // GLOBAL_BATCH * GLOBAL_BATCH)


def _notice(ws: Workspace, label: str) -> tuple[float, float]:
    """SIGTERM to the worker of a 2-worker group in epoch 2: (seconds to the checkpoint on disk, step seconds)."""
    home = ws.home(label)
    run_dir, model_dir = home / "run", home / "model"
    run_dir.mkdir(parents=True)
    ports = free_ports(2)
    procs = []
    for kind in ("chief", "worker"):
        env = ws.env(home, TF_USE_LEGACY_KERAS="1", PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2", TFL_RUN_ID=label,
                     TFL_TASK=f"{kind}:0", TFL_ATTEMPT="0", TFL_RUN_DIR=str(run_dir),
                     TFL_PROGRESS_FILE=str(run_dir / f"{kind}-0.progress.json"),
                     TF_CONFIG=tf_config(ports, kind, 0, False))
        log = (run_dir / f"{kind}.log").open("w")
        procs.append(subprocess.Popen(
            [PYTHON, "-u", str(MNIST), "--dataset", "fashion_mnist", "--data", str(FASHION), "--epochs", "3",
             "--batch-size", str(GLOBAL_BATCH // 2), "--model-dir", str(model_dir)], env=env, cwd=ROOT,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    try:
        step_s = _wait_for_epoch_2(run_dir / "chief-0.progress.json", procs)
        sent = time.time()
        os.kill(procs[1].pid, signal.SIGTERM)
        codes = [p.wait(timeout=300) for p in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert_none_left(home)
    if codes != [PREEMPTED_EXIT_CODE] * 2:
        raise BenchError(f"{label}: exit codes {codes}, expected {PREEMPTED_EXIT_CODE}:\n"
                         f"{(run_dir / 'chief.log').read_text()[-3000:]}")
    record = PreemptedRecord.from_dict(json.loads(ModelDirLayout(model_dir).preempted_file.read_text()))
    if record is None:
        raise BenchError(f"{label}: no preempted record")
    return record.time - sent, step_s


def _wait_for_epoch_2(progress: Path, procs: list[subprocess.Popen[bytes]]) -> float:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            record = json.loads(progress.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            record = {}
        if record.get("epoch", 0) >= 2 and record.get("step", 0) >= 20 and record.get("examples_per_sec"):
            return GLOBAL_BATCH / float(record["examples_per_sec"])
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.05)
    raise BenchError("the chief never reported a step of epoch 2")


def preemption_section(cfg: Config, runs: PreemptionRuns) -> Section:
    rows: list[list[str]] = []
    rounds = f"{cfg.train_rounds} rounds, the order turning each round; ratio within each round"
    ratios = {}
    for n, label in ((1, "1 process"), (2, "2 workers")):
        ratio = ratio_stats(runs.rate["kit"][n], runs.rate["before"][n])
        ratios[n] = ratio.median
        rows.append([f"examples/s, kit / the kit before issue 19 ({BEFORE}), {label}",
                     f"{ratio.fmt(digits=3, unit='×')}; {Stats.of(runs.rate['kit'][n]).median:.0f} / "
                     f"{Stats.of(runs.rate['before'][n]).median:.0f} ex/s", f"≥ {SPEED_TARGET}×",
                     f"{rounds}; examples/s of epochs 2–{cfg.throughput_epochs} from the chief's epoch lines"])
    if runs.notice_s:
        notice, step = Stats.of(runs.notice_s), Stats.of(runs.step_s)
        rows.append(["notice → agreed checkpoint on disk, 2 workers", f"{notice.fmt(digits=2, unit=' s')}; "
                     f"step {step.fmt(scale=1000, digits=1, unit=' ms')}", "report",
                     f"{len(runs.notice_s)} runs; SIGTERM to worker:0 in epoch 2, until the chief's preempted.json; "
                     "the step time is the chief's last record before it"])
    else:
        rows.append(["notice → agreed checkpoint on disk", f"not measured ({runs.skipped})", "report", ""])
    if runs.check_us is not None:
        rows.append(["the notice check, per call of the train function", f"{runs.check_us:.1f} µs", "report",
                     "20,000 calls of the handler's check in one process (what PreemptionCheckpoint runs per call)"])
    ok = min(ratios.values()) >= SPEED_TARGET
    return Section(
        11, "Preemption in the job", f"kit with the notice watch and the input position ≥ {SPEED_TARGET}× the kit "
        "before issue 19 (examples/s); notice → checkpoint reported",
        ["measure", "result: median (min–max)", "target", "how it was measured"], rows,
        verdict(ok) if not cfg.quick else "n/a",
        notes=["jobs/mnist.py on Fashion-MNIST (global batch 128), started directly as the launcher's plan starts it. "
               "Nothing is added per step but a check of a flag after each call of the train function; the input "
               "position costs nothing while training (it follows from the backup's epoch and step), and a resumed "
               "attempt seeks its batch by position instead of replaying the ones before it (jobs/mnist.py's "
               "addressed input, §17).",
               "The notice is taken at the end of the call running when it comes; the tasks then train one more call "
               "and save there (TensorFlow's PreemptionCheckpointHandler), so the time is about two calls (~0.2 s "
               "each) plus the save." + (f" {runs.skipped}." if runs.skipped else "")],
        raw={"rate": runs.rate, "notice_s": runs.notice_s, "step_s": runs.step_s},
        headline=(f"kit / before: 1 process {ratios[1]:.3f}×, 2 workers {ratios[2]:.3f}×"
                  + (f"; notice → checkpoint {Stats.of(runs.notice_s).median:.2f} s" if runs.notice_s else "")))
