"""Pure job-kit rules: steps per call, learning-rate scaling, the end-of-training exit order,
and the kit's import boundary (it imports nothing of the launcher but the contract)."""

from __future__ import annotations

import ast
import importlib
import logging
import re
import threading
from pathlib import Path
from typing import Any, NoReturn

import pytest

from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.execution import choose_steps_per_execution, largest_divisor_at_most, scaled_learning_rate, warmup_rate
from launcher.jobkit.finish import ARRIVED, BARRIER, LEFT, REPLY_GRACE_S, leave_together
from launcher.jobkit.finish import GO as GO_KEY
from tests.conftest import ROOT

# --- steps per call -----------------------------------------------------------------------


def test_steps_per_execution_keeps_a_call_near_the_target() -> None:
    # 2 ms steps: 100 per call at 0.2 s; 467 steps per epoch (a prime) has no divisor in 50..100, so 100 it is.
    assert choose_steps_per_execution(0.002, steps_per_epoch=467, backup_every_steps=None) == 100
    # 468 = 6 x 78: whole calls per epoch at 78 steps, which is more than half of 100.
    assert choose_steps_per_execution(0.002, steps_per_epoch=468, backup_every_steps=None) == 78
    # 500 steps per epoch: 100 divides it.
    assert choose_steps_per_execution(0.002, steps_per_epoch=500, backup_every_steps=None) == 100
    # 480: the largest divisor <= 100 is 96, close enough to keep epochs in whole calls.
    assert choose_steps_per_execution(0.002, steps_per_epoch=480, backup_every_steps=None) == 96
    # Slow steps: one per call, never 0.
    assert choose_steps_per_execution(1.5, steps_per_epoch=468, backup_every_steps=None) == 1
    # Tiny steps: capped, and never more than an epoch.
    assert choose_steps_per_execution(1e-6, steps_per_epoch=None, backup_every_steps=None) == 256
    assert choose_steps_per_execution(1e-6, steps_per_epoch=40, backup_every_steps=None) == 40


def test_steps_per_execution_divides_the_backup_interval_and_the_epoch() -> None:
    # Backups land only at the end of a call, so a call must end on every backup step, in
    # every epoch: the value divides both (calls start afresh at each epoch).
    assert choose_steps_per_execution(0.002, steps_per_epoch=500, backup_every_steps=150) == 50
    assert choose_steps_per_execution(0.002, steps_per_epoch=468, backup_every_steps=150) == 6
    assert choose_steps_per_execution(0.002, steps_per_epoch=468, backup_every_steps=97) == 1
    assert choose_steps_per_execution(0.01, steps_per_epoch=None, backup_every_steps=10) == 10
    assert choose_steps_per_execution(0.0001, steps_per_epoch=60, backup_every_steps=10) == 10


def test_largest_divisor_and_bad_measures() -> None:
    assert [largest_divisor_at_most(468, b) for b in (1, 5, 100, 1000)] == [1, 4, 78, 468]
    with pytest.raises(JobKitError, match="measured step time is 0"):
        choose_steps_per_execution(0.0, steps_per_epoch=10, backup_every_steps=None)


# --- learning rate -------------------------------------------------------------------------


def test_linear_scaling_and_warmup() -> None:
    assert scaled_learning_rate(1e-3, 4, "linear") == pytest.approx(4e-3)
    assert scaled_learning_rate(1e-3, 4, "none") == 1e-3
    with pytest.raises(JobKitError, match="scaling 'sqrt' is not known; expected one of none, linear"):
        scaled_learning_rate(1e-3, 4, "sqrt")
    rates = [warmup_rate(step, base=1e-3, peak=4e-3, warmup_steps=3) for step in range(5)]
    assert rates == pytest.approx([1e-3, 2e-3, 3e-3, 4e-3, 4e-3])
    assert warmup_rate(0, base=1e-3, peak=4e-3, warmup_steps=0) == 4e-3


# --- the end of training: the chief leaves last -----------------------------------------------


class FakeCoordination:
    """Records the calls a task makes on the coordination service's key-value store."""

    def __init__(self, events: list[str], who: str, fail_get: bool = False) -> None:
        self.events, self.who, self.fail_get = events, who, fail_get

    def set_config_key_value(self, key: str, value: str) -> None:
        self.events.append(f"{self.who} set {key}")

    def get_config_key_value(self, key: str, timeout_in_ms: int) -> str:
        self.events.append(f"{self.who} got {key}")
        if self.fail_get:
            raise TimeoutError("a peer never came")
        return "1"


class Left(Exception):
    pass


def leaver(events: list[str], who: str) -> NoReturn:
    events.append(f"{who} left")
    raise Left


CLUSTER = {"chief": ("h:1",), "worker": ("h:2", "h:3")}
AT, GO, GONE = f"{BARRIER}{ARRIVED}", f"{BARRIER}{GO_KEY}", f"{BARRIER}{LEFT}"


def test_a_worker_arrives_waits_for_the_go_says_it_is_leaving_then_leaves() -> None:
    events: list[str] = []
    with pytest.raises(Left):
        leave_together(TaskContext("worker", 1, CLUSTER), FakeCoordination(events, "w1"), barrier_timeout_s=1,
                       leave=lambda: leaver(events, "w1"))
    assert events == [f"w1 set {AT}worker:1", f"w1 got {GO}", f"w1 set {GONE}worker:1", "w1 left"]


def test_the_chief_says_go_when_all_arrived_and_leaves_after_hearing_from_every_worker() -> None:
    # The old finish() left right after the barrier: the chief hosts the coordination
    # service, so a worker whose barrier reply was not out yet fell to the slow path.
    events: list[str] = []
    with pytest.raises(Left):
        leave_together(TaskContext("chief", 0, CLUSTER), FakeCoordination(events, "c"), barrier_timeout_s=1,
                       leave=lambda: leaver(events, "c"), sleep=lambda s: events.append(f"c sleeps {s}"))
    assert events == [f"c got {AT}worker:0", f"c got {AT}worker:1", f"c set {GO}",
                      f"c got {GONE}worker:0", f"c got {GONE}worker:1", f"c sleeps {REPLY_GRACE_S}", "c left"]


def test_a_peer_that_never_comes_sends_the_task_the_slow_way(capsys: pytest.CaptureFixture[str]) -> None:
    events: list[str] = []
    leave_together(TaskContext("chief", 0, CLUSTER), FakeCoordination(events, "c", fail_get=True),
                   barrier_timeout_s=1, leave=lambda: leaver(events, "c"))
    assert events == [f"c got {AT}worker:0"]
    out = capsys.readouterr().out
    assert "not every training task reached the end (TimeoutError after " in out
    # What the task was doing is said, so that a failed meeting can be told apart from another.
    assert "s, chief:0 waiting for worker:0 to arrive: a peer never came); exiting the slow way" in out


def test_a_worker_whose_go_never_comes_says_its_arrival_was_answered(capsys: pytest.CaptureFixture[str]) -> None:
    events: list[str] = []
    leave_together(TaskContext("worker", 1, CLUSTER), FakeCoordination(events, "w1", fail_get=True),
                   barrier_timeout_s=1, leave=lambda: leaver(events, "w1"))
    assert events == [f"w1 set {AT}worker:1", f"w1 got {GO}"]
    out = capsys.readouterr().out
    assert re.search(r"worker:1 waiting for the chief's go \(its arrival said after \d+\.\d\d s\): a peer never came\)", out), out


def test_a_worker_whose_goodbye_goes_unanswered_says_so_and_leaves(capsys: pytest.CaptureFixture[str]) -> None:
    events: list[str] = []

    class ChiefGone(FakeCoordination):
        def set_config_key_value(self, key: str, value: str) -> None:
            super().set_config_key_value(key, value)
            if key.startswith(GONE):
                raise ConnectionError("the chief left before its service answered")

    with pytest.raises(Left):
        leave_together(TaskContext("worker", 0, CLUSTER), ChiefGone(events, "w0"), barrier_timeout_s=1,
                       leave=lambda: leaver(events, "w0"))
    assert events[-2:] == [f"w0 set {GONE}worker:0", "w0 left"]
    assert "jobkit: worker:0 got no answer from the chief (ConnectionError); it leaves anyway" in capsys.readouterr().out


def test_a_leaving_worker_flushes_the_log_handlers_and_closes_none() -> None:
    """The CI run's lesson: logging.shutdown() here closed absl's handler, which closes a stream
    not its own (pytest's capture file, in the suite's worker), and every later test failed."""
    seen: list[str] = []

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None: ...
        def flush(self) -> None:
            seen.append("flushed")

        def close(self) -> None:
            seen.append("closed")
            super().close()

    handler = Handler()
    logger = logging.getLogger("tfl-test-finish-flush")
    logger.addHandler(handler)
    try:
        with pytest.raises(Left):
            leave_together(TaskContext("worker", 1, CLUSTER), FakeCoordination([], "w1"), barrier_timeout_s=1,
                           leave=lambda: leaver([], "w1"))
    finally:
        logger.removeHandler(handler)
    assert seen == ["flushed"]


class FailedPrecondition(Exception):
    pass


class Service:
    """The coordination service as the tasks see it at the end of a loaded run: every agent has
    gone into ERROR (a late heartbeat), so the service's barrier refuses them at once
    (FailedPrecondition, issue 26), while its key-value store answers as ever."""

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.changed = threading.Condition()
        self.order: list[str] = []  # who set what, and who left, in the order it happened

    def agent(self, who: str) -> Any:
        service = self

        class Agent:
            def wait_at_barrier(self, barrier_id: str, timeout_in_ms: int) -> None:
                raise FailedPrecondition("Agent must be in CONNECTED state. It is currently in ERROR.")

            def set_config_key_value(self, key: str, value: str) -> None:
                with service.changed:
                    service.keys[key] = value
                    service.order.append(f"{who} set {key}")
                    service.changed.notify_all()

            def get_config_key_value(self, key: str, timeout_in_ms: int) -> str:
                with service.changed:
                    if not service.changed.wait_for(lambda: key in service.keys, timeout_in_ms / 1000):
                        raise TimeoutError(key)
                    return service.keys[key]

        return Agent()

    def leave(self, who: str) -> NoReturn:
        with self.changed:
            self.order.append(f"{who} left")
        raise Left


def run_tasks(service: Service, tasks: list[TaskContext], timeout_s: float) -> dict[str, str]:
    """Each task's leave_together in a thread of its own; how each one ended."""
    ended: dict[str, str] = {}

    def run(context: TaskContext) -> None:
        who = f"{context.task_type}:{context.task_index}"
        try:
            leave_together(context, service.agent(who), barrier_timeout_s=timeout_s, errors=(TimeoutError, FailedPrecondition),
                           leave=lambda: service.leave(who), sleep=lambda s: None)
            ended[who] = "slow way"
        except Left:
            ended[who] = "left"

    threads = [threading.Thread(target=run, args=(context,), daemon=True) for context in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)  # a hang guard
    assert not any(thread.is_alive() for thread in threads)
    return ended


def test_tasks_whose_agents_are_in_error_still_leave_together_the_chief_last(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 26: on a loaded machine the chief's barrier failed at once (FailedPreconditionError),
    # so the chief left the slow way and before the worker. The meeting needs only the store.
    # The chief's wait for each goodbye: a hang guard here, not a clock (the module, not jobkit.finish the function).
    monkeypatch.setattr(importlib.import_module("launcher.jobkit.finish"), "LEFT_SEND_S", 60.0)
    service = Service()
    tasks = [TaskContext("worker", 1, CLUSTER), TaskContext("chief", 0, CLUSTER), TaskContext("worker", 0, CLUSTER)]
    assert run_tasks(service, tasks, timeout_s=30) == {"chief:0": "left", "worker:0": "left", "worker:1": "left"}
    order = service.order
    go, chief_left = order.index(f"chief:0 set {GO}"), order.index("chief:0 left")
    for worker in ("worker:0", "worker:1"):
        # It arrived before the go, said it was leaving after the go, and the chief left after hearing it.
        assert order.index(f"{worker} set {AT}{worker}") < go < order.index(f"{worker} set {GONE}{worker}") < chief_left
        assert order.index(f"{worker} set {GONE}{worker}") < order.index(f"{worker} left")


def test_a_worker_that_never_comes_sends_the_others_the_slow_way() -> None:
    service = Service()
    tasks = [TaskContext("chief", 0, CLUSTER), TaskContext("worker", 0, CLUSTER)]  # worker:1 died
    assert run_tasks(service, tasks, timeout_s=0.2) == {"chief:0": "slow way", "worker:0": "slow way"}
    assert f"chief:0 set {GO}" not in service.order


# --- the kit's import boundary ---------------------------------------------------------------


def test_the_kit_imports_only_the_contract_from_the_launcher() -> None:
    for path in sorted((ROOT / "launcher" / "jobkit").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name == "launcher" and isinstance(node, ast.ImportFrom):
                    assert {a.name for a in node.names} <= {"contract", "jobkit"}, f"{path.name}: {ast.unparse(node)}"
                elif name.startswith("launcher."):
                    assert name == "launcher.contract" or name.startswith("launcher.jobkit"), \
                        f"{Path(path).name} imports {name}: the kit may use only launcher.contract"
