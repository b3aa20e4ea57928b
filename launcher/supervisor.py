"""The supervisor: starts a plan's tasks, watches them, applies the run policy.

Policy (all-or-nothing, see ``states``): the first training task to fail stops every
other task at once (SIGTERM to its group, ``grace_period``, then SIGKILL), without waiting
for TensorFlow's own ~14 s heartbeat timeout. Then the group is restarted while restarts
are left, else the run has failed. The evaluator never stops training: its failure is
recorded; after training it gets ``evaluator_timeout`` to finish its last checkpoint.

A backend that runs the group as one unit of its own (``backends.base.GroupBackend``:
Slurm's batch script) applies that same policy itself, built from the same options: after a
training failure the supervisor stops only the failed task if it is still alive, records
the others as stopped, and follows the next attempt when the backend says it started one
(``restarted``); the evaluator runs on across attempts.

Mechanism is the backends'; clock and wait are injectable, so tests drive the state
machine with a scripted backend in milliseconds.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from launcher.backends.base import Backend, GroupBackend, TaskProcess
from launcher.errors import LaunchError, StateWriteError
from launcher.logstream import tail_lines
from launcher.plan import LaunchPlan, TaskLaunch
from launcher.policy import PREEMPTION_EXIT_CODES, SupervisorConfig
from launcher.runstore import FailureRecord, RestartRecord, RunRecord, RunStore, TaskRecord
from launcher.states import RunState, TaskState
from launcher.tasks import TaskId
from launcher.teardown import teardown
from launcher.waker import Waker


def progress_mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def initial_record(plan: LaunchPlan, created: float, max_restarts: int, backend: str) -> RunRecord:
    tasks = [TaskRecord(task=t.name, host=t.host, backend=backend, log_path=t.log_path,
                        progress_path=t.progress_path) for t in plan.tasks]
    return RunRecord(run_id=plan.run_id, job=plan.job, job_args=list(plan.job_args), run_dir=plan.run_dir,
                     created=created, max_restarts=max_restarts, tasks=tasks, plan=plan.to_dict(), backend=backend)


class Supervisor:
    """Runs one plan on one backend. ``wake`` is what the backend was told to call when a task
    may have exited (its ``notify`` is ``wake.wake``); signal handlers call it too
    (``request_stop``), which is why it is a ``Waker`` and not a ``threading.Event``."""

    def __init__(self, plan: LaunchPlan, record: RunRecord, store: RunStore, config: SupervisorConfig, *,
                 backend: Backend, wake: Waker | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, wait: Callable[[float], None] | None = None,
                 progress_time: Callable[[str], float | None] = progress_mtime) -> None:
        self.plan, self.record, self._store, self._config = plan, record, store, config
        self._backend, self._clock, self._wall = backend, clock, wall
        # A backend that runs the group as one unit restarts it itself (see backends.base.GroupBackend).
        self._group: GroupBackend | None = backend if isinstance(backend, GroupBackend) else None
        self._wake = wake or Waker()
        self._wait = wait or self._wait_for_event
        self._progress_time = progress_time
        self._procs: dict[str, TaskProcess] = {}
        self._stop_requested = False
        self._force = False
        self._save_error: StateWriteError | None = None

    # --- called from signal handlers / other threads ------------------------------------
    def notify(self) -> None:
        self._wake.wake()

    def request_stop(self, force: bool = False) -> None:
        """First call: graceful stop of every task. ``force``: SIGKILL without grace.
        Safe in a signal handler: it sets two flags and wakes the loop, taking no lock."""
        self._stop_requested = True
        self._force = self._force or force
        self.notify()

    # --- the state machine --------------------------------------------------------------
    def run(self) -> RunRecord:
        try:
            while self._run_attempt():
                self.record.attempt += 1
        except LaunchError as exc:
            self._finish(RunState.FAILED, 1, str(exc))
            raise
        finally:
            self._teardown(list(self._procs.values()), TaskState.STOPPED)
            self._backend.close()
            self._save()
        if self._save_error is not None:
            raise self._save_error  # the tasks are stopped; the last record saved stays as it was
        return self.record

    def _run_attempt(self) -> bool:
        """Run one attempt of the whole group; True when the group is to be restarted."""
        self._set_state(RunState.STARTING if self.record.attempt == 0 else RunState.RESTARTING)
        # A group backend restarts only the training group: its evaluator runs on.
        self._procs = {n: p for n, p in self._procs.items() if self._group and not p.launch.task.is_training}
        self._start_group()
        self._set_state(RunState.RUNNING)
        while True:
            if self._stop_requested:
                self._set_state(RunState.STOPPING)
                self._teardown(list(self._procs.values()), TaskState.STOPPED)
                if self._save_error is not None:
                    self._finish(RunState.FAILED, 1, f"tasks stopped: {self._save_error}")
                else:
                    self._finish(RunState.STOPPED, 130, "stopped by the user")
                return False
            self._reap()
            self._check_stalls()
            failed = self._first_training_failure()
            if failed is not None:
                return self._on_training_failure(failed)
            if all(self.record.task(t.name).state == TaskState.SUCCEEDED for t in self.plan.training_tasks):
                self._finish_evaluator()
                if not self._stop_requested:
                    self._finish(RunState.SUCCEEDED, 0, "every training task succeeded")
                    return False
                continue
            self._wait(self._config.poll_interval)

    def _start_group(self) -> None:
        """Start every task: one after another, or all at once where the backend's start is a
        round trip. A task that cannot start raises, once every other start has been recorded
        (so that the teardown stops them)."""
        launches = [t for t in self.plan.tasks if t.name not in self._procs]
        concurrent = launches if self._backend.concurrent_start and len(launches) > 1 else []
        for launch in launches:
            if self._stop_requested:
                return
            if launch not in concurrent:
                self._start(launch)
        if not concurrent:
            return
        attempt = self.record.attempt
        with ThreadPoolExecutor(max_workers=len(concurrent), thread_name_prefix="start") as pool:
            futures = [(t, pool.submit(self._backend.start, t, attempt)) for t in concurrent]
        errors = []
        for launch, future in futures:  # every start is done here; recorded in plan order
            try:
                self._record_start(launch, future.result())
            except Exception as exc:  # raised below, once every start is recorded
                errors.append(exc)
        if errors:
            raise errors[0]

    def _start(self, launch: TaskLaunch) -> None:
        self._record_start(launch, self._backend.start(launch, self.record.attempt))

    def _record_start(self, launch: TaskLaunch, proc: TaskProcess) -> None:
        self._procs[launch.name] = proc
        task = self.record.task(launch.name)
        task.state, task.attempt, task.pid, task.create_time = TaskState.RUNNING, proc.attempt, proc.pid, proc.create_time
        task.start_ticks = proc.start_ticks
        task.started, task.ended, task.exit_code = self._wall(), None, None
        if self._group:
            self.record.backend_data.update(self._group.run_data())
        self._save()

    def _reap(self) -> None:
        """Move every task that has exited to SUCCEEDED or FAILED."""
        for name, proc in self._procs.items():
            task = self.record.task(name)
            if task.state != TaskState.RUNNING:
                continue
            code = self._backend.poll(proc)
            learned = self._learn_where(task, proc)
            if code is None:
                if learned:
                    self._save()
                continue
            task.exit_code, task.ended = code, self._wall()
            task.state = TaskState.SUCCEEDED if code == 0 else TaskState.FAILED
            if code != 0:
                self.record.failures.append(FailureRecord(
                    task=name, host=task.host, pid=task.pid, exit_code=code, reason=proc.ended_by or describe_exit(code),
                    log_tail=tail_lines(proc.launch.log_path, self._config.log_tail_lines),
                    time=task.ended, attempt=self.record.attempt))
            self._save()

    @staticmethod
    def _learn_where(task: TaskRecord, proc: TaskProcess) -> bool:
        """Record the host and pid a backend learned only once the task ran (Slurm's node)."""
        if (proc.host or task.host, proc.pid) == (task.host, task.pid):
            return False
        task.host, task.pid = proc.host or task.host, proc.pid
        return True

    def _check_stalls(self) -> None:
        """A training task with no progress for ``stall_timeout`` s has failed (it may hang forever)."""
        timeout = self._config.stall_timeout
        if not timeout:
            return
        now = self._wall()
        for name, proc in self._procs.items():
            task = self.record.task(name)
            if task.state != TaskState.RUNNING or not proc.launch.task.is_training:
                continue
            last = max(task.started or now, self._progress_time(proc.launch.progress_path) or 0.0)
            if now - last > timeout:
                task.state, task.ended = TaskState.FAILED, now
                self.record.failures.append(FailureRecord(
                    task=name, host=task.host, pid=task.pid, exit_code=None,
                    reason=f"stalled: no progress for {timeout:g} s (--stall-timeout)",
                    log_tail=tail_lines(proc.launch.log_path, self._config.log_tail_lines), time=now,
                    attempt=self.record.attempt))
                self._save()

    def _first_training_failure(self) -> FailureRecord | None:
        return next((f for f in self.record.failures
                     if f.attempt == self.record.attempt and TaskId.parse(f.task).is_training), None)

    def _on_training_failure(self, failure: FailureRecord) -> bool:
        running = [p for n, p in self._procs.items()
                   if self.record.task(n).state == TaskState.RUNNING and not (self._group and not p.launch.task.is_training)]
        self.record.stopped_because_of_failure = sorted(p.launch.name for p in running)
        failed = self._procs[failure.task]
        if self._group:  # it stops the rest of its group itself: the failed task (if alive), then record them
            self._teardown([failed], TaskState.STOPPED)
            self._mark(running, TaskState.STOPPED)
        else:  # the failed task too: a stalled one is still alive
            self._teardown(list(self._procs.values()), TaskState.STOPPED)
        if self.record.task(failure.task).exit_code is None:
            self.record.task(failure.task).exit_code = self._backend.poll(failed)
        if self._group is not None and self._group_restarted():
            self._record_restart(failure)
            return True
        if self._group is None and self._may_restart(failure):
            self._record_restart(failure)
            return True
        self._finish(RunState.FAILED, 1, f"{failure.task} on {failure.host} failed: {failure.reason}")
        return False

    def _record_restart(self, failure: FailureRecord) -> None:
        reason = f"{failure.task} on {failure.host}: {failure.reason}"
        self.record.restarts.append(RestartRecord(attempt=self.record.attempt + 1, time=self._wall(), reason=reason))
        self._save()

    def _group_restarted(self) -> bool:
        """Wait for the group backend to say whether it restarts the group (its own policy)."""
        assert self._group is not None
        while not self._stop_requested:
            restarted = self._group.restarted(self.record.attempt)
            if restarted is not None:
                return restarted
            self._wait(self._config.poll_interval)
        return False

    def _may_restart(self, failure: FailureRecord) -> bool:
        if self._stop_requested or len(self.record.restarts) >= self._config.max_restarts:
            return False
        return self._config.retry_on == "any" or failure.exit_code in PREEMPTION_EXIT_CODES

    def _finish_evaluator(self) -> None:
        deadline = self._clock() + self._config.evaluator_timeout
        evaluators = [p for n, p in self._procs.items() if not p.launch.task.is_training]
        while not self._stop_requested and self._clock() < deadline:
            self._reap()
            if all(self.record.task(p.launch.name).state != TaskState.RUNNING for p in evaluators):
                return
            self._wait(min(self._config.poll_interval, max(0.0, deadline - self._clock())))
        self._teardown(evaluators, TaskState.STOPPED)

    def _teardown(self, procs: list[TaskProcess], state: TaskState) -> None:
        """Stop ``procs`` (``launcher.teardown``: SIGTERM, grace, SIGKILL) and record them. Idempotent."""
        teardown(procs, signal=self._backend.signal, alive=self._backend.alive, grace=self._config.grace_period,
                 force=lambda: self._force, clock=self._clock, wait=self._wait)
        self._mark(procs, state)

    def _mark(self, procs: list[TaskProcess], state: TaskState) -> None:
        """Record ``procs`` that are still recorded as running as ended in ``state``."""
        for proc in procs:
            task = self.record.task(proc.launch.name)
            if task.state == TaskState.RUNNING:
                code = self._backend.poll(proc)
                task.state, task.exit_code, task.ended = state, code, self._wall()
        self._save()

    # --- small helpers ------------------------------------------------------------------
    def _wait_for_event(self, timeout: float) -> None:
        self._wake.wait(timeout)

    def _set_state(self, state: RunState) -> None:
        self.record.state = state
        self._save()

    def _finish(self, state: RunState, exit_code: int, message: str) -> None:
        self.record.state, self.record.exit_code, self.record.message = state, exit_code, message
        self.record.ended = self._wall()
        self._save()

    def _save(self) -> None:
        """A run that can no longer be recorded (disk full...) is stopped: nobody could see or
        stop its tasks. Saving is still tried on the way down; ``run`` raises the first error."""
        try:
            self._store.save(self.record)
        except StateWriteError as exc:
            if self._save_error is None:
                self._save_error = exc
                self.request_stop()
