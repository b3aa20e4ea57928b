"""`tfl resume RUN --address HOST:PORT`: a Ray run resumed on its cluster started again at another address.

A resume reaches the cluster at the address the run recorded (the description is not read again). A
cluster started again on another port or host (`ray start --head --port …`, a new head machine) left
the run with no way on: its resume said to "launch the job again", a new run that starts from nothing.
``--address`` gives the run its cluster's new address, and the record keeps it for `tfl status`,
`tfl stop` and a later resume.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from launcher.describe.kinds import load_description
from launcher.describe.ports import free_port
from launcher.engines.ray.plan import RayUnit
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunStore
from launcher.runs.launch import make_plan
from launcher.supervise.recording import initial_record
from tests.ray_cluster import RayCluster
from tests.test_ray import SAVER, cluster, description, record  # noqa: F401  (cluster: the fixture)
from tests.test_ssh import tfl, wait_for


def _stopped_run(tmp_path: Path, home: Path, address: str) -> str:
    """A recorded Ray run that ran on the cluster at ``address`` and was stopped."""
    job = tmp_path / "job" / "saver.py"
    job.parent.mkdir(exist_ok=True)
    job.write_text(SAVER)
    store = RunStore(home)
    plan = make_plan(str(job), ("1",), load_description(description(tmp_path, address)), store)
    assert isinstance(plan.unit, RayUnit)
    plan = dataclasses.replace(plan, unit=dataclasses.replace(plan.unit, nodes={"chief:0": "a" * 56}))  # as after its start
    rec = initial_record(plan, created=time.time(), max_restarts=0, backend="ray")
    rec.state, rec.ended, rec.exit_code = RunState.STOPPED, time.time(), 143
    for task in rec.tasks:
        task.state = TaskState.STOPPED
    store.create(rec)
    return plan.run_id


def test_a_resume_where_the_recorded_cluster_is_gone_names_the_address_option(tmp_path: Path, tfl_home: Path,
                                                                                child_env: dict[str, str]) -> None:
    pytest.importorskip("ray")
    gone, moved = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"  # nothing listens at either
    run = _stopped_run(tmp_path, tfl_home, gone)

    plain = tfl(["resume", run], child_env, timeout=120)
    assert plain.returncode == 2 and plain.stderr.strip() == (
        f"tfl: error: ray.address {gone}: nothing answers at {gone} (Connection refused); start the run's cluster there "
        f"again (`ray start --head`), or give its new address: `tfl resume {run} --address HOST:PORT`"), plain.stderr[-3000:]
    for detach in ([], ["--detach"]):  # the detached launcher is given the address too
        there = tfl(["resume", run, *detach, "--address", moved], child_env, timeout=120)
        assert there.returncode == 2 and f"tfl: error: ray.address {moved}: nothing answers at {moved}" in there.stderr, (
            detach, there.stderr[-3000:])
    bad = tfl(["resume", run, "--address", "head-node"], child_env, timeout=60)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "tfl: error: --address: 'head-node' is not a Ray address; write \"auto\" (the cluster this machine is part of), "
        "\"ray://HOST:10001\" (Ray Client) or \"HOST:6379\" (the head's GCS)"), bad.stderr
    # A failed resume changes nothing: the record still names the cluster it ran on, at the same attempt.
    kept = record(tfl_home, run)
    assert kept["plan"]["unit"]["address"] == gone and kept["attempt"] == 0 and kept["state"] == "stopped"


def test_address_is_refused_for_a_run_not_on_ray(tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    job = tmp_path / "quick.py"
    job.write_text("import sys; sys.exit(3)\n")
    launched = tfl(["launch", str(job), "--local", "1"], child_env, timeout=120)
    assert launched.returncode == 1, launched.stderr[-3000:]
    (run,) = [p.name for p in (tfl_home / "runs").iterdir()]
    refused = tfl(["resume", run, "--address", "127.0.0.1:6379"], child_env, timeout=60)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"tfl: error: run {run} ran on local, not on Ray: --address gives a Ray run its cluster's new address; "
        "resume it without --address"), refused.stderr
    assert record(tfl_home, run)["attempt"] == 0


@pytest.mark.ray
def test_a_run_resumes_on_its_cluster_at_a_new_address(cluster: RayCluster, tmp_path: Path,  # noqa: F811
                                                       tfl_home: Path, child_env: dict[str, str]) -> None:
    """The run launched, stopped (its step saved), its cluster then "moved": the recorded address answers no
    more. `--address` resumes it there from the saved step, and status and stop reach it at the new address."""
    job = tmp_path / "job" / "saver.py"
    job.parent.mkdir()
    job.write_text(SAVER)
    launched = tfl(["launch", str(job), "--cluster", str(description(tmp_path, cluster.address)), "--detach", "--", "100000"],
                   child_env, timeout=600)
    assert launched.returncode == 0, launched.stderr[-3000:]
    run = launched.stdout.strip()
    log = tfl_home / "runs" / run / "logs" / "chief-0.log"
    try:
        wait_for(lambda: log.exists() and "start chief:0 attempt 0 step 0" in log.read_text(), timeout=240)
    finally:
        assert tfl(["stop", run], child_env, timeout=180).returncode == 0
    wait_for(lambda: record(tfl_home, run)["state"] == "stopped", timeout=120)
    step = int((tmp_path / "shared" / run / "model" / "saved-chief-0").read_text())
    state = tfl_home / "runs" / run / "state.json"
    old = json.loads(state.read_text())
    gone = f"127.0.0.1:{free_port()}"
    old["plan"]["unit"]["address"] = gone  # as recorded by a cluster that has since started again elsewhere
    state.write_text(json.dumps(old))

    resumed = tfl(["resume", run, "--detach", "--address", cluster.address], child_env, timeout=600)
    assert resumed.returncode == 0 and resumed.stdout.strip() == run, resumed.stderr[-3000:]
    assert record(tfl_home, run)["plan"]["unit"]["address"] == cluster.address
    try:
        wait_for(lambda: f"start chief:0 attempt 1 step {step}\n" in log.read_text(), timeout=240)
        status = tfl(["status", run], child_env, timeout=120)
        assert status.returncode == 0 and "running" in status.stdout and "unreachable" not in status.stdout, status.stdout
    finally:
        stopped = tfl(["stop", run], child_env, timeout=180)
    assert stopped.returncode == 0 and "not reached" not in stopped.stdout, stopped.stdout + stopped.stderr
    wait_for(lambda: record(tfl_home, run)["state"] == "stopped", timeout=120)
