"""A stand-in for jobs/mnist.py without TensorFlow, for the suite's quick mode only.

It takes mnist.py's options and speaks the same protocol to tfl (TF_CONFIG in,
``epoch e/E loss=…`` lines, the progress file, the progress log, backups every N steps
that a restarted group resumes from), so quick mode runs every measure's code in
seconds. Its numbers say nothing about TensorFlow; the full suite never uses it.
"""

import argparse
import json
import os
import time
from pathlib import Path

STEP_SECONDS = 0.02

parser = argparse.ArgumentParser()
for flag, kind, default in (("--epochs", int, 2), ("--batch-size", int, 64), ("--steps-per-epoch", int, 20),
                            ("--backup-every-steps", int, 0), ("--seed", int, 42)):
    parser.add_argument(flag, type=kind, default=default)
parser.add_argument("--data", default=None)
args = parser.parse_args()

config = json.loads(os.environ["TF_CONFIG"])
replicas = sum(len(config["cluster"].get(kind, [])) for kind in ("chief", "worker"))
task = f"{config['task']['type']}:{config['task']['index']}"
is_chief = config["task"]["type"] == "chief"
model = Path(os.environ.get("TFL_RUN_DIR", ".")) / "model"
backup = model / "backup" / "step.json"
done = model / "training_done.json"

if config["task"]["type"] == "evaluator":  # follows training until the chief's done marker, like the kit's
    while not done.exists():
        time.sleep(0.05)
    raise SystemExit(0)
progress_file = os.environ.get("TFL_PROGRESS_FILE")
progress_log = os.environ.get("TFL_PROGRESS_LOG")
global_batch = args.batch_size * replicas


def report(step: int, phase: str, rate: float) -> None:
    record = {"task": task, "attempt": int(os.environ.get("TFL_ATTEMPT", "0")), "phase": phase,
              "global_step": step, "examples_per_sec": rate, "time": time.time()}
    if progress_log:
        with open(progress_log, "a") as f:
            f.write(json.dumps(record) + "\n")
    if progress_file:
        with open(progress_file + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(progress_file + ".tmp", progress_file)


def _beside_the_chief() -> bool:
    chief = config["cluster"].get("chief") or [""]
    mine = config["cluster"][config["task"]["type"]][config["task"]["index"]]
    return chief[0].rsplit(":", 1)[0] == mine.rsplit(":", 1)[0]


step = json.loads(backup.read_text())["step"] if backup.exists() else 0
total = args.epochs * args.steps_per_epoch
rate = 0.0
while step < total:
    epoch_start, first = time.monotonic(), step
    epoch_end = (step // args.steps_per_epoch + 1) * args.steps_per_epoch
    while step < epoch_end:
        time.sleep(STEP_SECONDS)
        step += 1
        rate = (step - first) * global_batch / (time.monotonic() - epoch_start)
        report(step, "train", rate)
        if is_chief and args.backup_every_steps and step % args.backup_every_steps == 0:
            backup.parent.mkdir(parents=True, exist_ok=True)
            backup.write_text(json.dumps({"step": step}))
    print(f"epoch {step // args.steps_per_epoch}/{args.epochs} loss=0.000000 accuracy=1.000000", flush=True)
if is_chief and "TFL_RUN_DIR" in os.environ:  # under tfl only: a plain run writes nothing beside it
    done.parent.mkdir(parents=True, exist_ok=True)
    done.write_text(json.dumps({"global_step": step, "run_id": os.environ.get("TFL_RUN_ID")}))
elif "TFL_RUN_DIR" in os.environ and _beside_the_chief():
    # A worker ends with its chief, as MWMS's do: never before the chief's last step (a bench that
    # kills the worker at the chief's step k finds it there). Beside it only: it reads the chief's marker.
    waited = time.monotonic()
    while not done.exists() and time.monotonic() - waited < 600:
        time.sleep(0.02)
report(step, "done", rate)
