"""An evaluator still at work when training ends is stopped at `--evaluator-timeout`; the run succeeds.
Its summary and `tfl status RUN` said only "every training task succeeded", so a user took the
evaluator's last line in the logs for the final checkpoint's evaluation. Now both say it was cut off,
what it had evaluated, and that a longer --evaluator-timeout lets it finish."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

JOB = """
    import json, os, time
    if os.environ["TFL_TASK"] == "evaluator:0":
        with open(os.environ["TFL_PROGRESS_FILE"], "w") as f:
            json.dump({"phase": "eval", "epoch": 1, "epochs": 3, "step": 0, "steps_per_epoch": None, "loss": 0.5}, f)
        print("evaluated epoch 1", flush=True)
        time.sleep(120)  # the later checkpoints take long
    print("trained", flush=True)
"""


def test_an_evaluator_stopped_at_the_timeout_is_said(tmp_path: Path, tfl_cmd: list[str], child_env: dict[str, str]) -> None:
    job = tmp_path / "cut.py"
    job.write_text(textwrap.dedent(JOB))
    done = subprocess.run([*tfl_cmd, "launch", str(job), "--local", "1", "--evaluator", "--evaluator-timeout", "1",
                           "--grace-period", "1"], env=child_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = ("  evaluator: evaluator:0 was stopped{} after training ended (--evaluator-timeout), before it was done: its last "
            "evaluation epoch 1/3 loss 0.5000; a longer --evaluator-timeout lets it evaluate the final checkpoint")
    assert said.format(" 1 s") in done.stderr.splitlines(), done.stderr
    run_id = done.stderr.split("tfl: run ", 1)[1].split(":", 1)[0]
    status = subprocess.run([*tfl_cmd, "status", run_id], env=child_env, capture_output=True, text=True, timeout=60)
    assert said.format("") in status.stdout.splitlines(), status.stdout
    task = json.loads(subprocess.run([*tfl_cmd, "status", run_id, "--json"], env=child_env, capture_output=True, text=True,
                                     timeout=60).stdout)["tasks"][1]
    assert (task["task"], task["state"]) == ("evaluator:0", "stopped")


def test_an_evaluator_that_finished_is_not_said_cut(tmp_path: Path, tfl_cmd: list[str], child_env: dict[str, str]) -> None:
    job = tmp_path / "whole.py"
    job.write_text(textwrap.dedent(JOB).replace("time.sleep(120)", "pass"))
    done = subprocess.run([*tfl_cmd, "launch", str(job), "--local", "1", "--evaluator"], env=child_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "evaluator:0" in done.stdout, done.stderr
    assert "--evaluator-timeout" not in done.stderr
