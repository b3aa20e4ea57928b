"""The known-noise list against live TensorFlow: two MultiWorkerMirroredStrategy tasks under
`tfl launch`. A TensorFlow upgrade that changes its start-up lines fails here (a known line
no longer recognised), and nothing at warning level or above off the list is ever hidden."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.views.noise import known

pytestmark = pytest.mark.slow  # two TensorFlow processes

JOB = '''\
import sys, traceback
import tensorflow as tf

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("job: replicas", strategy.num_replicas_in_sync, flush=True)
print("W0000 00:00:1795345087.000000       1 job.cc:1] the job's own line, shaped like a TensorFlow warning", flush=True)
print("E0000 00:00:1795345087.000000       1 port.cc:153] oneDNN custom operations are on. You may see slightly "
      "different numerical results due to floating-point round-off errors from different computation orders. "
      "To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.", flush=True)
try:
    raise ValueError("the job's own error")
except ValueError:
    traceback.print_exc()
sys.stderr.flush()
'''
# Printed by one of two MultiWorkerMirroredStrategy tasks whatever the machine (absl before its
# first log line, the distributed runtime's server and coordination lines).
ALWAYS = {"absl pre-init warning", "gRPC server", "coordination service"}
# Printed only on some machines: the oneDNN notice where TensorFlow turns oneDNN's custom
# operations on (it depends on the CPU), the CPU-features note (on the CPU's flags), the CUDA
# lines (on the TensorFlow build and the driver). When TensorFlow prints one of these, it must
# be recognised and hidden; whether it prints them is not this test's business.
SOMETIMES = {
    "oneDNN notice": "oneDNN custom operations are on",
    "CPU features": "This TensorFlow binary is optimized to use available CPU instructions",
    "CUDA stub": "Could not find cuda drivers on your machine",
    "cuInit without a driver": "failed call to cuInit",
}
# The only known lines above info level; any other hidden line at W/E/F would be a bug.
LOUD_KINDS = {"absl pre-init warning", "cuInit without a driver"}
LOUD = re.compile(r"[WEF]\d{4} |\d{4}-\d\d-\d\d [\d:.]+: [WEF] |WARNING|ERROR|Traceback|\s+File ")
TF_INFO = re.compile(r"I\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ")


def console_lines(stdout: str, task: str, width: int = len("worker:0")) -> list[str]:
    """A task's lines on the console, without their ``[task]`` prefix (padded to the longest name)."""
    prefix = f"[{task}]".ljust(width + 2) + " "
    return [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)]


def tfl(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_real_tensorflow_start_up_noise(tmp_path: Path, child_env: dict[str, str], tfl_home: Path) -> None:
    job = tmp_path / "noisy.py"
    job.write_text(JOB)
    env = {k: v for k, v in child_env.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    launched = tfl(["launch", str(job), "--local", "2"], env)
    assert launched.returncode == 0, launched.stderr[-3000:] + launched.stdout[-3000:]
    (run,) = (tfl_home / "runs").iterdir()
    seen: set[str] = set()
    for task in ("chief:0", "worker:0"):
        log = (run / "logs" / f"{task.replace(':', '-')}.log").read_text().splitlines()
        shown = console_lines(launched.stdout, task)
        note = shown.pop()
        hidden = _hidden(log, shown)
        assert note == f"tfl: {len(hidden)} line(s) of TensorFlow start-up noise hidden (the task's log keeps them; --verbose shows them)"
        kinds = {noise.kind for line in hidden if (noise := known(line))}
        seen |= kinds
        for kind, text in SOMETIMES.items():  # printed by TensorFlow itself (not the job's E-level copy)
            if kind == "cuInit without a driver" and "CUDA stub" not in kinds:
                continue  # an expected error only where the stub said there is no driver (noise.py's `after`)
            printed = [line for line in log if text in line and not line.startswith("E0000 00:00:1795345087")]
            assert all(line in hidden for line in printed), (kind, printed)
            assert not printed or kind in kinds, f"TensorFlow printed its {kind} line, which launcher/views/noise.py no longer recognises: {printed[0]}"
        # Nothing loud is hidden but the known loud lines; nothing of the job's own is hidden.
        assert [line for line in hidden if LOUD.match(line) and (known(line) is None or known(line).kind not in LOUD_KINDS)] == []  # type: ignore[union-attr]
        assert "job: replicas 2" in shown and "ValueError: the job's own error" in shown and "Traceback (most recent call last):" in shown
        assert sum("the job's own line, shaped like" in line for line in shown) == 1
        assert sum(line.startswith("E0000") and "port.cc:153] oneDNN" in line for line in shown) == 1
        # The start-up is quiet: no TensorFlow info line is left before the job's first line.
        before_job = shown[:shown.index("job: replicas 2")]
        assert [line for line in before_job if TF_INFO.match(line)] == [], before_job
        verbose = tfl(["logs", run.name, "--task", task, "--verbose"], env)
        assert console_lines(verbose.stdout, task, len(task)) == log  # --verbose: every line of the log
        again = tfl(["logs", run.name, "--task", task], env)
        assert console_lines(again.stdout, task, len(task)) == [*shown, note]  # tfl logs hides the same lines
    missing = ALWAYS - seen
    assert not missing, f"TensorFlow no longer prints these known lines as launcher/views/noise.py expects: {missing}"


def _hidden(log: list[str], shown: list[str]) -> list[str]:
    """The log's lines that the console left out; the console's lines must be the log's, in order."""
    hidden, at = [], 0
    for line in log:
        if at < len(shown) and shown[at] == line:
            at += 1
        else:
            hidden.append(line)
    assert at == len(shown), f"the console shows a line the log does not have: {shown[at:at + 1]}"
    return hidden

