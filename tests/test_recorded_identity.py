"""A recorded run reaches its hosts with the settings of its record: when its identity file is gone,
`tfl rm` / `tfl stop` said "fix ssh.identity_file in the cluster file", which a recorded run never reads
again. Nothing connects: the key is checked before any socket opens."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.states import RunState
from launcher.records.store import RunRecord, RunStore
from tests.sshd import NOWHERE

runner = CliRunner()


def ssh_run(store: RunStore, key: Path, state: RunState = RunState.SUCCEEDED) -> None:
    ssh = {"host": NOWHERE, "port": 1, "identity_file": str(key), "connect_timeout": 5.0}
    task = {"task": "chief:0", "host": NOWHERE, "port": 1, "argv": ["python", "job.py"], "cwd": "/srv/r-key",
            "env": {"TFL_RUN_DIR": "/srv/r-key/tfl-runs/r-key"}, "log_path": "l", "progress_path": "p", "sync": [],
            "ssh": ssh}
    run_dir = store.run_dir("r-key")
    store.create(RunRecord(run_id="r-key", job="job.py", job_args=[], run_dir=str(run_dir), created=1.0, ended=2.0,
                           state=state, backend="ssh", launcher_pid=2**22 + 1,
                           plan={"run_id": "r-key", "run_dir": str(run_dir), "job": "job.py", "job_args": [],
                                 "tasks": [task]}))


def test_rm_of_a_run_whose_key_is_gone_says_to_put_it_back_not_to_fix_the_cluster_file(tfl_home: Path,
                                                                                     tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"  # deleted since the launch
    ssh_run(RunStore(tfl_home), key)
    result = runner.invoke(app, ["rm", "r-key"])
    assert result.exit_code == 1, result.output  # its host still holds its dirs: the record stays
    left = [line for line in result.stdout.splitlines() if line.startswith("  left: ")]
    assert left == [f"  left: {NOWHERE}: identity file {key} not found (the run was launched with it and its record "
                    f"names it: put the key back there); left /srv/r-key there"], result.stdout
    assert "cluster file" not in result.stdout


def test_resume_of_a_run_whose_key_is_gone_says_to_put_it_back_not_to_fix_the_cluster_file(tfl_home: Path,
                                                                                         tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"  # deleted since the launch
    ssh_run(RunStore(tfl_home), key, RunState.FAILED)
    for detach in ([], ["--detach"]):
        result = runner.invoke(app, ["resume", "r-key", *detach])
        assert result.exit_code == 2, result.output
        assert result.stderr == (f"tfl: error: run r-key: {NOWHERE}: identity file {key} not found (the run was launched "
                                 "with it and its record names it: put the key back there)\n")
    assert RunStore(tfl_home).load("r-key").state == RunState.FAILED  # refused: not claimed, no attempt spent
