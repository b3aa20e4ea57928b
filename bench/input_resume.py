"""`uv run python -m bench.input_resume [--reps N] [--raw FILE]`: §17, what a resume costs the input.

One process (the default strategy), Fashion-MNIST (Debian's package), batch 64, 100 steps
per keras epoch. For each input and position k the job starts with a backup at global
step k (the epoch and step BackupAndRestore keeps; tests.jobkit_helpers.write_backup_at) and
the figure is the time from the process's start to its first trained step's progress
record. Inputs:

- ``addressed``: jobs/mnist.py's ArrayInput (in memory, a permutation per pass);
- ``tfrecord``: jobs/fashion_records.py on 8 PNG shards (decode + augment per example);
- ``replay``: jobs/mnist.py --input pipeline, the tf.data pipeline before addressed input
  (``shuffle(60000)``, batch, map), which reaches step k by ``skip(k)``: the reference.

Training speed: examples/s of ``addressed`` against ``replay``'s pipeline, same job, batch
and steps per call (10), the median of the per-call figures after the first 100 steps,
runs interleaved. Prints the Markdown for docs/benchmarks.md §17 and writes every sample
as JSON (--raw).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.jobkit_helpers import FASHION_MNIST, write_backup_at

ROOT = Path(__file__).resolve().parents[1]
STEPS, BATCH = 100, 64
POSITIONS = (0, 1_000, 10_000, 100_000)
INPUTS = {
    "addressed": ["jobs/mnist.py", "--dataset", "fashion_mnist"],
    "tfrecord": ["jobs/fashion_records.py"],
    "replay": ["jobs/mnist.py", "--dataset", "fashion_mnist", "--input", "pipeline"],
}


def env(base: Path) -> dict[str, str]:
    (base / "home").mkdir(parents=True, exist_ok=True)
    out = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "TFL_"))}
    out.update({"HOME": str(base / "home"), "TF_CPP_MIN_LOG_LEVEL": "2", "TF_USE_LEGACY_KERAS": "1",
                "TFL_PROGRESS_LOG": str(base / "steps.jsonl"), "TFL_PROGRESS_FILE": str(base / "progress.json")})
    return out


def records(base: Path) -> list[dict[str, Any]]:
    path = base / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def run(kind: str, base: Path, args: list[str], until: int, limit_s: float = 900) -> tuple[float, list[dict[str, Any]]]:
    """Start one job; return (seconds from start to the first train record, the train records) once
    `until` train records came (then the job is stopped)."""
    base.mkdir(parents=True, exist_ok=True)
    log = (base / "job.log").open("wb")
    began = time.monotonic()
    popen = subprocess.Popen([sys.executable, *INPUTS[kind][:1], *INPUTS[kind][1:], *args], cwd=ROOT, env=env(base),
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    first = None
    try:
        while time.monotonic() - began < limit_s:
            trained = [r for r in records(base) if r["phase"] == "train"]
            if trained and first is None:
                first = time.monotonic() - began
            if len(trained) >= until or popen.poll() is not None:
                break
            time.sleep(0.02)
    finally:
        if popen.poll() is None:
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        log.close()
    if first is None:
        tail = (base / "job.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{kind}: no step (exit {popen.returncode}, limit {limit_s} s):\n{tail}")
    return first, [r for r in records(base) if r["phase"] == "train"]


def job_args(model_dir: Path, shards: Path, kind: str, epochs: int, steps_per_call: int) -> list[str]:
    args = ["--epochs", str(epochs), "--steps-per-epoch", str(STEPS), "--batch-size", str(BATCH),
            "--model-dir", str(model_dir), "--steps-per-execution", str(steps_per_call), "--seed", "1"]
    return args + (["--records", str(shards)] if kind == "tfrecord" else [])


def resume_sample(work: Path, shards: Path, kind: str, position: int, rep: int) -> float:
    base = work / f"{kind}-{position}-{rep}"
    model_dir = base / "model"
    if position:
        write_backup_at(model_dir, position, STEPS)
    seconds, _ = run(kind, base, job_args(model_dir, shards, kind, position // STEPS + 2, 1), until=1)
    return seconds


def speed_sample(work: Path, kind: str, rep: int) -> float:
    base = work / f"speed-{kind}-{rep}"
    _, trained = run(kind, base, job_args(base / "model", work, kind, 6, 10), until=60)
    rates = [r["examples_per_sec"] for r in trained if r["global_step"] > STEPS and r.get("examples_per_sec")]
    return statistics.median(rates)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--raw", type=Path, default=ROOT / "docs" / "bench-input-resume.json")
    parser.add_argument("--no-replay-at", type=int, default=None, help="skip the replay at positions above this")
    args = parser.parse_args()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-input-") as tmp:
        work = Path(tmp)
        shards = work / "shards"
        subprocess.run([sys.executable, "jobs/prepare_fashion_records.py", "--out", str(shards), "--shards", "8",
                        "--data", str(FASHION_MNIST)], cwd=ROOT, env=env(work), check=True, capture_output=True)
        resume: dict[str, dict[int, list[float]]] = {k: {p: [] for p in POSITIONS} for k in INPUTS}
        speed: dict[str, list[float]] = {"addressed": [], "replay": []}
        for rep in range(args.reps):
            for position in POSITIONS:
                for kind in INPUTS:
                    if kind == "replay" and args.no_replay_at is not None and position > args.no_replay_at:
                        continue
                    resume[kind][position].append(resume_sample(work, shards, kind, position, rep))
                    print(f"{kind} at {position}: {resume[kind][position][-1]:.1f} s", flush=True)
                    keep(args.raw, args.reps, began, resume, speed)
            for kind in speed:
                speed[kind].append(speed_sample(work, kind, rep))
                print(f"{kind} speed: {speed[kind][-1]:.0f} examples/s", flush=True)
                keep(args.raw, args.reps, began, resume, speed)
    print(report(json.loads(args.raw.read_text())))
    return 0


def keep(path: Path, reps: int, began: float, resume: dict[str, dict[int, list[float]]],
         speed: dict[str, list[float]]) -> None:
    """Every sample so far, as JSON (rewritten after each one: a cut-short run keeps what it measured)."""
    raw = {"reps": reps, "took_min": round((time.monotonic() - began) / 60, 1),
           "load1_now": round(os.getloadavg()[0], 1), "first_step_s": resume, "examples_per_s": speed}
    path.write_text(json.dumps(raw, indent=1) + "\n")


def report(raw: dict[str, Any]) -> str:
    def cell(samples: list[float]) -> str:
        if not samples:
            return "not measured"
        return f"{statistics.median(samples):.1f} s ({min(samples):.1f}–{max(samples):.1f})"

    lines = ["| input | " + " | ".join(f"k = {p:,}" for p in POSITIONS) + " | at 100,000 / at 0 |",
             "|---|" + "---|" * (len(POSITIONS) + 1)]
    for kind, by_position in raw["first_step_s"].items():  # read back from JSON: the positions are strings
        cells = [cell(by_position.get(str(p), [])) for p in POSITIONS]
        at0, far = by_position.get("0", []), by_position.get("100000", [])
        ratio = f"{statistics.median(far) / statistics.median(at0):.2f}x" if at0 and far else "—"
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {ratio} |")
    new, old = raw["examples_per_s"]["addressed"], raw["examples_per_s"]["replay"]
    if not new or not old:
        return "\n".join([*lines, "", "Training speed: not measured."])
    ratios = [a / b for a, b in zip(new, old, strict=False)]
    lines += ["", f"Training speed: addressed {statistics.median(new):.0f} examples/s, the replayed pipeline "
              f"{statistics.median(old):.0f}; ratio per interleaved pair {', '.join(f'{r:.2f}' for r in ratios)} "
              f"(median {statistics.median(ratios):.2f}x; goal >= 0.97x)."]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
