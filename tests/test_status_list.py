"""`tfl status` without RUN: the active runs and the 20 latest, reading only their records."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.identity import ProcessIdentity
from launcher.records.index import active_ids
from launcher.records.preparing import Preparing, forget_preparing, note_preparing
from launcher.records.states import RunState
from launcher.records.store import STATE_FILE, RunRecord, RunStore, TaskRecord

runner = CliRunner()


def add_run(store: RunStore, run_id: str, created: float, state: RunState, *, launcher_alive: bool = False) -> None:
    me = psutil.Process()
    record = RunRecord(run_id=run_id, job="j.py", job_args=[], run_dir=str(store.run_dir(run_id)), created=created,
                       state=state, launcher_pid=me.pid if launcher_alive else 999_999_999,
                       launcher_create_time=me.create_time() if launcher_alive else 1.0,
                       tasks=[TaskRecord(task="chief:0", host="localhost", backend="local", log_path="l", progress_path="p")])
    store.create(record)
    os.utime(store.run_dir(run_id), (created, created))  # its record last changed when it was created


@pytest.fixture
def store(tfl_home: Path) -> RunStore:
    """25 finished runs (one a minute), then a run still running and a lost one, both the oldest."""
    store = RunStore(tfl_home)
    base = 1_700_000_000.0
    add_run(store, "running-one", base - 600, RunState.RUNNING, launcher_alive=True)
    add_run(store, "lost-one", base - 500, RunState.RUNNING)
    for i in range(25):
        add_run(store, f"done-{i:02d}", base + 60 * i, RunState.SUCCEEDED)
    return store


def listed(args: list[str]) -> list[str]:
    result = runner.invoke(app, ["status", *args])
    assert result.exit_code == 0, result.output
    return [line.split()[0] for line in result.stdout.splitlines()[1:] if not line.startswith("…")]


def test_markers_follow_the_record(store: RunStore) -> None:
    assert active_ids(store.home) == ["lost-one", "running-one"]  # finished runs dropped theirs on their last save
    record = store.load("running-one")
    record.state = RunState.STOPPED
    store.save(record)
    assert active_ids(store.home) == ["lost-one"]


def test_default_lists_active_and_latest(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = []
    original = RunRecord.from_json.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(RunRecord, "from_json", classmethod(lambda cls, text: reads.append(1) or original(cls, text)))
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines()[1:-1]]
    assert [r[0] for r in rows] == ["running-one", "lost-one", *(f"done-{i:02d}" for i in range(5, 25))]
    assert rows[0][2] == "running" and rows[1][2] == "lost"
    assert result.stdout.splitlines()[-1] == "… and 5 older run(s): `tfl status --all` lists every run"
    assert len(reads) == 22  # the 5 older records were never read


def test_all_and_json_follow_the_same_rule(store: RunStore) -> None:
    assert len(listed(["--all"])) == 27
    default = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
    assert [v["run_id"] for v in default][:3] == ["running-one", "lost-one", "done-05"] and len(default) == 22
    assert len(json.loads(runner.invoke(app, ["status", "--json", "--all"]).stdout)) == 27


def test_latest_run_is_the_newest_created(store: RunStore) -> None:
    assert store.resolve(None).run_id == "done-24"
    add_run(store, "newer-but-running", 1_800_000_000.0, RunState.RUNNING, launcher_alive=True)
    os.utime(store.run_dir("newer-but-running"), (1.0, 1.0))  # even when its dir looks old: it is active
    assert store.resolve(None).run_id == "newer-but-running"


def test_watch_redraws_the_list(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    frames = []
    real_sleep, tester = time.sleep, threading.current_thread()

    def sleep(seconds: float) -> None:
        # The patch is the time module's own sleep, seen by every thread of this worker: another test's
        # thread that sleeps meanwhile must neither count nor be stopped (it once took the second frame,
        # and the watch then redrew forever, until the suite's timeout).
        if threading.current_thread() is not tester:
            real_sleep(seconds)
            return
        frames.append(seconds)
        if len(frames) >= 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("launcher.views.report.time.sleep", sleep)
    result = runner.invoke(app, ["status", "--watch"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("RUN  ") == 2 and "\033[2J" not in result.stdout  # two frames; not a terminal: no clearing


def test_ctrl_c_ends_a_logs_follow_as_it_ends_a_status_watch(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user who stops watching did not fail: both viewers (and `tfl tensorboard`) exit 0 on Ctrl-C."""
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("launcher.runs.stop.show_logs", interrupted)
    monkeypatch.setattr("launcher.views.report.watch", interrupted)
    followed = runner.invoke(app, ["logs", "running-one", "--follow"])
    watched = runner.invoke(app, ["status", "--watch"])
    assert (followed.exit_code, watched.exit_code) == (0, 0), followed.output


def test_a_run_that_ends_while_status_looks_at_it_is_not_lost(store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher saves the run's end, then exits. `tfl status` read the record before the one and looked
    for the launcher after the other (`tfl status RUN` samples cpu % and asks the hosts in between): the
    run that had just succeeded was shown "lost"."""
    real_alive = ProcessIdentity.alive

    def ends_meanwhile(identity: ProcessIdentity) -> bool:
        record = store.load("running-one")
        if identity.pid == record.launcher_pid and not record.state.is_terminal:
            record.state, record.ended, record.exit_code = RunState.SUCCEEDED, time.time(), 0
            store.save(record)  # the launcher's last save; it has exited since
            return False
        return real_alive(identity)

    monkeypatch.setattr(ProcessIdentity, "alive", ends_meanwhile)
    one = runner.invoke(app, ["status", "running-one", "--json"])
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout)["state"] == "succeeded"
    store.reopen(dataclasses.replace(store.load("running-one"), state=RunState.RUNNING, ended=None, exit_code=None))
    rows = {line.split()[0]: line.split()[2] for line in runner.invoke(app, ["status"]).stdout.splitlines()[1:-1]}
    assert rows["running-one"] == "succeeded" and rows["lost-one"] == "lost"  # a launcher gone for good: still lost


def test_a_launch_being_prepared_is_not_counted_again_as_an_older_run(tfl_home: Path) -> None:
    """Its run dir holds a note and no record: it was listed, and counted among the runs left out too
    ("… and 1 older run(s): `tfl status --all` lists every run", which then listed the same one)."""
    store = RunStore(tfl_home)
    run_dir = store.run_dir("p")
    store.reserve(run_dir)
    note_preparing(tfl_home, Preparing("p", str(run_dir), "j.py", time.time(), ProcessIdentity.of(os.getpid()),
                                       tasks=[("chief:0", "localhost")]))
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert [line.split()[:3] for line in result.stdout.splitlines()[1:]] == [["p", "j.py", "preparing"]], result.stdout


def test_a_launch_recorded_while_status_reads_the_store_is_listed(tfl_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A detached launch keeps its note (records.preparing) until its record exists. `tfl status` read the
    records, then the notes: a launch recorded between the two reads was in neither, missing from the list."""
    store = RunStore(tfl_home)
    run_dir = store.run_dir("p")
    store.reserve(run_dir)
    me = ProcessIdentity.of(os.getpid())  # its background launcher, alive
    note_preparing(tfl_home, Preparing("p", str(run_dir), "j.py", time.time(), me, tasks=[("chief:0", "localhost")]))
    real_recent = RunStore.recent

    def recorded_right_after(self: RunStore, count: int) -> Any:
        found = real_recent(self, count)
        if not (run_dir / STATE_FILE).exists():  # the launcher records the run, as it does once its hosts are ready
            store.create(RunRecord(run_id="p", job="j.py", job_args=[], run_dir=str(run_dir), created=time.time(),
                                   state=RunState.RUNNING, launcher_pid=me.pid, launcher_create_time=me.create_time,
                                   launcher_start_ticks=me.start_ticks,
                                   tasks=[TaskRecord(task="chief:0", host="localhost", backend="local", log_path="l",
                                                     progress_path="p")]), reserved=True)
            forget_preparing(str(run_dir))
        return found

    monkeypatch.setattr(RunStore, "recent", recorded_right_after)
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output
    assert [line.split()[:3] for line in result.stdout.splitlines()[1:]] == [["p", "j.py", "preparing"]], result.stdout
    again = runner.invoke(app, ["status"])  # the next look: its record, once
    assert [line.split()[:3] for line in again.stdout.splitlines()[1:]] == [["p", "j.py", "running"]], again.stdout
