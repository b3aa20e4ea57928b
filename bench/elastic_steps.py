"""`uv run python -m bench.elastic_steps [--reps N] [--intervals 5,20,50]`: §14, steps lost per
abrupt host loss against the backup interval, with real TensorFlow.

Needs root (``tests.netbed``). Chief on the first host, workers on the two others,
``--min-tasks 2``, bench/jobs/paced.py (a tiny Keras model, every task sleeping 0.05 s a step,
the chief logging each step it trains) with the kit's ``--backup-every-steps B`` and
``--steps-per-execution 1``. At a random step between B + 5 and 2B + 5 the third host is cut:
the steps lost are the last step the chief trained in the attempt that lost the host minus
the step the resized attempt resumes from (steps trained again).

The ``elastic`` phase of ``python -m bench`` runs these (bench/elastic_report.py) and keeps the samples in the
report; run alone, this prints a Markdown table to look at.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.elastic import wait
from launcher.describe.ports import free_port
from tests.netbed import NetBed, make_netbed, netbed_available

PACED = Path(__file__).resolve().parent / "jobs" / "paced.py"
QUIET = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def steps(shared: Path) -> list[dict[str, float]]:
    try:
        text = next(shared.glob("*/model/steps.jsonl")).read_text()
    except (StopIteration, OSError):
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def one_run(bed: NetBed, base: Path, *, backup: int, at_step: int) -> dict[str, float]:
    """One run: the third host cut once the chief has trained ``at_step`` steps."""
    base.mkdir(parents=True)
    h1, h2, h3 = bed.addresses
    shared = base / "shared"
    shared.mkdir()
    tasks = {"chief": [f"{h1}:{free_port()}"], "worker": [f"{h2}:{free_port()}", f"{h3}:{free_port()}"]}
    cluster = bed.cluster_file(base / "cluster.json", tasks, sys.executable, ssh={"fence_after": 6},
                               storage={"path": str(shared)}, env=QUIET, elastic={"min_tasks": 2, "global_batch": 24})
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(PACED), "--cluster", str(cluster),
                                 "--grace-period", "5", "--probe-interval", "1000", "--", "--epochs", "1",
                                 "--steps-per-epoch", "5000", "--step-sleep", "0.05", "--backup-every-steps",
                                 str(backup), "--steps-per-execution", "1"],
                                env={**os.environ, "TFL_HOME": str(base / "home")}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        wait(lambda: max((s["step"] for s in steps(shared)), default=0) >= at_step, timeout=600)
        bed.cut(h3)
        wait(lambda: any(s["attempt"] == 1 for s in steps(shared)), timeout=600)
        reached = max(int(s["step"]) for s in steps(shared) if s["attempt"] == 0)
        first = min(int(s["step"]) for s in steps(shared) if s["attempt"] == 1)
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(90)
        finally:
            launcher.kill()
            bed.join(h3)
    return {"reached": reached, "resumed_at": first - 1, "lost_steps": reached - (first - 1)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--intervals", default="5,20,50", help="backup intervals B, comma-separated")
    options = parser.parse_args()
    why = netbed_available()
    if why:
        print(f"bench.elastic_steps: skipped: {why}", file=sys.stderr)
        return 1
    intervals = [int(b) for b in options.intervals.split(",")]
    rng = random.Random(14)
    started = time.time()
    rows: dict[int, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tfl-bench-elastic-steps-") as tmp:
        bed = make_netbed(Path(tmp) / "bed")
        try:
            for rep in range(options.reps):
                for backup in intervals:
                    at = rng.randrange(backup + 5, 2 * backup + 5)
                    result = one_run(bed, Path(tmp) / f"{rep}-{backup}", backup=backup, at_step=at)
                    print(f"B={backup} cut at {at}: {result}", file=sys.stderr, flush=True)
                    rows.setdefault(backup, []).append(result)
        finally:
            bed.teardown()
    print(render(rows, time.time() - started, options.reps))
    return 0


def render(rows: dict[int, list[dict[str, float]]], took: float, reps: int) -> str:
    lines = [f"`uv run python -m bench.elastic_steps --reps {reps}` (root; the network test bed, real TensorFlow), "
             f"took {took / 60:.1f} min, 1-min load {os.getloadavg()[0]:.1f} at the end.\n",
             "| backup interval B (steps) | steps lost (trained again), median (min–max) | each trial: last step → resumed from | ≤ B |",
             "|---|---|---|---|"]
    for backup, results in rows.items():
        lost = [int(r["lost_steps"]) for r in results]
        trials = ", ".join(f"{int(r['reached'])} → {int(r['resumed_at'])}" for r in results)
        lines.append(f"| {backup} | {statistics.median(lost):g} ({min(lost)}–{max(lost)}) | {trials} | "
                     f"{'yes' if max(lost) <= backup else 'no'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
