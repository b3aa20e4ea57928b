"""`tfl stop` without RUN stops the run that is active, not the latest one when that one has ended."""

from __future__ import annotations

from pathlib import Path

from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord, RunStore, TaskRecord
from launcher.runs.stop import stop_ref


def add_run(store: RunStore, run_id: str, created: float, state: RunState) -> None:
    """A recorded local run whose launcher is gone (no pid recorded) and whose task never started."""
    done = state.is_terminal
    task = TaskRecord(task="chief:0", host="localhost", backend="local", log_path="l", progress_path="p",
                      state=TaskState.SUCCEEDED if done else TaskState.PENDING)
    store.create(RunRecord(run_id=run_id, job="j.py", job_args=[], run_dir=str(store.run_dir(run_id)), created=created,
                           state=state, tasks=[task], exit_code=0 if done else None))


def test_stop_without_run_stops_the_older_active_run_not_the_latest_finished_one(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    add_run(store, "old-running", 1.0, RunState.RUNNING)
    add_run(store, "new-done", 2.0, RunState.SUCCEEDED)
    said = stop_ref(store, None, grace=0.0)
    assert said.startswith("run old-running: stopped"), said
    assert store.load("old-running").state is RunState.STOPPED
    assert store.load("new-done").state is RunState.SUCCEEDED


def test_stop_without_run_and_none_active_stops_nothing(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    add_run(store, "done", 1.0, RunState.FAILED)
    assert stop_ref(store, None).startswith("no run is active; nothing to stop")
    assert store.load("done").state is RunState.FAILED


def test_stop_without_run_stops_the_latest_of_several_active_runs_and_names_the_others(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    add_run(store, "first", 1.0, RunState.RUNNING)
    add_run(store, "second", 2.0, RunState.STARTING)
    add_run(store, "third-done", 3.0, RunState.SUCCEEDED)
    said = stop_ref(store, None, grace=0.0)
    assert said.splitlines()[0].startswith("run second: stopped"), said
    assert said.splitlines()[1] == "1 other run(s) still active: first (`tfl stop RUN` stops one)"
    assert [store.load(r).state for r in ("first", "second")] == [RunState.RUNNING, RunState.STOPPED]


def test_stop_with_a_run_still_takes_that_run_even_when_finished(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    add_run(store, "old-running", 1.0, RunState.RUNNING)
    add_run(store, "new-done", 2.0, RunState.SUCCEEDED)
    assert stop_ref(store, "new-done") == "run new-done: already succeeded; nothing to stop"
    assert store.load("old-running").state is RunState.RUNNING
