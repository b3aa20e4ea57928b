"""`tfl rm` and `tfl prune`: finished runs go, with their files; a running run never does."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.engines.ssh.node import agent_files as agent
from launcher.engines.ssh.recorded import run_dirs_there
from launcher.records.index import active_ids
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord, RunStore, TaskRecord
from launcher.runs.prune import parse_age, to_prune

runner = CliRunner()
NOW = time.time()
DAY = 86400.0


def add_run(store: RunStore, run_id: str, age_days: float, state: RunState = RunState.SUCCEEDED, *,
            launcher_alive: bool = False, task_pid: int | None = None, plan: dict[str, object] | None = None) -> RunRecord:
    me = psutil.Process()
    run_dir = store.run_dir(run_id)
    task = TaskRecord(task="chief:0", host="localhost", backend="local", log_path=str(run_dir / "logs" / "chief-0.log"),
                      progress_path=str(run_dir / "progress" / "chief-0.json"),
                      state=TaskState.RUNNING if task_pid else TaskState.SUCCEEDED, pid=task_pid,
                      create_time=psutil.Process(task_pid).create_time() if task_pid else None)
    created = NOW - age_days * DAY
    record = RunRecord(run_id=run_id, job="j.py", job_args=[], run_dir=str(run_dir), created=created, state=state,
                       ended=created + 60 if state.is_terminal else None,
                       launcher_pid=me.pid if launcher_alive else 999_999_999,
                       launcher_create_time=me.create_time() if launcher_alive else 1.0, tasks=[task], plan=plan or {})
    store.create(record)
    (run_dir / "logs" / "chief-0.log").write_bytes(b"x" * 100_000)
    return record


def test_parse_age() -> None:
    assert parse_age("7d") == 7 * DAY and parse_age("12h") == 43200 and parse_age("1.5m") == 90 and parse_age("2w") == 14 * DAY
    for bad in ("7", "d", "7x", "-1d", ""):
        with pytest.raises(Exception, match="--older-than"):
            parse_age(bad)


def test_what_prune_picks(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    records = [add_run(store, f"old-{i}", 10 + i) for i in range(3)] + [add_run(store, "new", 1)]
    records.append(add_run(store, "running", 30, RunState.RUNNING, launcher_alive=True))
    records.append(add_run(store, "lost", 20, RunState.RUNNING))  # launcher and tasks gone: removable
    names = lambda runs: [r.run_id for r in runs]  # noqa: E731
    assert names(to_prune(records, older_than=7 * DAY, keep=None, now=NOW)) == ["lost", "old-2", "old-1", "old-0"]
    assert names(to_prune(records, older_than=None, keep=2, now=NOW)) == ["lost", "old-2", "old-1"]
    assert names(to_prune(records, older_than=11.5 * DAY, keep=0, now=NOW)) == ["lost", "old-2"]
    assert names(to_prune(records, older_than=None, keep=10, now=NOW)) == []


def test_rm_removes_finished_runs_and_keeps_running_ones(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    add_run(store, "done-a", 1)
    add_run(store, "lost-b", 2, RunState.RUNNING)
    add_run(store, "running-c", 3, RunState.RUNNING, launcher_alive=True)
    missing = runner.invoke(app, ["rm", "done-a", "nope"])
    assert missing.exit_code == 2 and "run 'nope' not found" in missing.stderr
    assert store.run_dir("done-a").exists()  # nothing removed when one name is wrong
    result = runner.invoke(app, ["rm", "done", "lost-b", "running-c"])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("removed done-a (1") and lines[0].endswith("KB)") and lines[1].startswith("removed lost-b (")
    assert lines[2].startswith("kept running-c: still running (its launcher, pid ") and "`tfl stop running-c` first" in lines[2]
    assert lines[3].startswith("tfl: removed 2 run(s), ") and lines[3].endswith("KB freed here")
    assert sorted(os.listdir(store.runs_dir)) == ["running-c"] and active_ids(tfl_home) == ["running-c"]
    again = runner.invoke(app, ["rm", "done-a"])
    assert again.exit_code == 2 and "not found" in again.stderr


def test_rm_keeps_a_lost_run_whose_task_still_runs(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        add_run(store, "lost", 1, RunState.RUNNING, task_pid=task.pid)
        kept = runner.invoke(app, ["rm", "lost"])
        assert kept.exit_code == 1 and "its launcher is gone but tasks of it still run" in kept.stdout
        assert store.run_dir("lost").exists()
    finally:
        task.kill()
        task.wait()
    assert runner.invoke(app, ["rm", "lost"]).exit_code == 0 and not store.run_dir("lost").exists()


def test_prune(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    for i in range(4):
        add_run(store, f"run-{i}", [30, 10, 3, 0][i])
    add_run(store, "running", 40, RunState.RUNNING, launcher_alive=True)
    dry = runner.invoke(app, ["prune", "--dry-run"])  # default: older than 7 days
    assert dry.exit_code == 0 and [line.split()[:3] for line in dry.stdout.splitlines()[:2]] == [
        ["would", "remove", "run-0"], ["would", "remove", "run-1"]]
    assert "dry run: nothing removed" in dry.stdout and len(os.listdir(store.runs_dir)) == 5
    pruned = runner.invoke(app, ["prune"])
    assert pruned.exit_code == 0 and pruned.stdout.splitlines()[-1].endswith("freed here; 3 run(s) kept")
    assert sorted(os.listdir(store.runs_dir)) == ["run-2", "run-3", "running"]
    assert runner.invoke(app, ["prune", "--keep", "1"]).exit_code == 0
    assert sorted(os.listdir(store.runs_dir)) == ["run-3", "running"]
    bad = runner.invoke(app, ["prune", "--older-than", "soon"])
    assert bad.exit_code == 2 and "--older-than soon: give a number and a unit" in bad.stderr


def test_agent_removes_only_directories_named_after_the_run(tmp_path: Path) -> None:
    run = tmp_path / "tfl" / "r-1"
    (run / "tfl-runs" / "r-1" / "model").mkdir(parents=True)
    (run / "job.py").write_bytes(b"x" * 10_000)
    other = tmp_path / "precious"
    other.mkdir()
    link = tmp_path / "links" / "r-1"
    link.parent.mkdir()
    link.symlink_to(other)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "r-1").write_text("a file")
    paths = [str(run), str(other), "relative/r-1", f"{tmp_path}/x/../tfl/r-1", str(link), str(tmp_path / "files" / "r-1"),
             "/r-1", str(tmp_path / "gone" / "r-1")]
    result = agent.remove({"run_id": "r-1", "paths": paths})
    assert result[str(run)]["removed"] >= 10_000 and not run.exists()
    for refused in paths[1:7]:
        assert result[refused]["error"].startswith("refused"), (refused, result[refused])
    assert result[str(tmp_path / "gone" / "r-1")] == {"absent": True}
    assert other.exists() and link.is_symlink() and (tmp_path / "files" / "r-1").exists()


def test_the_dirs_removed_on_hosts_are_the_runs_own() -> None:
    def task(name: str, cwd: str, run_dir: str, host: str = "gpu1") -> dict[str, object]:
        return {"task": name, "host": host, "port": 1, "argv": ["python", "job.py"], "env": {"TFL_RUN_DIR": run_dir},
                "cwd": cwd, "log_path": "l", "progress_path": "p", "ssh": {"host": host}, "sync": []}

    plan = {"run_id": "r-1", "run_dir": "/here/runs/r-1", "job": "job.py", "job_args": [], "tasks": [
        task("chief:0", "/tmp/tfl/r-1", "/tmp/tfl/r-1/tfl-runs/r-1"),  # shipped: the default workdir is the run's
        task("worker:0", "/srv/train", "/srv/train/tfl-runs/r-1", host="gpu2"),  # a workdir of the user's stays
        task("worker:1", "/srv/../etc", "relative/r-1", host="gpu3"),  # nothing of the run's: nothing asked
    ]}
    record = RunRecord(run_id="r-1", job="job.py", job_args=[], run_dir="/here/runs/r-1", created=1.0, plan=plan,
                       backend="ssh")
    dirs = {host: paths for host, (_, _, paths) in run_dirs_there(record).items()}
    assert dirs == {"gpu1": ["/tmp/tfl/r-1"], "gpu2": ["/srv/train/tfl-runs/r-1"]}


def test_rm_names_a_shared_model_dir_only_where_the_job_made_one(tfl_home: Path, tmp_path: Path) -> None:
    """`tfl rm` said "kept: model dir …" for a shared-storage model dir the job never made."""
    store = RunStore(tfl_home)
    for run_id in ("made", "never"):
        model = tmp_path / "shared" / run_id / "model"
        add_run(store, run_id, 1, plan={"tasks": [{"task": "chief:0", "host": "localhost", "env": {"TFL_MODEL_DIR": str(model)}}]})
    (tmp_path / "shared" / "made" / "model").mkdir(parents=True)
    never = runner.invoke(app, ["rm", "never"])
    assert never.exit_code == 0, never.output
    assert "kept:" not in never.stdout and "model dir" not in never.stdout, never.stdout
    made = runner.invoke(app, ["rm", "made"])
    assert made.exit_code == 0, made.output
    assert f"  kept: model dir {tmp_path / 'shared' / 'made' / 'model'} (shared storage)" in made.stdout.splitlines()
    assert (tmp_path / "shared" / "made" / "model").is_dir()  # shared storage is the user's: it stays


def test_agent_looks_at_a_kept_model_dir_and_never_removes_it(tmp_path: Path) -> None:
    made, never = tmp_path / "shared" / "r-1" / "model", tmp_path / "shared" / "r-2" / "model"
    made.mkdir(parents=True)
    result = agent.remove({"run_id": "r-1", "paths": [], "keep": [str(made), str(never)]})
    assert result == {str(made): {"kept": True}, str(never): {"absent": True}}
    assert made.is_dir()


def test_a_run_with_a_host_not_reached_keeps_its_record_until_force(tfl_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a host could not remove is named, and the record that finds it there stays (exit 1, for
    `tfl rm` and `tfl prune`), unless `tfl rm --force`: removed here, it would be lost to tfl."""
    from launcher.engines.base import Cleanup
    from launcher.engines.local.backend import LocalBackend

    store = RunStore(tfl_home)
    add_run(store, "far", 30)
    left = Cleanup(removed=["gpu1:/c/far"], bytes_freed=4096, left=["gpu2: unreachable; left /c/far there"])
    monkeypatch.setattr(LocalBackend, "clean_recorded", lambda self, record: left)
    for command in (["rm", "far"], ["prune"]):
        held = runner.invoke(app, command)
        assert held.exit_code == 1, held.output
        lines = held.stdout.splitlines()
        assert lines[0].startswith("kept far: ") and "`tfl rm far` again" in lines[0] and "`tfl rm --force far`" in lines[0]
        assert lines[1:3] == ["  left: gpu2: unreachable; left /c/far there", "  removed: gpu1:/c/far (4.1 KB)"]
        assert lines[3].startswith("tfl: no run removed; 1 run(s) kept while their hosts still hold part of them")
        assert store.run_dir("far").exists() and active_ids(tfl_home) == []
    forced = runner.invoke(app, ["rm", "--force", "far"])
    assert forced.exit_code == 0, forced.output
    assert forced.stdout.splitlines()[1] == "  left: gpu2: unreachable; left /c/far there"  # said, then forgotten
    assert not store.run_dir("far").exists()


def test_a_dry_run_says_it_did_not_ask_the_hosts_the_real_prune_asks(tfl_home: Path) -> None:
    """`tfl prune --dry-run` said "would remove" a run on an SSH host that was down, which the real prune
    then kept (its host still holds part of it) with no word in the dry run that the hosts were not asked."""
    from launcher.describe.ports import free_port
    from tests.sshd import NOWHERE

    store = RunStore(tfl_home)
    task = {"task": "chief:0", "host": NOWHERE, "port": 1, "argv": ["python", "job.py"], "cwd": "/srv/r-ssh",
            "env": {"TFL_RUN_DIR": "/srv/r-ssh/tfl-runs/r-ssh"}, "log_path": "l", "progress_path": "p", "sync": [],
            "ssh": {"host": NOWHERE, "port": free_port(), "connect_timeout": 5.0}}
    ssh = add_run(store, "r-ssh", 10, plan={"run_id": "r-ssh", "run_dir": str(store.run_dir("r-ssh")), "job": "job.py",
                                            "job_args": [], "tasks": [task]})
    ssh.backend = "ssh"
    store.save(ssh)
    add_run(store, "r-local", 11)
    dry = runner.invoke(app, ["prune", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.splitlines()[-1].endswith("(dry run: nothing removed; 1 of them ran on SSH hosts, not asked now: "
                                                "the real prune keeps a run whose host does not answer)"), dry.stdout
    real = runner.invoke(app, ["prune"])
    assert real.exit_code == 1 and real.stdout.startswith("removed r-local") and "kept r-ssh" in real.stdout, real.output
    assert store.run_dir("r-ssh").exists() and not store.run_dir("r-local").exists()


def test_rm_names_the_jobs_own_model_dir_as_kept(tfl_home: Path, tmp_path: Path) -> None:
    """A model dir given as the job's own --model-dir was neither removed by `tfl rm` nor named: the user
    could not tell whether it went with the run. It is theirs: it stays, on a `kept:` line."""
    from launcher.describe.spec import parse_cluster
    from launcher.plan.build import build_plan

    store = RunStore(tfl_home)
    mine, cwd = tmp_path / "mine", tmp_path / "work"
    (cwd / "rel").mkdir(parents=True)
    mine.mkdir()
    for run_id, given in (("own", str(mine)), ("relative", "rel"), ("inside", str(store.run_dir("inside") / "m"))):
        plan = build_plan(parse_cluster({"cluster": {"chief": ["localhost:1000"]}}), "/j.py", ("--model-dir", given),
                          run_id=run_id, run_dir=str(store.run_dir(run_id)), python="/py", cwd=str(cwd))
        record = add_run(store, run_id, 1, plan=plan.to_dict())
        record.job_args = ["--model-dir", given]
        store.save(record)
    (store.run_dir("inside") / "m").mkdir()
    result = runner.invoke(app, ["rm", "own", "relative", "inside"])
    assert result.exit_code == 0, result.output
    kept = [line for line in result.stdout.splitlines() if line.startswith("  kept: ")]
    assert kept == [f"  kept: model dir {mine} (the job's --model-dir)",
                    f"  kept: model dir {cwd / 'rel'} (the job's --model-dir)"], result.stdout  # the one inside went
    assert mine.is_dir() and (cwd / "rel").is_dir() and not store.run_dir("inside").exists()
