"""docs/commands.md's `tfl status --json` section names every field and state the JSON can hold,
and only those: the page had no word on them (what `alive`, `from_launcher` or the `gone` task
state mean, that an unreadable record's row has other fields), so a script reading the JSON had
to guess, and nothing would tell a renamed field."""

from __future__ import annotations

import dataclasses
import re

from launcher.engines.base import NO_ANSWER
from launcher.records.states import RunState, TaskState
from launcher.records.store import UnreadableRun
from launcher.views.status import PENDING, PREPARING, RunView, TaskView
from tests.conftest import ROOT

SECTION = (ROOT / "docs" / "commands.md").read_text().split("## `tfl status --json`\n", 1)[1].split("\n## ", 1)[0]


def first_column(header: str) -> set[str]:
    """The backticked names in the first column of the section's table whose header is ``header``."""
    table = SECTION.split(f"| {header} |", 1)[1].split("\n\n", 1)[0]
    return {name for row in table.splitlines()[2:] for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])}


def test_every_run_and_task_field_is_named_and_only_those() -> None:
    assert first_column("run field") == {f.name for f in dataclasses.fields(RunView)}
    assert first_column("task field") == {f.name for f in dataclasses.fields(TaskView)}


def test_every_state_is_named_and_only_those() -> None:
    runs = {s.value for s in RunState} | {PREPARING, PENDING, "unreadable"}
    assert first_column("run state") == runs
    tasks = {s.value for s in TaskState} | {PREPARING, NO_ANSWER, "gone", "unreachable"}
    assert first_column("task state") == tasks


def test_an_unreadable_rows_fields_are_the_ones_named() -> None:
    row = UnreadableRun("r", "/p", "why", 1.0).to_dict()
    assert row["state"] == "unreadable"
    named = re.search(r"the row has only (.*?) \|", SECTION)
    assert named is not None and set(re.findall(r"`([^`]+)`", named[1])) == set(row)
