"""`tfl resume` of a run whose model dir holds no checkpoint any more (removed after `tfl stop`, whose
status said "every training task saved the agreed checkpoint at step 480") says the job starts over:
it used to start training at step 0 without a word and report the run succeeded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.describe.spec import parse_cluster
from launcher.plan.build import build_plan
from launcher.records.states import RunState
from launcher.records.store import RunStore
from launcher.supervise.supervisor import initial_record
from tests.procs import tfl_processes

runner = CliRunner()


def stopped_run(store: RunStore, job: Path) -> Path:
    """A stopped one-task run of ``job`` on this machine; its model dir."""
    plan = build_plan(parse_cluster({"cluster": {"chief": ["localhost:1"]}}), str(job), (), run_id="r",
                      run_dir=str(store.run_dir("r")), python=sys.executable, cwd=str(job.parent))
    record = initial_record(plan, created=1.0, max_restarts=0, backend="local")
    record.state, record.launcher_pid, record.message = RunState.STOPPED, 2**22 + 1, "stopped by the user"
    store.create(record)
    return store.run_dir("r") / "model"


@pytest.mark.parametrize("kept", [False, True])
def test_a_resume_with_no_checkpoint_left_says_it_starts_over(tfl_home: Path, tmp_path: Path, kept: bool) -> None:
    job = tmp_path / "job.py"
    job.write_text("print('trained')\n")
    model = stopped_run(RunStore(tfl_home), job)
    if kept:
        (model / "checkpoints").mkdir(parents=True)
        (model / "checkpoints" / "ckpt-1.index").write_text("")
    result = runner.invoke(app, ["resume", "r"])
    assert result.exit_code == 0, result.output
    note = f"tfl: note: run r's model dir {model} holds no checkpoint or backup: the job starts over from step 0"
    assert (note in result.stderr.splitlines()) is not kept, result.stderr
    assert "[chief:0] trained" in result.stdout and RunStore(tfl_home).load("r").state == RunState.SUCCEEDED
    assert tfl_processes(home=str(tfl_home)) == []
