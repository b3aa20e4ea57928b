"""`tfl rm` and `tfl prune` of a run dir without a record: a detached launch whose background
launcher was killed (kill -9, the OOM killer) before it recorded its run left plan.json,
launcher.log and preparing.json under runs/, which `tfl status` listed as lost and `tfl rm`
called "not found": it stayed forever. It goes now, by its name, once nothing can still make it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.identity import ProcessIdentity
from launcher.records.index import active_ids, mark_active
from launcher.records.preparing import PREPARING_FILE, Preparing
from launcher.records.store import RunStore
from tests.procs import pid_alive

runner = CliRunner()
DAY = 86400.0
DEAD = ProcessIdentity(pid=999_999_999, create_time=1.0, start_ticks=5)


def orphan(store: RunStore, run_id: str, age_s: float, launcher: ProcessIdentity | None = DEAD) -> Path:
    """What a detached launch leaves when its launcher dies before its record: plan, log, note, marker."""
    run_dir = store.run_dir(run_id)
    run_dir.mkdir(parents=True, mode=0o700)
    (run_dir / "plan.json").write_text(json.dumps({"run_id": run_id}))
    (run_dir / "launcher.log").write_bytes(b"x" * 50_000)
    if launcher is not None:
        note = Preparing(run_id, str(run_dir), "job.py", time.time() - age_s, launcher, tasks=[("chief:0", "localhost")])
        (run_dir / PREPARING_FILE).write_text(json.dumps(asdict(note)))
        mark_active(store.home, run_id)
    then = time.time() - age_s
    for path in [run_dir, *run_dir.iterdir()]:
        os.utime(path, (then, then))
    return run_dir


def test_a_run_dir_left_without_a_record_is_removed_by_rm(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    run_dir = orphan(store, "job-20261127-000000-aaaa", age_s=3600)
    listed = runner.invoke(app, ["status", "--json"])
    assert [r["state"] for r in json.loads(listed.stdout)] == ["lost"]
    stop = runner.invoke(app, ["stop", "job-2026"])
    assert stop.exit_code == 0 and "nothing to stop" in stop.stdout and "`tfl rm job-20261127-000000-aaaa` removes its dir" in stop.stdout
    result = runner.invoke(app, ["rm", "job-2026"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("removed job-20261127-000000-aaaa (") and lines[0].endswith(
        "; no record: a launch that ended before it recorded its run)")
    assert lines[1].startswith("tfl: removed 1 run(s), ")
    assert not run_dir.exists() and active_ids(tfl_home) == []
    again = runner.invoke(app, ["rm", "job-20261127-000000-aaaa"])
    assert again.exit_code == 2 and "run 'job-20261127-000000-aaaa' not found" in again.stderr


def test_rm_keeps_a_record_less_dir_a_launch_may_still_be_making(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    fresh = orphan(store, "fresh", age_s=1, launcher=None)  # between the dir and its record (or its note)
    live = orphan(store, "live", age_s=3600, launcher=ProcessIdentity.of(os.getpid()))  # a launcher preparing
    named = orphan(store, "named", age_s=3600, launcher=None)
    marked = orphan(store, "marked", age_s=3600, launcher=None)
    # a background launcher starting (its argv names the plan) and a task carrying the run's marker
    starting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(named / "plan.json")])
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={**os.environ, "TFL_RUN_ID": "marked"})
    try:
        result = runner.invoke(app, ["rm", "fresh", "live", "named", "marked"])
        assert result.exit_code == 1, result.output
        kept = dict(line.removeprefix("kept ").split(": ", 1) for line in result.stdout.splitlines()[:-1])
        assert kept["fresh"].startswith("it changed ") and kept["fresh"].endswith("try again in a minute")
        assert kept["live"] == f"its background launcher (pid {os.getpid()}) is making the hosts ready; `tfl stop live` calls it off"
        assert kept["named"] == f"process {starting.pid} still works in it (a launch being prepared, or a task of it); `tfl stop named` first"
        assert kept["marked"].startswith(f"process {task.pid} still works in it")
        assert all(d.exists() for d in (fresh, live, named, marked))
        pruned = runner.invoke(app, ["prune", "--older-than", "0s"])
        assert pruned.exit_code == 0 and pruned.stdout == "tfl: nothing to remove\n"
    finally:
        for proc in (starting, task):
            proc.kill()
            proc.wait()
    assert not pid_alive(starting.pid) and not pid_alive(task.pid)
    assert runner.invoke(app, ["rm", "named", "marked"]).exit_code == 0 and not named.exists() and not marked.exists()


@pytest.mark.parametrize("dry_run", [True, False])
def test_prune_takes_record_less_dirs_by_their_age(tfl_home: Path, dry_run: bool) -> None:
    store = RunStore(tfl_home)
    old = orphan(store, "old-a", age_s=10 * DAY)
    new = orphan(store, "new-b", age_s=1 * DAY, launcher=None)
    result = runner.invoke(app, ["prune", *(["--dry-run"] if dry_run else [])])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    if dry_run:
        assert lines[0].startswith("would remove old-a (") and lines[0].endswith("; no record: a launch that ended before it recorded its run)")
        assert lines[1].startswith("tfl: would remove 1 run(s), ") and old.exists()
    else:
        assert lines[0].startswith("removed old-a (") and not old.exists() and active_ids(tfl_home) == []
    assert new.exists()  # younger than the default 7d
    assert runner.invoke(app, ["prune", "--older-than", "1h"]).exit_code == 0 and not new.exists() and not old.exists()


def test_a_link_in_the_store_is_no_orphan_and_what_it_points_at_stays(tfl_home: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "data").write_text("keep me")
    RunStore(tfl_home).runs_dir.mkdir(parents=True, exist_ok=True)
    (tfl_home / "runs" / "linked").symlink_to(elsewhere)
    result = runner.invoke(app, ["rm", "linked"])
    assert result.exit_code == 2 and "run 'linked' not found" in result.stderr
    assert runner.invoke(app, ["prune", "--older-than", "0s"]).stdout == "tfl: nothing to remove\n"
    assert (elsewhere / "data").read_text() == "keep me" and (tfl_home / "runs" / "linked").is_symlink()
