"""`tfl logs` of a run whose task log is missing (removed by hand, or not written yet) says so on
stderr, one line naming the task and the path; it used to print nothing for that task, exit 0,
as if the task had written nothing."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.identity import ProcessIdentity
from launcher.records.index import mark_active
from launcher.records.preparing import PREPARING_FILE, Preparing
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord, RunStore, TaskRecord

runner = CliRunner()


def finished_run(store: RunStore) -> RunRecord:
    run_dir = store.run_dir("r")
    tasks = [TaskRecord(task=name, host="localhost", backend="local", log_path=str(run_dir / "logs" / f"{name.replace(':', '-')}.log"),
                        progress_path=str(run_dir / "progress" / "p.json"), state=TaskState.SUCCEEDED, exit_code=0)
             for name in ("chief:0", "worker:0")]
    record = RunRecord(run_id="r", job="j.py", job_args=[], run_dir=str(run_dir), created=time.time(), state=RunState.SUCCEEDED,
                       ended=time.time(), launcher_pid=2**22 + 1, tasks=tasks)
    store.create(record)
    for task in tasks:
        Path(task.log_path).write_text(f"hello from {task.task}\n")
    return record


@pytest.mark.parametrize("args", [[], ["--tail", "5"], ["--follow"], ["--task", "worker:0"]])
def test_a_missing_task_log_is_named(tfl_home: Path, args: list[str]) -> None:
    record = finished_run(RunStore(tfl_home))
    Path(record.tasks[1].log_path).unlink()
    result = runner.invoke(app, ["logs", "r", *args])
    assert result.exit_code == 0, result.output
    assert result.stdout == ("" if "--task" in args else "[chief:0]  hello from chief:0\n")
    assert result.stderr == f"tfl: worker:0 has no log at {record.tasks[1].log_path} (not started yet, or the file was removed)\n"


def test_logs_that_are_there_are_shown_without_a_note(tfl_home: Path) -> None:
    finished_run(RunStore(tfl_home))
    result = runner.invoke(app, ["logs", "r"])
    assert result.exit_code == 0 and result.stderr == ""
    assert result.stdout == "[chief:0]  hello from chief:0\n[worker:0] hello from worker:0\n"


@pytest.mark.parametrize("alive", [True, False])
@pytest.mark.parametrize("named", [True, False])
def test_logs_of_a_launch_not_recorded_yet_says_what_it_is(tfl_home: Path, alive: bool, named: bool) -> None:
    """`tfl status` lists a --detach launch whose hosts are being made ready (or whose launcher died
    then); `tfl logs RUN` called it "not found", and `tfl logs` alone showed an older run's logs."""
    store = RunStore(tfl_home)
    finished_run(store)  # an older run, recorded
    run_dir = store.run_dir("p")
    run_dir.mkdir()
    launcher = ProcessIdentity.of(os.getpid()) if alive else ProcessIdentity(pid=999_999_999, create_time=1.0, start_ticks=5)
    (run_dir / PREPARING_FILE).write_text(json.dumps(asdict(Preparing("p", str(run_dir), "j.py", time.time() + 5, launcher))))
    mark_active(tfl_home, "p")
    result = runner.invoke(app, ["logs", *(["p"] if named else [])])
    assert result.exit_code == 2 and result.stdout == "", result.output
    if alive:
        assert result.stderr == (f"tfl: error: run p is being prepared (its hosts made ready): no task has started, so no task "
                                 f"logs yet; its background launcher's log: {run_dir}/launcher.log\n")
    else:
        assert result.stderr == (f"tfl: error: run p: its background launcher (pid 999999999) ended before it recorded the run; "
                                 f"no task ran (its log: {run_dir}/launcher.log; `tfl rm p` removes its dir)\n")
