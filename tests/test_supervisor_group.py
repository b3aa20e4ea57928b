"""The supervisor with a backend that runs the group as one unit (backends.base.GroupBackend,
as Slurm's batch script does): scripted backend, fake clock."""

from __future__ import annotations

import signal
from pathlib import Path

from launcher.engines.registry import GroupBackend, TaskProcess
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord
from tests.test_supervisor import FakeBackend, FakeClock, make, states

NODES = {"chief:0": "n1", "worker:0": "n2", "evaluator:0": "n1"}


class FakeGroup(FakeBackend):
    """Its 'batch script' ends the other training tasks when one fails and restarts the group
    while ``max_restarts`` allows; the supervisor learns that after ``unknown_polls`` asks."""

    def __init__(self, clock: FakeClock, exits: dict[str, list[tuple[float, int] | None]], max_restarts: int,
                 ended_by: str | None = None, unknown_polls: int = 2) -> None:
        super().__init__(clock, exits)
        self.max_restarts, self.ended_by, self.unknown = max_restarts, ended_by, unknown_polls
        self.asked: list[int] = []
        self.failed_attempts: set[int] = set()

    def poll(self, proc: TaskProcess) -> int | None:
        proc.host = NODES[proc.launch.name]
        code = super().poll(proc)
        if code not in (None, 0) and proc.launch.task.is_training:
            self.failed_attempts.add(proc.attempt)
            proc.ended_by = self.ended_by
        return code

    def alive(self, proc: TaskProcess) -> bool:
        if proc.launch.task.is_training and proc.attempt in self.failed_attempts:
            return False  # the unit's own policy ended the group
        return super().alive(proc)

    def run_data(self) -> dict[str, str]:
        return {"job_id": "42"}

    def restarted(self, attempt: int) -> bool | None:
        self.asked.append(attempt)
        if len(self.asked) <= self.unknown:
            return None
        return attempt < self.max_restarts

    def describe(self, record: RunRecord) -> dict[str, str]:
        return {"job": "42"}


def test_fake_group_is_a_group_backend() -> None:
    assert isinstance(FakeGroup(FakeClock(), {}, 0), GroupBackend)
    assert not isinstance(FakeBackend(FakeClock(), {}), GroupBackend)


def test_the_unit_restarts_its_training_group_and_the_evaluator_runs_on(tmp_path: Path) -> None:
    exits: dict[str, list[tuple[float, int] | None]] = {
        "chief:0": [None, (4, 0)], "worker:0": [(2, 3), (3, 0)], "evaluator:0": [(30, 0)]}
    sup, backend, _, store = make(tmp_path, lambda c: FakeGroup(c, exits, max_restarts=1), max_restarts=1)
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and record.attempt == 1
    assert backend.started == [("chief:0", 0), ("worker:0", 0), ("evaluator:0", 0), ("chief:0", 1), ("worker:0", 1)]
    assert backend.signals == []  # the supervisor stopped nothing: the unit did
    assert [r.reason for r in record.restarts] == ["worker:0 on n2: exit code 3"]
    assert record.stopped_because_of_failure == ["chief:0"]
    assert store.load("r").backend_data == {"job_id": "42"}
    assert {t.task: (t.host, t.attempt) for t in record.tasks} == {
        "chief:0": ("n1", 1), "worker:0": ("n2", 1), "evaluator:0": ("n1", 0)}
    assert states(sup) == {"chief:0": TaskState.SUCCEEDED, "worker:0": TaskState.SUCCEEDED, "evaluator:0": TaskState.SUCCEEDED}
    assert backend.asked == [0, 0, 0]  # asked until the unit knew


def test_no_restart_left_fails_with_the_units_reason(tmp_path: Path) -> None:
    exits: dict[str, list[tuple[float, int] | None]] = {"worker:0": [(2, -9)]}
    sup, backend, _, _ = make(tmp_path, lambda c: FakeGroup(c, exits, max_restarts=0, ended_by="node n2 failed: NODE_FAIL"),
                              max_restarts=0)
    record = sup.run()
    assert record.state == RunState.FAILED
    assert record.message == "worker:0 on n2 failed: node n2 failed: NODE_FAIL"
    assert record.failures[0].host == "n2" and record.failures[0].reason == "node n2 failed: NODE_FAIL"
    # the training group was ended by the unit; only the evaluator, still alive, was stopped by tfl
    assert [(name, sig) for name, sig, _ in backend.signals] == [("evaluator:0", signal.SIGTERM)]
    assert states(sup) == {"chief:0": TaskState.STOPPED, "worker:0": TaskState.FAILED, "evaluator:0": TaskState.STOPPED}


def test_stop_while_waiting_for_the_units_answer(tmp_path: Path) -> None:
    exits: dict[str, list[tuple[float, int] | None]] = {"worker:0": [(2, 3)]}
    sup, backend, clock, _ = make(tmp_path, lambda c: FakeGroup(c, exits, max_restarts=1, unknown_polls=10**9), max_restarts=1)
    original = backend.restarted

    def restarted(attempt: int) -> bool | None:
        if clock.now > 5:
            sup.request_stop()
        return original(attempt)
    backend.restarted = restarted  # type: ignore[method-assign]
    record = sup.run()
    assert record.state == RunState.FAILED and record.restarts == []
