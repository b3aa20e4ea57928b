"""jobkit.finish on a loaded machine (issue 26): a task that stalls for longer than TensorFlow's
heartbeat window before the end still leaves the fast way, and the chief last.

A stall is a SIGSTOP of 13 s, past the coordination service's 10 s heartbeat timeout, so the
service marks the stopped task as failed and puts every agent into ERROR: the state in which
the service's barrier refused the chief at once (FailedPreconditionError) in the loaded CI run.
The stall is the test's own act, not a measured time, and what is asserted is each task's own
account of how it left.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from launcher.describe.ports import free_ports
from tests.jobkit_helpers import REPO, assert_none_alive, kill_all, start_job, tf_config, wait_all

pytestmark = pytest.mark.slow

JOB = REPO / "tests" / "jobs" / "finish_hold.py"
STALL_S = 13.0  # longer than TensorFlow's default heartbeat timeout (10 s)
LEFT = re.compile(r" leaves(?: last)? at ([0-9.]+),")


def test_a_task_stalled_past_the_heartbeat_window_still_leaves_the_fast_way_the_chief_last(tmp_path: Path) -> None:
    hold = tmp_path / "hold"
    hold.mkdir()
    ports = free_ports(2)
    cluster = {"chief": [f"localhost:{ports[0]}"], "worker": [f"localhost:{ports[1]}"]}
    jobs = [start_job(f"{kind}:0", tmp_path / "run", [str(hold)], tf_config_json=tf_config(cluster, kind, 0), job=JOB)
            for kind in ("chief", "worker")]
    chief, worker = jobs
    try:
        deadline = time.monotonic() + 300  # a hang guard: two TensorFlow starts on a loaded machine
        while not all((hold / f"ready-{kind}-0").exists() for kind in ("chief", "worker")):
            assert all(job.popen.poll() is None for job in jobs), "\n".join(job.output()[-2000:] for job in jobs)
            assert time.monotonic() < deadline, "the group never formed"
            time.sleep(0.1)
        os.kill(worker.popen.pid, signal.SIGSTOP)
        time.sleep(STALL_S)
        os.kill(worker.popen.pid, signal.SIGCONT)
        for kind in ("worker", "chief"):
            (hold / f"go-{kind}-0").touch()
        codes = wait_all(jobs, timeout_s=300)
    finally:
        kill_all(jobs)
    assert_none_alive(jobs)
    out = {job.name: job.output() for job in jobs}
    report = "\n".join(f"--- {name} (exit {codes[name]}):\n{text[-4000:]}" for name, text in out.items())
    assert codes == {"chief:0": 0, "worker:0": 0}, report
    # The premise: the stall made the service give the worker up and tell the chief.
    assert "stopped sending heartbeats" in out["chief:0"], report
    left = {name: LEFT.search(text) for name, text in out.items()}
    assert left["chief:0"] and left["worker:0"], report
    assert float(left["chief:0"][1]) > float(left["worker:0"][1]), report
    for text in out.values():
        assert "not every training task reached the end" not in text and "the slow way" not in text, report
    assert "did not say it was leaving" not in out["chief:0"], report
