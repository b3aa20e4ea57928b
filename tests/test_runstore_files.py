"""Issue 13, files: private run dirs, durable state, a full disk, unique run ids, newer records."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from typer.testing import CliRunner

from launcher import files
from launcher.cli import app
from launcher.describe.ports import free_port
from launcher.describe.spec import parse_cluster
from launcher.engines.local.backend import LocalBackend
from launcher.errors import RunExistsError, StateWriteError, UnreadableRunError
from launcher.plan.build import build_plan
from launcher.plan.run_options import SupervisorConfig
from launcher.records.states import RunState, TaskState
from launcher.records.store import RECORD_VERSION, RunRecord, RunStore, TaskRecord
from launcher.supervise.supervisor import Supervisor, initial_record
from tests.procs import assert_none_left
from tests.test_supervisor import FakeBackend, FakeClock

runner = CliRunner()


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def a_record(store: RunStore, run_id: str = "r", created: float = 1.0) -> RunRecord:
    task = TaskRecord(task="chief:0", host="localhost", backend="local", log_path="l", progress_path="p")
    return RunRecord(run_id=run_id, job="j.py", job_args=[], run_dir=str(store.run_dir(run_id)), created=created, tasks=[task])


@pytest.fixture
def umask() -> Iterator[Any]:
    """Set the process umask for one test, then restore it."""
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask", [0o000, 0o277])  # 000: nothing narrows the modes; 277: would leave tfl unable to write
def test_run_dir_is_0700_and_its_files_0600_whatever_the_umask(tmp_path: Path, umask: Any, mask: int) -> None:
    umask(mask)
    store = RunStore(tmp_path / "home")
    record = a_record(store)
    store.create(record)
    store.save(record)
    run_dir = store.run_dir("r")
    for folder in (tmp_path / "home", store.runs_dir, run_dir, run_dir / "logs", run_dir / "progress"):
        assert mode(folder) == 0o700, folder
    assert mode(run_dir / "state.json") == 0o600
    with files.open_private(run_dir / "logs" / "x.log") as log:
        log.write(b"line\n")
    files.write_atomic(run_dir / "plan.json", "{}")
    assert mode(run_dir / "logs" / "x.log") == 0o600 and mode(run_dir / "plan.json") == 0o600


def test_local_task_log_is_0600(tmp_path: Path, umask: Any) -> None:
    umask(0)
    store = RunStore(tmp_path / "home")
    spec = parse_cluster({"cluster": {"chief": ["localhost:1"]}})
    plan = build_plan(spec, "-c", (), run_id="r", run_dir=str(store.run_dir("r")), python=sys.executable, cwd=str(tmp_path))
    store.create(initial_record(plan, created=1.0, max_restarts=0, backend="local"))
    launch = plan.tasks[0]
    backend = LocalBackend()
    proc = backend.start(dataclasses.replace(launch, argv=(sys.executable, "-c", "print('hi')")), 0)
    deadline = time.monotonic() + 30
    while backend.poll(proc) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend.poll(proc) == 0
    assert mode(Path(launch.log_path)) == 0o600 and Path(launch.log_path).read_text() == "hi\n"


def test_detached_run_writes_plan_and_logs_privately(tmp_path: Path, umask: Any) -> None:
    """plan.json holds every task's env (secrets included): 0600, like the logs, under umask 000."""
    job = tmp_path / "job.py"
    job.write_text("print('done')\n")
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": {"chief": [f"localhost:{free_port()}"]}, "env": {"SECRET": "s3cr3t"}}))
    home = tmp_path / "home"
    env = {**os.environ, "TFL_HOME": str(home)}
    out = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--cluster", str(cluster), "--detach"],
                         env=env, capture_output=True, text=True, timeout=60, umask=0)
    assert out.returncode == 0, out.stderr
    run_dir = home / "runs" / out.stdout.strip()
    deadline = time.monotonic() + 30
    while json.loads((run_dir / "state.json").read_text())["state"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "s3cr3t" in (run_dir / "plan.json").read_text()
    assert mode(run_dir) == 0o700 and mode(run_dir / "logs") == 0o700
    for name in ("plan.json", "state.json", "launcher.log", "logs/chief-0.log"):
        assert mode(run_dir / name) == 0o600, name
    assert_none_left(str(home))


def test_state_is_fsynced_file_then_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path)
    record = a_record(store)
    store.create(record)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", fsync)
    store.save(record)
    assert synced == ["file", "dir"]


def test_a_full_disk_is_one_clear_error_and_keeps_the_last_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path)
    record = a_record(store)
    store.create(record)
    before = (store.run_dir("r") / "state.json").read_text()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    record.state = RunState.RUNNING
    with pytest.raises(StateWriteError) as info:
        store.save(record)
    assert str(info.value) == (f"cannot save the state of run r to {store.run_dir('r')}/state.json: No space left on device; "
                               "its last saved record stays (free space on that disk or fix its permissions)")
    assert (store.run_dir("r") / "state.json").read_text() == before
    assert sorted(p.name for p in store.run_dir("r").iterdir()) == ["logs", "progress", "state.json"]  # no temp file left


def test_a_run_dir_caught_midway_through_its_removal_is_said_as_removed(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """An `rm -r` of the run dir that takes the record's temp file before its rename, the dir itself
    still there for a moment: the save says the run dir was removed (CI once said "free space" here)."""
    store = RunStore(tmp_path)
    record = a_record(store)
    store.create(record)
    real_replace = files.os.replace

    def removed_midway(src: str, dst: str) -> None:
        os.unlink(src)  # the rm -r's work, the dir not yet gone
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", removed_midway)
    with pytest.raises(StateWriteError, match="^the run dir .* was removed while run r ran"):
        store.save(record)
    assert not (tmp_path / "active" / "r").exists()


class FillingStore(RunStore):
    """A store whose disk fills up after ``room`` saves."""

    def __init__(self, home: Path, room: int) -> None:
        super().__init__(home)
        self.room = room

    def save(self, record: RunRecord) -> None:
        if self.room <= 0:
            raise StateWriteError("cannot save the state of run r: No space left on device")
        self.room -= 1
        super().save(record)


def test_supervisor_stops_the_tasks_when_state_cannot_be_saved(tmp_path: Path) -> None:
    store = FillingStore(tmp_path, room=100)
    plan = build_plan(parse_cluster({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]}}), "/job.py", (),
                      run_id="r", run_dir=str(store.run_dir("r")), python="py", cwd="/")
    record = initial_record(plan, created=0.0, max_restarts=0, backend="fake")
    store.create(record)
    clock = FakeClock()
    backend = FakeBackend(clock, {"chief:0": [(1.0, 0)]})  # the chief ends at t=1; the worker would run forever
    store.room = 2  # STARTING, RUNNING (with both starts); the chief's end does not fit
    sup = Supervisor(plan, record, store, SupervisorConfig(poll_interval=0.5), backend=backend,
                     clock=clock, wall=clock, wait=clock.sleep)
    with pytest.raises(StateWriteError, match="No space left on device"):
        sup.run()
    assert [name for name, _, _ in backend.signals][:1] == ["worker:0"]  # SIGTERM to the one still running
    assert clock.now < 2.0  # at the first write that failed, not at some later poll
    assert sup.record.state == RunState.FAILED and "No space left on device" in (sup.record.message or "")
    on_disk = store.load("r")
    assert on_disk.state == RunState.RUNNING and on_disk.task("worker:0").pid is not None  # the last record that fitted
    assert on_disk.task("chief:0").state == TaskState.RUNNING


def test_run_ids_are_unique_and_a_run_dir_is_never_shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path)
    ids = {store.new_run_id("job") for _ in range(200)}
    assert len(ids) == 200 and all(len(i.rsplit("-", 1)[1]) == 12 for i in ids)  # 48 random bits each
    store.create(a_record(store, "job-taken"))
    with pytest.raises(RunExistsError, match="run dir .*/job-taken exists already"):
        store.create(a_record(store, "job-taken"))
    tokens = iter(["taken0", "fresh0"])
    monkeypatch.setattr("secrets.token_hex", lambda n: next(tokens))
    monkeypatch.setattr("launcher.records.store.time.strftime", lambda fmt: "T")
    store.create(a_record(store, "job-T-taken0"))
    assert store.new_run_id("job") == "job-T-fresh0"  # the id of an existing dir is never handed out


def newer_record(store: RunStore, run_id: str, created: float) -> None:
    data = json.loads(a_record(store, run_id, created).to_json())
    data.update(version=RECORD_VERSION + 1, host="elsewhere")  # a key this tfl does not know
    store.run_dir(run_id).mkdir(parents=True)
    (store.run_dir(run_id) / "state.json").write_text(json.dumps(data))


def test_a_newer_record_is_named_not_skipped(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create(a_record(store, "old", created=1.0))
    newer_record(store, "new", created=2.0)
    records, unreadable = store.scan()
    assert [r.run_id for r in records] == ["old"]
    assert [(u.run_id, u.reason) for u in unreadable] == [
        ("new", f"state.json was written by a newer tfl (record version {RECORD_VERSION + 1}; this tfl reads up to "
                f"{RECORD_VERSION}): upgrade tfl to use it")]
    with pytest.raises(UnreadableRunError, match="the latest run, new, is unreadable: state.json was written by a newer tfl"):
        store.resolve(None)
    with pytest.raises(UnreadableRunError, match="run 'new': .* was written by a newer tfl"):
        store.resolve("new")
    store.create(a_record(store, "later", created=3.0))
    assert store.resolve(None).run_id == "later"  # an older unreadable run does not block the latest


def test_stop_logs_status_say_so_instead_of_acting_on_an_older_run(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    store.create(a_record(store, "old", created=1.0))
    newer_record(store, "new", created=2.0)
    for args in (["stop"], ["logs"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [
            f"tfl: error: the latest run, new, is unreadable: state.json was written by a newer tfl (record version "
            f"{RECORD_VERSION + 1}; this tfl reads up to {RECORD_VERSION}): upgrade tfl to use it; "
            "name a RUN to act on another one (see `tfl status`)"]
    assert store.load("old").state == RunState.STARTING  # not stopped in its place
    table = runner.invoke(app, ["status"])
    assert table.exit_code == 0
    assert [line.split()[:3] for line in table.stdout.splitlines()[1:3]] == [["old", "j.py", "starting"], ["new", "-", "unreadable"]]
    assert "new: unreadable: state.json was written by a newer tfl" in table.stdout
    listed = json.loads(runner.invoke(app, ["status", "--json"]).stdout)
    assert [(r["run_id"], r["state"]) for r in listed] == [("old", "starting"), ("new", "unreadable")]
    assert "newer tfl" in listed[1]["reason"]


def test_watch_of_an_unreadable_run_is_one_line(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    newer_record(store, "new", created=2.0)
    result = runner.invoke(app, ["status", "new", "--watch"])
    assert result.exit_code == 2 and isinstance(result.exception, (SystemExit, type(None))), result.exception
    assert result.stderr.startswith("tfl: error: run 'new': ") and "was written by a newer tfl" in result.stderr


def test_a_run_ref_is_a_prefix_of_one_name_not_a_glob_or_a_path(tmp_path: Path) -> None:
    """`tfl status 'mnist-*-dbd7'` used to find a run by glob, `../runs/ID` reached a run dir through
    a path, and an ambiguous prefix always ended its list with "…", even with every match shown."""
    from launcher.errors import RunNotFoundError

    store = RunStore(tmp_path)
    for run_id in ("mnist-a1", "mnist-b2"):
        store.create(a_record(store, run_id))
    assert store.resolve("mnist-a").run_id == "mnist-a1"
    with pytest.raises(RunNotFoundError, match=r"^'mnist' matches 2 runs \(mnist-a1, mnist-b2\); give more of the id$"):
        store.resolve("mnist")
    store.create(a_record(store, "mnist-c3"))
    store.create(a_record(store, "mnist-d4"))
    with pytest.raises(RunNotFoundError, match=r"^'mnist' matches 4 runs \(mnist-a1, mnist-b2, mnist-c3, …\)"):
        store.resolve("mnist")
    for ref in ("mnist-*2", "mnist-[a]1", "../runs/mnist-a1", "./mnist-a1"):
        with pytest.raises(RunNotFoundError, match=f"run '{re.escape(ref)}' not found"):
            store.resolve(ref)


def test_a_tfl_home_that_is_a_file_is_named_not_taken_for_a_taken_run_id(tmp_path: Path) -> None:
    """TFL_HOME (or its runs/) a plain file said "run dir … exists already (another launch took
    the same run id); launch again for a new id": a launch again fails the same way."""
    (tmp_path / "home").write_text("")
    store = RunStore(tmp_path / "home")
    with pytest.raises(StateWriteError, match=f"^cannot create the run dir .*: {tmp_path / 'home'} is not a directory "
                                              r"\(set TFL_HOME to a directory, or move that file away\)$"):
        store.reserve(store.run_dir("r"))
