"""16. Private network (issue 30): a local run in its own network namespace against the same
run on the host's network. `uv run python -m bench.network [--reps N] [--tiny-reps N]` prints
the section as Markdown (paste it into docs/benchmarks.md) and its raw samples as JSON.

- Training: `tfl launch jobs/mnist.py --local 2 --network private` and `--network host`, back
  to back in each repetition (alternating which goes first), on the offline data (scikit-learn's
  digits, as §2); the chief's examples/s over its last epoch (the job kit's progress record),
  the ratio private / host taken within each repetition. Target: ≥ 0.98×.
- Launch overhead: the tiny task (`bench/jobs/tiny.py`) under `--local 2`, private against
  host: tfl's own time from its run record (spawn → first task started, last task ended →
  exit), and the namespace alone (``make_private_network`` + ``close``, in this process).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

from bench.common import MNIST, PYTHON, ROOT, TINY, BenchError, Stats, Workspace, assert_none_left, ratio_stats, tfl_command
from bench.procs import run_launcher
from bench.runs import GroupRun

TARGET = 0.98
EPOCHS, STEPS, BATCH = 2, 40, 64  # per replica (as §2: global batch 128)


def _run(ws: Workspace, label: str, job: Path, mode: str, args: list[str]) -> GroupRun:
    home = ws.home(label)
    spawned = time.time()
    usage = run_launcher([*tfl_command(), "launch", str(job), "--local", "2", "--network", mode, "--", *args], ws.env(home))
    (run_dir,) = (home / "runs").iterdir()
    assert_none_left(home)
    if usage.exit_code != 0:
        raise BenchError(f"{label}: tfl launch exited {usage.exit_code} (see {run_dir}/logs)")
    network = json.loads((run_dir / "state.json").read_text())["plan"]["network"]
    if network != mode:
        raise BenchError(f"{label}: asked for --network {mode}, the run got {network}")
    return GroupRun(usage.wall_s, run_dir, spawned, usage)


def _namespace_ms(reps: int) -> tuple[list[float], list[float]]:
    from launcher.engines.local.netns import make_private_network

    made, closed = [], []
    for _ in range(reps):
        start = time.perf_counter()
        network = make_private_network()
        made.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        network.close()
        closed.append((time.perf_counter() - start) * 1000)
    return made, closed


def measure(reps: int, tiny_reps: int) -> dict[str, list[float]]:
    ws = Workspace()
    raw: dict[str, list[float]] = {k: [] for k in ("private_ex_s", "host_ex_s", "private_tiny_own_s", "host_tiny_own_s",
                                                   "private_train_wall_s", "host_train_wall_s")}
    data = ws.root / "digits.npz"
    code = ("import sys, numpy as np; from launcher.jobkit.datasets import load_digits_as_mnist as load; "
            "(a, b), (c, d) = load(); np.savez(sys.argv[1], x_train=a, y_train=b, x_test=c, y_test=d)")
    subprocess.run([PYTHON, "-c", code, str(data)], check=True, cwd=ROOT, timeout=300)
    args = ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch-size", str(BATCH), "--data", str(data)]
    try:
        for rep in range(tiny_reps):
            for mode in (("private", "host") if rep % 2 == 0 else ("host", "private")):
                raw[f"{mode}_tiny_own_s"].append(_run(ws, f"tiny-{mode}-{rep}", TINY, mode, ["--sleep", "0.5"]).launcher_only_s())
        for rep in range(reps):
            for mode in (("private", "host") if rep % 2 == 0 else ("host", "private")):
                run = _run(ws, f"train-{mode}-{rep}", MNIST, mode, args)
                raw[f"{mode}_ex_s"].append(float(run.progress()["examples_per_sec"]))  # type: ignore[arg-type]
                raw[f"{mode}_train_wall_s"].append(run.wall_s)
        raw["namespace_make_ms"], raw["namespace_close_ms"] = _namespace_ms(max(tiny_reps, 5))
    finally:
        ws.close()
    return raw


def render(raw: dict[str, list[float]], reps: int, tiny_reps: int) -> str:
    ratio = ratio_stats(raw["private_ex_s"], raw["host_ex_s"])
    own = [p - h for p, h in zip(raw["private_tiny_own_s"], raw["host_tiny_own_s"], strict=True)]
    verdict = "**met**" if ratio.median >= TARGET else "**missed**"
    return "\n".join([
        "## 16. Private network",
        "",
        f"Target: a local `--local 2` training run in its private network namespace ≥ {TARGET}× the same run with "
        f"`--network host` (examples/s); launch overhead in ms. Verdict: {verdict}.",
        "",
        "| measure | private | host | private / host or private − host (same repetition) |",
        "|---|---|---|---|",
        f"| MNIST ×2, chief's examples/s (last epoch) | {Stats.of(raw['private_ex_s']).fmt(digits=0, unit=' ex/s')} | "
        f"{Stats.of(raw['host_ex_s']).fmt(digits=0, unit=' ex/s')} | {ratio.fmt(digits=3, unit='×')} |",
        f"| MNIST ×2, wall time | {Stats.of(raw['private_train_wall_s']).fmt(unit=' s')} | "
        f"{Stats.of(raw['host_train_wall_s']).fmt(unit=' s')} | "
        f"{ratio_stats(raw['private_train_wall_s'], raw['host_train_wall_s']).fmt(digits=3, unit='×')} |",
        f"| tiny ×2, tfl's own time (spawn → first task, last task → exit) | "
        f"{Stats.of(raw['private_tiny_own_s']).fmt(1000, 0, ' ms')} | {Stats.of(raw['host_tiny_own_s']).fmt(1000, 0, ' ms')} | "
        f"{Stats.of(own).fmt(1000, 0, ' ms')} |",
        f"| the namespace alone: made (holder + loopback + slirp4netns ready) / closed | "
        f"{Stats.of(raw['namespace_make_ms']).fmt(digits=0, unit=' ms')} / "
        f"{Stats.of(raw['namespace_close_ms']).fmt(digits=0, unit=' ms')} | | |",
        "",
        f"- {reps} training repetitions and {tiny_reps} tiny ones, each running both modes back to back, alternating "
        f"which goes first. MNIST: {EPOCHS} epochs × {STEPS} steps, per-replica batch {BATCH}, on the offline data "
        "(scikit-learn's digits upscaled, `--data`). The tasks talk over the namespace's loopback in `private` and over "
        "the host's loopback in `host`: the same kernel path, so no difference is expected beyond noise.",
        f"- Medians (min–max); raw samples: `{json.dumps({k: [round(v, 4) for v in vs] for k, vs in raw.items()})}`",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.network", description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tiny-reps", type=int, default=7)
    args = parser.parse_args()
    raw = measure(args.reps, args.tiny_reps)
    print(render(raw, args.reps, args.tiny_reps))
    print(f"\n(ratio median {statistics.median(r / h for r, h in zip(raw['private_ex_s'], raw['host_ex_s'], strict=True)):.3f})")


if __name__ == "__main__":
    main()
