"""TensorFlow compatibility: the job kit on the oldest and newest TensorFlow that pyproject promises.

    uv run python -m bench.compat --python /path/to/venv-tf2.16/bin/python [--python …]

Not a phase of `python -m bench` and not a CI test: each interpreter must have been made by
hand (a venv with `tensorflow-cpu==2.16.2 tf-keras==2.16.0 psutil`, no tfl: the kit reaches
it as it reaches any local host's other python, `hosts.localhost.python`). For each python,
two runs of jobs/mnist.py as chief + worker under `tfl launch`:

- training: 2 epochs, exit 0, the done marker written;
- preemption: once the chief has logged epoch 1, SIGTERM to the worker: the group agrees on
  a step and saves there (exit 170), the launcher restarts it (a preemption restart), and the
  run ends 0 having resumed after the agreed step.

Prints one JSON line per python and a verdict; raw results stay in that output.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

from bench.common import ROOT, Workspace, assert_none_left, tfl_command
from bench.procs import run_tasks, wait_for
from bench.runs import free_ports

MNIST = ROOT / "jobs" / "mnist.py"
TRAIN_ARGS = ("--epochs", "2", "--steps-per-epoch", "20", "--batch-size", "32")
PREEMPT_ARGS = ("--epochs", "8", "--steps-per-epoch", "40", "--batch-size", "32")
AGREED = re.compile(r"saved the agreed checkpoint at epoch \d+ step \d+ \(global step (\d+)\)")


def versions(python: str) -> dict[str, str]:
    code = "import tensorflow as tf, tf_keras; print(tf.__version__, tf_keras.__version__)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    tf, keras = out.stdout.split()[-2:]
    return {"tensorflow": tf, "tf_keras": keras}


def cluster(ws: Workspace, label: str, python: str) -> Path:
    path = ws.root / f"{label}.json"
    chief, worker = free_ports(2)
    path.write_text(json.dumps({"cluster": {"chief": [f"localhost:{chief}"], "worker": [f"localhost:{worker}"]},
                                "hosts": {"localhost": {"python": python}}}))
    return path


def launch(ws: Workspace, home: Path, cluster_file: Path, args: tuple[str, ...], data: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([*tfl_command(), "launch", str(MNIST), "--cluster", str(cluster_file), "--",
                             *args, "--data", str(data)], env=ws.env(home), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def chief_log(home: Path) -> str:
    logs = list((home / "runs").glob("*/logs/chief-0.log"))
    return logs[0].read_text(errors="replace") if logs else ""


def training(ws: Workspace, label: str, cluster_file: Path, data: Path) -> dict[str, object]:
    home = ws.home(f"{label}-train")
    started = time.monotonic()
    run = launch(ws, home, cluster_file, TRAIN_ARGS, data)
    _, err = run.communicate(timeout=900)
    assert_none_left(home)
    done = list((home / "runs").glob("*/model/training_done.json"))
    return {"exit": run.returncode, "done_marker": bool(done), "took_s": round(time.monotonic() - started, 1),
            "ok": run.returncode == 0 and bool(done), "tail": err.strip().splitlines()[-1:]}


def preemption(ws: Workspace, label: str, cluster_file: Path, data: Path) -> dict[str, object]:
    home = ws.home(f"{label}-preempt")
    run = launch(ws, home, cluster_file, PREEMPT_ARGS, data)
    try:
        wait_for(lambda: "epoch 1/" in chief_log(home), 600, "the chief's first epoch")
        worker = wait_for(partial(lambda h: run_tasks(h).get("worker:0"), home), 60, "the worker")
        worker.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=900)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert_none_left(home)
    log = chief_log(home)
    agreed = [int(m[1]) for m in AGREED.finditer(log)]
    restarted = "after a preemption" in err or "restart 1:" in err
    return {"exit": run.returncode, "agreed_step": agreed[0] if agreed else None, "restarted": restarted,
            "ok": run.returncode == 0 and bool(agreed) and restarted, "tail": err.strip().splitlines()[-3:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compat", description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", required=True, help="an interpreter with tensorflow and tf_keras")
    parser.add_argument("--keep", action="store_true", help="keep the run stores")
    args = parser.parse_args(argv)
    ws = Workspace(keep=args.keep)
    ok = True
    try:
        from bench.__main__ import make_data

        data = make_data(ws)
        for number, python in enumerate(args.python):
            label = f"py{number}"
            result: dict[str, object] = {"python": python, **versions(python)}
            file = cluster(ws, label, python)
            result["training"] = training(ws, label, file, data)
            result["preemption"] = preemption(ws, label, file, data)
            ok = ok and all(result[k]["ok"] for k in ("training", "preemption"))  # type: ignore[index]
            print(json.dumps(result), flush=True)
    finally:
        ws.close()
    print(f"compat: {'met' if ok else 'MISSED'}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
