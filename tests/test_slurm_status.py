"""What `tfl status` says of a recorded Slurm run while its job waits in the queue, against a fake
squeue on PATH (the real cluster's PENDING is tests/test_slurm_cluster.py's)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord, RunStore, TaskRecord

runner = CliRunner()
PLAN = Path(__file__).parent / "data" / "records-9bbb15a" / "slurm_plan.json"  # 2 nodes and an evaluator
RUN = "slurm-20261127-040000-5a5a"


def fake_squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str) -> Path:
    """A PATH whose squeue says ``line`` of any job, and notes each call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/squeue.calls"\necho "{line}"\n')
    squeue.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "squeue.calls"


def slurm_run(store: RunStore) -> RunRecord:
    """A Slurm run as its live launcher (this process) records it right after sbatch: job 7."""
    me = psutil.Process()
    plan = json.loads(PLAN.read_text())
    run_dir = store.run_dir(RUN)
    record = RunRecord(run_id=RUN, job="mnist.py", job_args=[], run_dir=str(run_dir), created=me.create_time(),
                       state=RunState.RUNNING, launcher_pid=me.pid, launcher_create_time=me.create_time(), backend="slurm",
                       plan={**plan, "run_id": RUN, "run_dir": str(run_dir)}, backend_data={"job_id": "7", "job_name": RUN},
                       tasks=[TaskRecord(task=t["task"], host="slurm", backend="slurm", state=TaskState.RUNNING,
                                         log_path=str(run_dir / "logs" / "x.log"), progress_path=str(run_dir / "p.json"))
                              for t in plan["tasks"]])
    store.create(record)
    return record


def test_a_queued_job_reads_as_pending_not_running(tfl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_squeue(tmp_path, monkeypatch, "7|PENDING|Resources|")
    slurm_run(RunStore(tfl_home))
    one = runner.invoke(app, ["status", RUN])
    assert one.exit_code == 0, one.output
    head = one.stdout.splitlines()
    assert head[0].startswith(f"run {RUN}  pending  (0/3 tasks alive"), one.stdout
    assert "slurm: job 7, state PENDING, reason Resources" in one.stdout
    assert [line.split()[2] for line in head if line.startswith(("chief:0", "worker:0", "evaluator:0"))] == ["pending"] * 3
    listed = runner.invoke(app, ["status"])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines()[1].split()[:4] == [RUN, "mnist.py", "pending", "0/3"]
    as_json = runner.invoke(app, ["status", RUN, "--json"])
    assert json.loads(as_json.stdout)["state"] == "pending"


def test_a_job_that_left_the_queue_reads_as_running(tfl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_squeue(tmp_path, monkeypatch, "7|RUNNING|None|n[1-2]")
    slurm_run(RunStore(tfl_home))
    one = runner.invoke(app, ["status", RUN])
    assert one.exit_code == 0, one.output
    assert one.stdout.startswith(f"run {RUN}  running  ("), one.stdout


def test_a_bad_slurm_conf_is_one_line_without_asking_slurm(tfl_home: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Slurm command retries a SLURM_CONF that names no file for 60 s: status and stop say so
    at once instead, as the launch does, and stop leaves the record as it was."""
    calls = fake_squeue(tmp_path, monkeypatch, "7|RUNNING|None|n[1-2]")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    store = RunStore(tfl_home)
    record = slurm_run(store)
    fix = f"SLURM_CONF={tmp_path / 'no-such-slurm.conf'} is not a file; set it to the cluster's slurm.conf"
    one = runner.invoke(app, ["status", RUN])
    assert one.exit_code == 0, one.output
    assert f"slurm: job 7, state unknown ({fix}" in one.stdout
    assert runner.invoke(app, ["status"]).exit_code == 0
    record.launcher_pid, record.launcher_create_time = 999_999_999, 1.0  # its launcher gone: stop asks Slurm itself
    store.save(record)
    stopped = runner.invoke(app, ["stop", RUN, "--grace-period", "0"])
    assert stopped.exit_code != 0 and fix in stopped.output and "Traceback" not in stopped.output, stopped.output
    assert len(stopped.output.strip().splitlines()) == 1, stopped.output
    assert store.load(RUN).state == RunState.RUNNING  # not called stopped: the job may still run
    assert not calls.exists()  # no Slurm command was run


def test_a_bad_slurm_conf_after_the_run_ended_is_a_note_not_an_error(tfl_home: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A run its launcher already stopped: `tfl stop` says so, and that Slurm could not be asked."""
    calls = fake_squeue(tmp_path, monkeypatch, "7|CANCELLED|None|n[1-2]")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))
    store = RunStore(tfl_home)
    record = slurm_run(store)
    record.state, record.launcher_pid, record.launcher_create_time = RunState.STOPPED, 999_999_999, 1.0
    store.save(record)
    stopped = runner.invoke(app, ["stop", RUN])
    assert stopped.exit_code == 0, stopped.output
    assert stopped.stdout.splitlines() == [f"run {RUN}: already stopped; nothing to stop",
                                           f"  not reached: slurm: SLURM_CONF={tmp_path / 'no-such-slurm.conf'} is not a "
                                           "file; set it to the cluster's slurm.conf, or unset it where Slurm's commands "
                                           "find their own"]
    assert not calls.exists()
