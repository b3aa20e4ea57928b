"""The run record's own loader: a round trip keeps everything; anything else is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.errors import UnreadableRunError
from launcher.records.states import RunState, TaskState
from launcher.records.store import FailureRecord, RestartRecord, RunRecord, RunStore, TaskRecord, id_safe


def record(run_dir: Path) -> RunRecord:
    task = TaskRecord(task="chief:0", host="localhost", backend="local", log_path="l", progress_path="p",
                      state=TaskState.FAILED, pid=12, create_time=3.5, started=4.0, ended=5.0, exit_code=-9)
    return RunRecord(run_id="r", job="j.py", job_args=["--x", "1"], run_dir=str(run_dir), created=1.0,
                     state=RunState.FAILED, tasks=[task], plan={"tasks": [{"name": "chief:0"}]},
                     failures=[FailureRecord(task="chief:0", host="localhost", pid=12, exit_code=-9, reason="killed by SIGKILL",
                                             log_tail=["a", "b"], time=5.0, attempt=0)],
                     restarts=[RestartRecord(attempt=1, time=6.0, reason="chief:0 killed by SIGKILL")])


def test_round_trip(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    original = record(store.run_dir("r"))
    store.create(original)
    loaded = store.load("r")
    assert loaded == original
    assert loaded.state is RunState.FAILED and loaded.tasks[0].state is TaskState.FAILED
    assert isinstance(loaded.created, float) and isinstance(loaded.tasks[0], TaskRecord)


@pytest.mark.parametrize("change, where", [
    (lambda d: d.update(extra=1), "unknown keys ['extra']"),
    (lambda d: d.pop("run_id"), "missing"),
    (lambda d: d.update(state="exploded"), "'exploded' is not a valid RunState"),
    (lambda d: d["tasks"][0].update(pid="12"), "record.tasks[0].pid: expected int, got str"),
    (lambda d: d.update(job_args="--x"), "record.job_args: expected a list"),
    (lambda d: d.update(attempt=True), "record.attempt: expected int, got bool"),
])
def test_refuses_what_is_not_a_record(tmp_path: Path, change: object, where: str) -> None:
    data = json.loads(record(tmp_path).to_json())
    change(data)  # type: ignore[operator]
    with pytest.raises(ValueError, match=where.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        RunRecord.from_json(json.dumps(data))


def test_store_names_unreadable_records(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    store.create(record(store.run_dir("good")))
    (store.run_dir("bad")).mkdir(parents=True)
    (store.run_dir("bad") / "state.json").write_text('{"run_id": "bad"}')
    assert [r.run_id for r in store.list()] == ["r"]  # the good one (its id is the record's)
    records, unreadable = store.scan()
    assert [r.run_id for r in records] == ["r"] and [u.run_id for u in unreadable] == ["bad"]
    assert "state.json cannot be read: record: " in unreadable[0].reason
    with pytest.raises(UnreadableRunError, match="is not a tfl run record this tfl can read"):
        store.load("bad")


@pytest.mark.parametrize(("job", "head"), [("mnist", "mnist"), ("my job", "my-job"), ("ü-jöb;rm -rf ~", "j-b-rm-rf"),
                                           ("--help", "help"), ("train_v2.1", "train_v2.1"), ("...", "job"), ("$(id)", "id")])
def test_a_run_id_is_made_of_characters_every_shell_and_engine_takes(tmp_path: Path, job: str, head: str) -> None:
    assert id_safe(job) == head
    run_id = RunStore(tmp_path).new_run_id(job)
    assert run_id.startswith(f"{head}-") and all(c.isascii() and (c.isalnum() or c in "_.-") for c in run_id), run_id
    assert run_id[0].isalnum()
