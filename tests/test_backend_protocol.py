"""The commands drive a backend only through the protocol: a fake one, no processes.

`tfl launch`, `status`, `logs` and `stop` run end to end against ``tests.fake_backend``;
if a command named a backend or went around the interface, these runs would fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
from typer.testing import CliRunner

from launcher.engines import registry
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunStore
from tests import fake_backend

runner = CliRunner()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tfl_home: Path, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.setitem(registry.BACKENDS, "fake", "tests.fake_backend:FakeBackend")
    monkeypatch.setattr(registry, "name_for_plan", lambda plan: "fake")
    fake_backend.CALLS.clear()
    fake_backend.EXIT_CODES.clear()
    job = tmp_path / "job.py"
    job.write_text("raise SystemExit('never run: the fake backend starts no process')\n")
    yield job


def test_launch_status_logs_stop_through_the_protocol(fake: Path, tfl_home: Path) -> None:
    result = runner.invoke(app(), ["launch", str(fake), "--local", "2"])
    assert result.exit_code == 0, result.output
    assert fake_backend.CALLS[:3] == ["prepare", "probe quick=True", "start chief:0"]
    assert "start worker:0" in fake_backend.CALLS and fake_backend.CALLS[-1] == "close"
    assert "[chief:0]  hello from chief:0" in result.stdout and "[worker:0] bye from worker:0" in result.stdout

    store = RunStore(tfl_home)
    (record,) = store.list()
    assert record.backend == "fake" and record.state == RunState.SUCCEEDED

    view = json.loads(runner.invoke(app(), ["status", record.run_id, "--json"]).stdout)
    assert fake_backend.CALLS[-1] == "inspect ask=True"
    assert [(t["task"], t["rss_mb"], t["cpu_percent"]) for t in view["tasks"]] == [("chief:0", 64.0, 12.5), ("worker:0", 64.0, 12.5)]
    calls = len(fake_backend.CALLS)
    runner.invoke(app(), ["status"])
    assert len(fake_backend.CALLS) == calls  # a finished run is listed from its record alone

    logs = runner.invoke(app(), ["logs", record.run_id, "--task", "worker:0"])
    assert logs.exit_code == 0 and logs.stdout.splitlines() == ["[worker:0] hello from worker:0", "[worker:0] bye from worker:0"]

    # A run whose launcher is gone, tasks recorded as running: stop asks the backend.
    record.state, record.launcher_pid = RunState.RUNNING, None
    for task in record.tasks:
        task.state = TaskState.RUNNING
    store.save(record)
    runner.invoke(app(), ["status"])
    assert fake_backend.CALLS[-1] == "inspect ask=False"
    stopped = runner.invoke(app(), ["stop", record.run_id])
    assert stopped.exit_code == 0 and "stopped 2 process(es) left by a launcher that was gone" in stopped.stdout
    assert fake_backend.CALLS[-1] == "stop_recorded 2"
    assert store.load(record.run_id).state == RunState.STOPPED
    again = runner.invoke(app(), ["stop", record.run_id])
    assert again.exit_code == 0 and "already stopped; nothing to stop" in again.stdout
    removed = runner.invoke(app(), ["rm", record.run_id])
    assert removed.exit_code == 0 and fake_backend.CALLS[-1] == "clean_recorded" and not store.run_dir(record.run_id).exists()


def test_a_failed_task_is_a_result_and_stops_the_rest(fake: Path, tfl_home: Path) -> None:
    fake_backend.EXIT_CODES["worker:0"] = 3
    result = runner.invoke(app(), ["launch", str(fake), "--local", "2"])
    assert result.exit_code == 1
    assert "root cause: worker:0 on 127.0.0.1" in result.stderr and "exit code 3" in result.stderr
    (record,) = RunStore(tfl_home).list()
    assert record.state == RunState.FAILED and record.failures[0].task == "worker:0"


def test_doctor_asks_the_backend(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "name_for", lambda hosts: "fake")
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]}}))
    result = runner.invoke(app(), ["doctor", "--cluster", str(cluster)])
    assert result.exit_code == 0 and "localhost  OK    fake: ready" in result.stdout
    assert fake_backend.CALLS == ["probe quick=False", "close"]


def app():  # type: ignore[no-untyped-def]
    from launcher.cli import app as tfl

    return tfl
