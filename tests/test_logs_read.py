"""Reading a run's logs the way a new user tries it: `tfl logs RUN chief:0` (a task given as an argument)
is refused in one line naming --task, not with typer's "unexpected extra argument"."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.store import RunStore
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
