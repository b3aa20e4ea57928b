"""Preemption end to end: real TensorFlow (jobs/mnist.py) under `tfl launch`.

float64, seed 7, the offline digits; one uninterrupted run is the control (module-scoped).
The interrupted run must report, for each epoch after the interruption, the control's
loss within 1e-6, and end 0 with --max-restarts 0: a preemption is not a failure.

`tfl stop` then `tfl resume` of a real-TensorFlow run, compared with an uninterrupted one the
same way, is tests/test_input_records_tour_tf.py's (jobs/fashion_records.py: the stop's notices,
the agreed checkpoint, the record, nothing left, the resume at the saved step, the losses). The
launcher's part does not depend on the job, and mnist's resume after a notice is proven here
and in tests/test_preemption_tf.py: a second stop-and-resume, of mnist, would prove nothing more
for four TensorFlow start-ups.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from launcher.records.store import RunStore
from tests.conftest import ROOT
from tests.jobkit_helpers import HELD_JOB, Hold
from tests.procs import assert_none_left

pytestmark = pytest.mark.slow
MNIST = str(ROOT / "jobs" / "mnist.py")
EPOCHS, STEPS = 3, 30
ARGS = ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--batch-size", "16", "--dtype", "float64",
        "--seed", "7", "--backup-every-steps", "5"]
EPOCH_LINE = re.compile(r"^epoch (\d+)/\d+ loss=([0-9.]+)", re.M)
TOLERANCE = 1e-6
TIMEOUT = 400


def env_for(home: Path) -> dict[str, str]:
    """A private run store, HOME and TMPDIR (the offline digits, no keras cache), no proxy, one thread per op."""
    for private in ("home", "tmp"):
        (home.parent / private).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "TFL_")) and "proxy" not in k.lower()}
    env.update({"TFL_HOME": str(home), "HOME": str(home.parent / "home"), "TMPDIR": str(home.parent / "tmp"),
                "https_proxy": "http://127.0.0.1:9", "no_proxy": "localhost,127.0.0.1",
                "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                "TFL_PROGRESS_LOG": str(home.parent / "steps.jsonl")})
    return env


def tfl(args: list[str], env: dict[str, str], timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True, timeout=timeout)


def only_run(home: Path) -> str:
    (run,) = [p.name for p in (home / "runs").iterdir()]
    return run


def losses(home: Path) -> dict[int, float]:
    """{epoch: loss} of the chief's epoch lines, the last attempt's where several reported one."""
    text = (home / "runs" / only_run(home) / "logs" / "chief-0.log").read_text()
    return {int(m[1]): float(m[2]) for m in EPOCH_LINE.finditer(text)}


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"never: {what}")


def pid_of(home: Path, task: str) -> int:
    pid = RunStore(home).load(only_run(home)).task(task).pid
    assert pid
    return pid


def assert_like_the_control(home: Path, control: dict[int, float], after_epoch: int) -> None:
    got = losses(home)
    later = range(after_epoch + 1, EPOCHS + 1)
    assert list(later), "interrupted too late: no epoch after it to compare"
    for epoch in later:
        assert got[epoch] == pytest.approx(control[epoch], abs=TOLERANCE), (epoch, got, control)


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, float]]:
    home = tmp_path_factory.mktemp("control") / "tfl-home"
    result = tfl(["launch", MNIST, "--local", "2", "--", *ARGS], env_for(home))
    assert result.returncode == 0, result.stderr[-3000:]
    found = losses(home)
    assert sorted(found) == list(range(1, EPOCHS + 1))
    assert not list((home.parent / "tmp").glob("__autograph_generated_file*"))  # the kit's os._exit removed them
    yield found
    assert_none_left(str(home))


def launch(home: Path, hold: Hold, *args: str) -> subprocess.Popen[str]:
    """jobs/mnist.py on a chief and a worker, held at `hold.step` in attempt 0 (tests/jobs/held.py)."""
    return subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(HELD_JOB), "--local", "2", *args, "--",
                             MNIST, *ARGS], env={**env_for(home), **hold.env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def notice_taken(home: Path, task: str) -> bool:
    log = home / "runs" / only_run(home) / "logs" / f"{task.replace(':', '-')}.log"
    return "jobkit: preemption notice (SIGTERM);" in log.read_text(errors="replace")


def test_sigterm_to_the_evaluator_then_the_worker_ends_0_like_the_control(control: dict[int, float],
                                                                         tfl_home: Path) -> None:
    # The moment: the chief and the worker hold at step 10 of 30 (tests/jobs/held.py) while the
    # evaluator, then the worker, get their notices; the worker goes on only once TensorFlow's
    # handler has its notice, so the agreed step is within a call or two of 10: epoch 1 on any machine.
    hold = Hold(tfl_home.parent / "hold", 10)
    launcher = launch(tfl_home, hold, "--evaluator", "--max-restarts", "0", "--evaluator-timeout", "60")
    try:
        target = hold.wait(["chief:0", "worker:0"], alive=lambda: launcher.poll() is None,
                     why=lambda: launcher.communicate()[1][-4000:], timeout_s=TIMEOUT)["chief:0"]
        os.kill(pid_of(tfl_home, "evaluator:0"), signal.SIGTERM)
        wait_until(lambda: RunStore(tfl_home).load(only_run(tfl_home)).task("evaluator:0").state.is_terminal,
                   "the evaluator leaves")
        record = RunStore(tfl_home).load(only_run(tfl_home))
        assert launcher.poll() is None and record.attempt == 0  # training goes on without the evaluator
        assert {record.task(t).state.value for t in ("chief:0", "worker:0")} == {"running"}
        os.kill(pid_of(tfl_home, "worker:0"), signal.SIGTERM)
        wait_until(lambda: notice_taken(tfl_home, "worker:0"), "the worker takes the notice")
        hold.release()
        _, err = launcher.communicate(timeout=TIMEOUT)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.communicate()
    assert launcher.returncode == 0, err[-4000:]
    record = RunStore(tfl_home).load(only_run(tfl_home))
    assert [r.kind for r in record.restarts] == ["preemption"], err[-3000:]
    assert "preempted: saved the agreed checkpoint at step" in record.restarts[0].reason
    step = int(record.restarts[0].reason.rsplit(" ", 1)[1])
    assert step >= target and step < STEPS  # nothing before the notice lost; still epoch 1
    assert_like_the_control(tfl_home, control, after_epoch=1)
    assert not list((tfl_home.parent / "tmp").glob("__autograph_generated_file*"))
