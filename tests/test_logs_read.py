"""Reading a run's logs the way a new user tries it: `tfl logs RUN chief:0` (a task given as an argument)
is refused in one line naming --task, not with typer's "unexpected extra argument"; `--follow` of a run
whose launcher is gone says why it stops."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord, RunStore
from launcher.views.status import effective_state
from tests.test_logs_missing import finished_run

runner = CliRunner()


@pytest.mark.parametrize(("extra", "hint"), [(["worker:0"], "--task worker:0"), (["chief", "0"], "--task chief:0")])
def test_a_task_given_as_an_argument_is_refused_with_the_task_option(tfl_home: Path, extra: list[str], hint: str) -> None:
    finished_run(RunStore(tfl_home))
    result = runner.invoke(app, ["logs", "r", *extra])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == (f"tfl: error: logs takes one RUN, got also {' '.join(extra)}; for one task's log give --task, "
                             f"e.g. `tfl logs r {hint}`\n")
    shown = runner.invoke(app, ["logs", "r", *hint.split()])
    assert shown.exit_code == 0 and shown.stdout == f"[{hint.split()[1]}] hello from {hint.split()[1]}\n"


def lost_run(store: RunStore) -> RunRecord:
    """A run whose record says running and whose launcher is gone (killed with -9): `lost`."""
    record = finished_run(store)
    record.state, record.ended = RunState.RUNNING, None
    for task in record.tasks:
        task.state, task.exit_code = TaskState.RUNNING, None
    store.save(record)
    return record


def test_following_a_lost_run_says_why_it_stops(tfl_home: Path) -> None:
    """`tfl logs -f` of a run whose launcher was killed ended at once, exit 0, with no word, while the
    tasks it left went on writing their logs: it looked like a run that had ended."""
    store = RunStore(tfl_home)
    lost_run(store)
    assert effective_state(store.load("r")) == RunState.LOST
    result = runner.invoke(app, ["logs", "r", "--follow", "--tail", "1"])
    assert result.exit_code == 0
    assert result.stdout == "[chief:0]  hello from chief:0\n[worker:0] hello from worker:0\n"
    assert result.stderr == ("tfl: run r is lost (its launcher is gone): --follow stops here; tasks it left may still run "
                             "and write their logs: `tfl status r` shows them, `tfl stop r` ends them\n")
    assert runner.invoke(app, ["logs", "r"]).stderr == ""  # not following: nothing stopped early


def test_following_a_finished_run_ends_without_a_word(tfl_home: Path) -> None:
    finished_run(RunStore(tfl_home))
    result = runner.invoke(app, ["logs", "r", "--follow"])
    assert result.exit_code == 0 and result.stderr == "" and result.stdout.count("hello from") == 2
