"""Pure job-kit rules: steps per call, learning-rate scaling, the end-of-training exit order,
and the kit's import boundary (it imports nothing of the launcher but the contract)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NoReturn

import pytest

from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.execution import choose_steps_per_execution, largest_divisor_at_most, scaled_learning_rate, warmup_rate
from launcher.jobkit.finish import BARRIER, LEFT_KEY, REPLY_GRACE_S, leave_together
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
    """Records the calls a task makes on the coordination service, and when it leaves."""

    def __init__(self, events: list[str], who: str, fail_barrier: bool = False) -> None:
        self.events, self.who, self.fail_barrier = events, who, fail_barrier
        self.keys: dict[str, str] = {}

    def wait_at_barrier(self, barrier_id: str, timeout_in_ms: int) -> None:
        self.events.append(f"{self.who} barrier {barrier_id}")
        if self.fail_barrier:
            raise RuntimeError("a peer is gone")

    def set_config_key_value(self, key: str, value: str) -> None:
        self.events.append(f"{self.who} set {key}")

    def get_config_key_value(self, key: str, timeout_in_ms: int) -> str:
        self.events.append(f"{self.who} got {key}")
        return "1"


class Left(Exception):
    pass


def leaver(events: list[str], who: str) -> NoReturn:
    events.append(f"{who} left")
    raise Left


CLUSTER = {"chief": ("h:1",), "worker": ("h:2", "h:3")}


def test_a_worker_says_it_is_leaving_then_leaves() -> None:
    events: list[str] = []
    with pytest.raises(Left):
        leave_together(TaskContext("worker", 1, CLUSTER), FakeCoordination(events, "w1"), barrier_timeout_s=1,
                       leave=lambda: leaver(events, "w1"))
    assert events == [f"w1 barrier {BARRIER}", f"w1 set {LEFT_KEY}worker:1", "w1 left"]


def test_the_chief_leaves_after_hearing_from_every_worker() -> None:
    # The old finish() left right after the barrier: the chief hosts the coordination
    # service, so a worker whose barrier reply was not out yet fell to the slow path.
    events: list[str] = []
    with pytest.raises(Left):
        leave_together(TaskContext("chief", 0, CLUSTER), FakeCoordination(events, "c"), barrier_timeout_s=1,
                       leave=lambda: leaver(events, "c"), sleep=lambda s: events.append(f"c sleeps {s}"))
    assert events == [f"c barrier {BARRIER}", f"c got {LEFT_KEY}worker:0", f"c got {LEFT_KEY}worker:1",
                      f"c sleeps {REPLY_GRACE_S}", "c left"]


def test_a_failed_barrier_returns_for_the_slow_way(capsys: pytest.CaptureFixture[str]) -> None:
    events: list[str] = []
    leave_together(TaskContext("chief", 0, CLUSTER), FakeCoordination(events, "c", fail_barrier=True),
                   barrier_timeout_s=1, leave=lambda: leaver(events, "c"))
    assert events == [f"c barrier {BARRIER}"]
    assert "not every training task reached the end (RuntimeError)" in capsys.readouterr().out


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
