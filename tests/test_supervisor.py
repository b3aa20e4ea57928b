"""The supervisor's state machine, driven by a scripted backend and a fake clock."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Callable

import pytest

from launcher.contract import TEARDOWN_SIGNAL
from launcher.describe.spec import parse_cluster
from launcher.engines.registry import TaskProcess
from launcher.errors import LaunchError
from launcher.plan.build import build_plan
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.run_options import SupervisorConfig
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord, RunStore
from launcher.supervise.supervisor import Supervisor, initial_record
from launcher.views.report import summary

TEARDOWN = signal.Signals[TEARDOWN_SIGNAL]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.001)


class FakeBackend:
    """Each task exits with ``exits[name][attempt] = (at, code)``; None runs until signalled.

    ``ignores_term`` tasks survive SIGTERM and TEARDOWN (only SIGKILL ends them).
    """

    concurrent_start = False

    def __init__(self, clock: FakeClock, exits: dict[str, list[tuple[float, int] | None]],
                 ignores_term: frozenset[str] = frozenset(), fail_start: str | None = None) -> None:
        self.clock, self.exits, self.ignores_term, self.fail_start = clock, exits, ignores_term, fail_start
        self.signals: list[tuple[str, int, float]] = []
        self.started: list[tuple[str, int]] = []
        self._dead: dict[int, int] = {}
        self._started_at: dict[int, float] = {}
        self._next_pid = 100

    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        if launch.name == self.fail_start:
            raise LaunchError(f"{launch.name}: cannot start")
        self._next_pid += 1
        self.started.append((launch.name, attempt))
        self._started_at[self._next_pid] = self.clock.now
        return TaskProcess(launch=launch, attempt=attempt, pid=self._next_pid, create_time=1.0, pgid=self._next_pid)

    def poll(self, proc: TaskProcess) -> int | None:
        if proc.pid in self._dead:
            return self._dead[proc.pid]
        script = self.exits.get(proc.launch.name, [])
        planned = script[proc.attempt] if proc.attempt < len(script) else None
        if planned and self.clock.now - self._started_at[proc.pid] >= planned[0]:
            self._dead[proc.pid] = planned[1]
            return planned[1]
        return None

    def signal(self, proc: TaskProcess, signum: int) -> None:
        self.signals.append((proc.launch.name, signum, self.clock.now))
        if self.poll(proc) is None and not (signum != signal.SIGKILL and proc.launch.name in self.ignores_term):
            self._dead[proc.pid] = -signum

    def alive(self, proc: TaskProcess) -> bool:
        return self.poll(proc) is None

    def close(self) -> None:
        pass


def make(tmp_path: Path, backend_of: Callable[[FakeClock], FakeBackend], evaluator: bool = True,
         **config: object) -> tuple[Supervisor, FakeBackend, FakeClock, RunStore]:
    cluster = {"chief": ["localhost:1"], "worker": ["localhost:2"]}
    if evaluator:
        cluster["evaluator"] = ["localhost:3"]
    store = RunStore(tmp_path)
    plan: LaunchPlan = build_plan(parse_cluster({"cluster": cluster}), "/job.py", (), run_id="r",
                                  run_dir=str(tmp_path / "runs" / "r"), python="py", cwd="/")
    record = initial_record(plan, created=0.0, max_restarts=int(config.get("max_restarts", 0)), backend="fake")  # type: ignore[arg-type]
    store.create(record)
    clock = FakeClock()
    backend = backend_of(clock)
    sup = Supervisor(plan, record, store, SupervisorConfig(**config), backend=backend,  # type: ignore[arg-type]
                     clock=clock, wall=clock, wait=clock.sleep)
    return sup, backend, clock, store


def states(sup: Supervisor) -> dict[str, TaskState]:
    return {t.task: t.state for t in sup.record.tasks}


def test_success_waits_for_evaluator(tmp_path: Path) -> None:
    sup, backend, clock, store = make(tmp_path, lambda c: FakeBackend(c, {
        "chief:0": [(10, 0)], "worker:0": [(9, 0)], "evaluator:0": [(15, 0)]}))
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and record.exit_code == 0
    assert states(sup) == {"chief:0": TaskState.SUCCEEDED, "worker:0": TaskState.SUCCEEDED, "evaluator:0": TaskState.SUCCEEDED}
    assert clock.now >= 15 and backend.signals == []
    assert store.load("r").state == RunState.SUCCEEDED


def test_training_failure_stops_the_rest_at_once(tmp_path: Path) -> None:
    sup, backend, clock, _ = make(tmp_path, lambda c: FakeBackend(c, {"worker:0": [(5, 3)]}))
    record = sup.run()
    assert record.state == RunState.FAILED and record.exit_code == 1
    assert record.failures[0].task == "worker:0" and record.failures[0].reason == "exit code 3"
    assert record.stopped_because_of_failure == ["chief:0", "evaluator:0"]
    assert states(sup) == {"chief:0": TaskState.STOPPED, "worker:0": TaskState.FAILED, "evaluator:0": TaskState.STOPPED}
    # The teardown signal, not the notice (SIGTERM: a training task would wait for an agreement the
    # dead worker cannot join), went out within one poll interval of the death, long before TF's ~14 s heartbeat.
    assert sorted((name, sig) for name, sig, _ in backend.signals) == [("chief:0", TEARDOWN), ("evaluator:0", TEARDOWN)]
    assert max(t for _, _, t in backend.signals) - 5 <= SupervisorConfig().poll_interval + 0.01


def test_sigkill_after_grace_when_sigterm_is_ignored(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: FakeBackend(c, {"worker:0": [(1, 1)]}, ignores_term=frozenset({"chief:0"})),
                              evaluator=False, grace_period=3.0)
    sup.run()
    chief = [(sig, t) for name, sig, t in backend.signals if name == "chief:0"]
    assert [s for s, _ in chief] == [TEARDOWN, signal.SIGKILL]
    assert chief[1][1] - chief[0][1] == pytest.approx(3.0, abs=0.1)
    assert sup.record.task("chief:0").exit_code == -signal.SIGKILL


def test_restart_then_success(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: FakeBackend(c, {
        "chief:0": [None, (4, 0)], "worker:0": [(2, -9), (3, 0)], "evaluator:0": [None, (5, 0)]}), max_restarts=2)
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and record.attempt == 1
    assert [r.reason for r in record.restarts] == ["worker:0 on localhost: killed by SIGKILL"]
    assert backend.started == [("chief:0", 0), ("worker:0", 0), ("evaluator:0", 0), ("chief:0", 1), ("worker:0", 1), ("evaluator:0", 1)]
    assert all(t.attempt == 1 for t in record.tasks)


def test_restarts_exhausted(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: FakeBackend(c, {"chief:0": [(1, 2), (1, 2)]}), max_restarts=1, evaluator=False)
    record = sup.run()
    assert record.state == RunState.FAILED and len(record.restarts) == 1 and record.attempt == 1
    assert [f.attempt for f in record.failures] == [0, 1]


def test_retry_on_preemption_only(tmp_path: Path) -> None:
    sup, _, _, _ = make(tmp_path, lambda c: FakeBackend(c, {"chief:0": [(1, 143), (1, 5), (1, 0)]}), evaluator=False,
                        max_restarts=5, retry_on="preemption")
    record = sup.run()
    assert record.state == RunState.FAILED and len(record.restarts) == 1  # 143 retried, 5 not


def test_evaluator_failure_does_not_stop_training(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: FakeBackend(c, {
        "chief:0": [(10, 0)], "worker:0": [(10, 0)], "evaluator:0": [(1, 1)]}))
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and backend.signals == []
    assert [f.task for f in record.failures] == ["evaluator:0"]


def test_evaluator_timeout_after_training(tmp_path: Path) -> None:
    sup, backend, clock, _ = make(tmp_path, lambda c: FakeBackend(c, {"chief:0": [(1, 0)], "worker:0": [(1, 0)]}),
                                  evaluator_timeout=30.0)
    record = sup.run()
    assert record.state == RunState.SUCCEEDED
    assert record.task("evaluator:0").state == TaskState.STOPPED
    assert [(n, s) for n, s, _ in backend.signals] == [("evaluator:0", signal.SIGTERM)]
    assert 30 <= backend.signals[0][2] <= 31.1


def test_stop_request(tmp_path: Path) -> None:
    holder: dict[str, Supervisor] = {}

    class StopAt(FakeBackend):
        def poll(self, proc: TaskProcess) -> int | None:
            if self.clock.now > 7 and not holder["s"]._stop_requested:
                holder["s"].request_stop()
            return super().poll(proc)

    sup, backend, _, _ = make(tmp_path, lambda c: StopAt(c, {}), max_restarts=3)
    holder["s"] = sup
    record = sup.run()
    assert record.state == RunState.STOPPED and record.exit_code == 130 and record.restarts == []
    assert all(t.state == TaskState.STOPPED for t in record.tasks)


def test_forced_stop_skips_grace(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: FakeBackend(c, {}), evaluator=False)
    sup.request_stop(force=True)
    sup.run()
    assert {s for _, s, _ in backend.signals} == set()  # stopped before anything started
    sup2, backend2, _, _ = make(tmp_path / "b", lambda c: FakeBackend(c, {}, ignores_term=frozenset({"chief:0", "worker:0"})),
                                evaluator=False, grace_period=100.0)
    backend2_poll = backend2.poll

    def poll(proc: TaskProcess) -> int | None:
        if backend2.clock.now > 2:
            sup2.request_stop(force=True)
        return backend2_poll(proc)

    backend2.poll = poll  # type: ignore[method-assign]
    record = sup2.run()
    assert record.state == RunState.STOPPED
    assert backend2.clock.now < 10  # did not wait the 100 s grace
    assert all(sig == signal.SIGKILL for _, sig, _ in backend2.signals)


def test_launch_error_stops_started_tasks(tmp_path: Path) -> None:
    sup, backend, _, store = make(tmp_path, lambda c: FakeBackend(c, {}, fail_start="worker:0"))
    with pytest.raises(LaunchError):
        sup.run()
    assert [(n, s) for n, s, _ in backend.signals] == [("chief:0", signal.SIGTERM)]
    assert store.load("r").state == RunState.FAILED and "cannot start" in (store.load("r").message or "")


class RoundTripBackend(FakeBackend):
    """Starts are round trips (as over SSH): each waits until every task's start is under way,
    so starting them one after another breaks the barrier instead of passing it."""

    concurrent_start = True

    def __init__(self, clock: FakeClock, tasks: int, fail_start: str | None = None) -> None:
        super().__init__(clock, {}, fail_start=fail_start)
        self.barrier = threading.Barrier(tasks, timeout=10)
        self.lock = threading.Lock()

    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        self.barrier.wait()
        with self.lock:
            return super().start(launch, attempt)


def test_round_trip_starts_run_at_once(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: RoundTripBackend(c, tasks=3), max_restarts=0)
    sup._start_group()  # type: ignore[attr-defined]
    assert sorted(name for name, _ in backend.started) == ["chief:0", "evaluator:0", "worker:0"]
    assert all(sup.record.task(n).state == TaskState.RUNNING and sup.record.task(n).pid for n in states(sup))


def test_a_failed_round_trip_start_stops_those_that_started(tmp_path: Path) -> None:
    sup, backend, _, store = make(tmp_path, lambda c: RoundTripBackend(c, tasks=3, fail_start="worker:0"))
    with pytest.raises(LaunchError, match="worker:0: cannot start"):
        sup.run()
    assert sorted((n, s) for n, s, _ in backend.signals) == [("chief:0", signal.SIGTERM), ("evaluator:0", signal.SIGTERM)]
    assert store.load("r").state == RunState.FAILED


class LosesAHost(FakeBackend):
    """worker:0's host stops answering at t=3; the backend knows it (and says so) at t=5."""

    def poll(self, proc: TaskProcess) -> int | None:
        code = super().poll(proc)
        if code == 255 and proc.launch.name == "worker:0":
            proc.unreachable_since, proc.ended_by = 3.0, "host localhost unreachable since 00:00:03 (no answer for 2 s)"
        return code

    def signal(self, proc: TaskProcess, signum: int) -> None:
        if proc.launch.name != "worker:0":  # no signal reaches a host cut off
            super().signal(proc, signum)


def test_a_lost_host_is_the_root_cause_even_after_a_survivors_crash_and_nothing_restarts(tmp_path: Path) -> None:
    sup, backend, clock, _ = make(tmp_path, lambda c: LosesAHost(c, {"chief:0": [(4, 1)], "worker:0": [(5, 255)]}),
                                  evaluator=False, max_restarts=2)
    record = sup.run()
    assert record.state == RunState.FAILED and record.restarts == [] and backend.started == [("chief:0", 0), ("worker:0", 0)]
    assert record.message == "host localhost unreachable since 00:00:03 (no answer for 2 s): lost worker:0; no restart on a host known lost"
    root = min((f for f in record.failures if f.attempt == 0), key=lambda f: f.time)
    assert (root.task, root.time, root.exit_code) == ("worker:0", 3.0, 255)
    assert "root cause: worker:0 on localhost" in summary(record) and record.stopped_because_of_failure == []


class CountsStartThreads(FakeBackend):
    """Starts are round trips that wait for 8 others: how many start threads exist at once."""

    concurrent_start = True

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock, {})
        self.barrier = threading.Barrier(8, timeout=10)
        self.lock = threading.Lock()
        self.most = 0

    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        self.barrier.wait()
        with self.lock:
            self.most = max(self.most, sum(t.name.startswith("start") for t in threading.enumerate()))
            return super().start(launch, attempt)


def many_tasks(tmp_path: Path, tasks: int, backend: FakeBackend, store: RunStore | None = None,
               **config: object) -> Supervisor:
    store = store or RunStore(tmp_path)
    cluster = {"chief": ["localhost:1"], "worker": [f"localhost:{i + 2}" for i in range(tasks - 1)]}
    plan = build_plan(parse_cluster({"cluster": cluster}), "/job.py", (), run_id="r", run_dir=str(tmp_path / "runs" / "r"),
                      python="py", cwd="/")
    record = initial_record(plan, created=0.0, max_restarts=int(config.get("max_restarts", 0)), backend="fake")  # type: ignore[arg-type]
    store.create(record)
    return Supervisor(plan, record, store, SupervisorConfig(**config), backend=backend,  # type: ignore[arg-type]
                      clock=backend.clock, wall=backend.clock, wait=backend.clock.sleep)


def test_starts_at_once_are_bounded_not_one_thread_per_task(tmp_path: Path) -> None:
    from launcher.supervise.supervisor import START_WORKERS

    backend = CountsStartThreads(FakeClock())
    sup = many_tasks(tmp_path, 2 * START_WORKERS, backend)
    sup._start_group()  # type: ignore[attr-defined]
    assert len(backend.started) == 2 * START_WORKERS
    assert 8 <= backend.most <= START_WORKERS


class CountingStore(RunStore):
    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.saves = 0

    def save(self, record: RunRecord) -> None:
        self.saves += 1
        super().save(record)


@pytest.mark.parametrize("tasks", [4, 48])
def test_the_record_is_written_per_change_of_the_run_not_per_task_event(tmp_path: Path, tasks: int) -> None:
    """Two attempts (the chief fails once): the writes do not grow with the tasks."""
    clock = FakeClock()
    exits: dict[str, list[tuple[float, int] | None]] = {
        "chief:0": [(3, 1), (5, 0)], **{f"worker:{i}": [None, (1 + i % 4, 0)] for i in range(tasks - 1)}}
    store = CountingStore(tmp_path)
    sup = many_tasks(tmp_path, tasks, FakeBackend(clock, exits), store, max_restarts=1, poll_interval=0.5)
    store.saves = 0
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and record.attempt == 1
    assert store.saves <= 16, store.saves  # was 2 per task per attempt (101 per attempt at 64 tasks)
    saved = store.load("r")  # and the last write holds every task's end
    assert all(t.state == TaskState.SUCCEEDED and t.attempt == 1 for t in saved.tasks)
