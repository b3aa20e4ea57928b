"""`tfl resume` of a local run whose job script is gone: refused in one line before anything starts.
It used to claim the next attempt and start every task, each failing "can't open file", so the
run failed again with a restart spent and "resume it (once its cause is fixed)" as its summary."""

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
from launcher.runs.resume import check_resumable
from launcher.supervise.supervisor import initial_record

runner = CliRunner()


def failed_run(store: RunStore, job: Path) -> None:
    plan = build_plan(parse_cluster({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]}}), str(job), (),
                      run_id="r", run_dir=str(store.run_dir("r")), python=sys.executable, cwd=str(job.parent))
    record = initial_record(plan, created=1.0, max_restarts=0, backend="local")
    record.state, record.launcher_pid = RunState.FAILED, 2**22 + 1  # ended; its launcher gone
    store.create(record)


@pytest.mark.parametrize("detach", [False, True])
def test_resume_of_a_run_whose_job_script_is_gone_is_one_line(tfl_home: Path, tmp_path: Path, detach: bool) -> None:
    job = tmp_path / "job.py"
    job.write_text("print('hi')\n")
    store = RunStore(tfl_home)
    failed_run(store, job)
    check_resumable(store.load("r"), job=True)  # there: resumable
    job.unlink()
    result = runner.invoke(app, ["resume", "r", *(["--detach"] if detach else [])])
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"tfl: error: run r: its job script {job} is gone (moved or removed since the launch); put it back "
                             "there to resume the run, or launch the job from where it is now for a new run\n")
    after = store.load("r")
    assert (after.attempt, after.restarts, after.state) == (0, [], RunState.FAILED)  # nothing claimed, nothing started
    assert not (store.run_dir("r") / "logs" / "chief-0.log").exists()
