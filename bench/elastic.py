"""`uv run python -m bench.elastic [--reps N]`: §14, elastic runs on the network test bed.

Needs root (``tests.netbed``: hosts in network namespaces with their own sshd). Chief on the
first host, workers on the two others, a TensorFlow-free job that takes a step every 0.1 s,
the chief keeping a checkpoint of the step every B steps in the shared model dir.

- **Host lost → training again:** the third host is cut (``--min-tasks 2``): seconds from the
  cut to the first step of the resized attempt; against a restart of the same size: the
  third host's task is SIGKILLed (``--max-restarts 1``, no elastic), seconds from the kill to
  the first step of the next attempt.
- **Steps lost per abrupt loss:** the last step the chief reached in the attempt that lost a
  task, minus the step the next attempt resumes from (steps trained twice), for backup
  intervals B = 5 and 20.

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
import textwrap
import time
from pathlib import Path

from launcher.describe.ports import free_port
from tests.netbed import NetBed, make_netbed, netbed_available

JOB = """
import json, os, signal, sys, time
TOTAL, EVERY, BACKUP = 100000, 0.1, int(os.environ["BENCH_BACKUP"])
config = json.loads(os.environ["TF_CONFIG"])
lead = config["task"]["type"] == "chief"
root = os.environ["TFL_MODEL_DIR"]
os.makedirs(root, exist_ok=True)
ckpt = os.path.join(root, "step.json")
step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
attempt = os.environ["TFL_ATTEMPT"]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
while step < TOTAL:
    time.sleep(EVERY)
    step += 1
    if lead:
        with open(os.path.join(root, "steps.jsonl"), "a") as f:
            f.write(json.dumps({"attempt": int(attempt), "step": step, "time": time.time()}) + "\\n")
        if step % BACKUP == 0:
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(ckpt + ".tmp", ckpt)
"""


def steps(shared: Path) -> list[dict[str, float]]:
    try:
        text = next(shared.glob("*/model/steps.jsonl")).read_text()
    except (StopIteration, OSError):
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def wait(predicate, timeout: float = 180.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met")
        time.sleep(0.05)


def one_run(bed: NetBed, base: Path, *, elastic: bool, backup: int, at_step: int) -> dict[str, float]:
    """One run: the third host cut (elastic) or its task killed (restart) at ``at_step``."""
    base.mkdir(parents=True)
    h1, h2, h3 = bed.addresses
    shared = base / "shared"
    shared.mkdir()
    job = base / "job.py"
    job.write_text(textwrap.dedent(JOB))
    tasks = {"chief": [f"{h1}:{free_port()}"], "worker": [f"{h2}:{free_port()}", f"{h3}:{free_port()}"]}
    extra = {"elastic": {"min_tasks": 2, "global_batch": 6}} if elastic else {}
    cluster = bed.cluster_file(base / "cluster.json", tasks, sys.executable, ssh={"fence_after": 6},
                               storage={"path": str(shared)}, env={"BENCH_BACKUP": str(backup)}, **extra)
    env = {**os.environ, "TFL_HOME": str(base / "home")}
    args = ["--probe-interval", "1000"] if elastic else ["--max-restarts", "1"]
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--cluster", str(cluster),
                                 "--grace-period", "5", *args], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        wait(lambda: bool(steps(shared)) and steps(shared)[-1]["step"] >= at_step)
        if elastic:
            bed.cut(h3)
        else:
            victims = [p for p in bed.pids(bed.host(h3)) if b"job.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
            os.kill(victims[0], signal.SIGKILL)
        fault = time.time()
        wait(lambda: any(s["attempt"] == 1 for s in steps(shared)))
        first = next(s for s in steps(shared) if s["attempt"] == 1)
        # The last step of the attempt that lost a task (this job has no all-reduce to stall on,
        # so its chief steps on until the loss is known; TensorFlow's would stop at the cut).
        reached = max(int(s["step"]) for s in steps(shared) if s["attempt"] == 0)
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(60)
        finally:
            launcher.kill()
            bed.join(h3)
    return {"again_s": first["time"] - fault, "lost_steps": reached - (int(first["step"]) - 1)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=2)
    options = parser.parse_args()
    why = netbed_available()
    if why:
        print(f"bench.elastic: skipped: {why}", file=sys.stderr)
        return 1
    rng = random.Random(12)
    started = time.time()
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="tfl-bench-elastic-") as tmp:
        bed = make_netbed(Path(tmp) / "bed")
        try:
            for rep in range(options.reps):
                for name, elastic, backup in (("restart, same size (task killed)", False, 5),
                                              ("elastic, B=5 (host cut)", True, 5), ("elastic, B=20 (host cut)", True, 20)):
                    at = rng.randrange(25, 45)
                    rows.setdefault(name, []).append(
                        one_run(bed, Path(tmp) / f"{rep}-{backup}-{elastic}", elastic=elastic, backup=backup, at_step=at))
        finally:
            bed.teardown()
    print(render(rows, time.time() - started, options.reps))
    return 0


def render(rows: dict[str, list[dict[str, float]]], took: float, reps: int) -> str:
    def summary(values: list[float], unit: str) -> str:
        return f"{statistics.median(values):.1f}{unit} ({min(values):.1f}–{max(values):.1f})"

    lines = [f"## 14. Elastic runs\n\n`uv run python -m bench.elastic --reps {reps}` (root; the network test bed), "
             f"took {took / 60:.1f} min, 1-min load {os.getloadavg()[0]:.1f} at the end.\n",
             "| run | fault → first step again | steps lost (redone) |", "|---|---|---|"]
    for name, results in rows.items():
        lines.append(f"| {name} | {summary([r['again_s'] for r in results], ' s')} | "
                     f"{summary([r['lost_steps'] for r in results], '')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
