"""An elastic run with real TensorFlow on the network test bed: chief on the first host,
workers on the two others, ``--min-tasks 2 --global-batch 48``, jobs/mnist.py in float64.
The third host is cut mid-training: the run goes on with two tasks from the last backup (not
from epoch 1), ends 0, and every epoch that ran wholly after the resize reports the loss of an
uninterrupted run with the same global batch (one process) within 1e-6.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from launcher.spec import free_port
from tests.conftest import ROOT
from tests.netbed import NetBed
from tests.procs import tfl_processes
from tests.test_ssh import only_run

pytestmark = [pytest.mark.slow, pytest.mark.ssh]

EPOCHS, STEPS, BACKUP_EVERY, GLOBAL_BATCH = 3, 12, 4, 48
TOLERANCE = 1e-6
JOB = ROOT / "jobs" / "mnist.py"
QUIET = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}


def job_args(data: Path) -> list[str]:
    return ["--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--dtype", "float64", "--seed", "7",
            "--backup-every-steps", str(BACKUP_EVERY), "--data", str(data)]


def digits(tmp_path: Path) -> Path:
    """The same data for every run, offline: scikit-learn's digits as MNIST (the kit's fallback)."""
    from launcher.jobkit.datasets import load_digits_as_mnist

    (x_train, y_train), (x_test, y_test) = load_digits_as_mnist()
    path = tmp_path / "digits.npz"
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def epoch_losses(log: str) -> dict[int, float]:
    """{epoch: loss} from the chief's `epoch i/n loss=...` lines (a later attempt's win)."""
    return {int(m[1]): float(m[2]) for m in re.finditer(r"^epoch (\d+)/\d+ loss=(\S+)", log, re.MULTILINE)}


def progress(home: Path) -> dict[str, object]:
    try:
        return dict(json.loads(next((home / "runs").glob("*/progress/chief-0.json")).read_text()))
    except (StopIteration, OSError, ValueError):
        return {}


def test_a_cut_host_the_run_goes_on_with_two_and_trains_like_an_uninterrupted_run(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    data = digits(tmp_path)
    h1, h2, h3 = netbed.addresses
    tasks = {"chief": [f"{h1}:{free_port()}"], "worker": [f"{h2}:{free_port()}", f"{h3}:{free_port()}"]}
    (tmp_path / "shared").mkdir()
    cluster = netbed.cluster_file(tmp_path / "cluster.json", tasks, sys.executable, ssh={"fence_after": 6},
                                  storage={"path": str(tmp_path / "shared")}, env=QUIET,
                                  elastic={"min_tasks": 2, "global_batch": GLOBAL_BATCH})
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(JOB), "--cluster", str(cluster),
                                 "--grace-period", "10", "--", *job_args(data)],
                                env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while int(progress(tfl_home).get("global_step", 0) or 0) < 3:  # type: ignore[call-overload]
            assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
            time.sleep(0.05)
        netbed.cut(h3)
        cut_in_epoch = int(progress(tfl_home)["epoch"])  # type: ignore[call-overload]
        out, err = launcher.communicate(timeout=400)
    finally:
        launcher.kill()
        netbed.join(h3)
    assert launcher.returncode == 0, err[-4000:]
    run = only_run(tfl_home)
    assert tfl_processes(run_id=run) == []
    record = json.loads((tfl_home / "runs" / run / "state.json").read_text())
    assert [(r["from_tasks"], r["to_tasks"], r["hosts"]) for r in record["resizes"]] == [(3, 2, [h3])]
    chief_log = (tfl_home / "runs" / run / "logs" / "chief-0.log").read_text()
    resumed = re.findall(r"resuming at global step (\d+)", chief_log)
    assert resumed and int(resumed[-1]) > 0, chief_log[-3000:]  # from the last backup, not epoch 1

    control = subprocess.run([sys.executable, "-m", "launcher", "launch", str(JOB), "--local", "1", "--min-tasks", "1",
                              "--global-batch", str(GLOBAL_BATCH), "--", *job_args(data)],
                             env={**child_env, **QUIET}, capture_output=True, text=True, timeout=400)
    assert control.returncode == 0, control.stderr[-3000:]
    runs = sorted((tfl_home / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    wanted = epoch_losses((runs[-1] / "logs" / "chief-0.log").read_text())
    assert sorted(wanted) == list(range(1, EPOCHS + 1))
    got = epoch_losses(chief_log)
    later = range(cut_in_epoch + 1, EPOCHS + 1)
    assert list(later), "the cut came too late to compare an epoch after it"
    for epoch in later:
        assert got[epoch] == pytest.approx(wanted[epoch], abs=TOLERANCE), (epoch, got, wanted)
