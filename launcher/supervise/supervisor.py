"""The supervisor: starts a plan's tasks, watches them, applies the run policy (``restarts``: all-or-nothing,
preemption restarts counted apart, when a run ends PREEMPTED).

The evaluator never stops training: its failure is recorded; after training it gets ``evaluator_timeout`` to finish its last checkpoint.

A backend that runs the group as one unit of its own (``engines.base.GroupBackend``:
Slurm's batch script) applies that same policy itself, built from the same options: after a
training failure the supervisor stops only the failed task if it is still alive, records
the others as stopped, and follows the next attempt when the backend says it started one
(``restarted``); the evaluator runs on across attempts.

An elastic run (``--min-tasks``, ``elastic``) goes on without hosts lost in a failure (a
resize: neither failure nor preemption) and takes back, at an agreed checkpoint, those that answer.

Mechanism is the backends'; clock and wait are injectable, so tests drive the state
machine with a scripted backend in milliseconds.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from launcher.contract import PREEMPTED_EXIT_CODE
from launcher.engines.base import Backend, GroupBackend, TaskProcess
from launcher.engines.teardown import teardown
from launcher.errors import LaunchError, StateWriteError
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.run_options import SupervisorConfig
from launcher.records.states import RunState, TaskState
from launcher.records.store import FailureRecord, RestartRecord, RunRecord, RunStore
from launcher.supervise.elastic import ElasticOutcome, ElasticPolicy
from launcher.supervise.preemption import ended_state, preempted_file, preemption_reason, saved_note
from launcher.supervise.recording import failure_record, failure_said, group_went_on, learn_where, progress_mtime, stalled
from launcher.supervise.recording import initial_record as initial_record  # where the launcher has always found it
from launcher.supervise.restarts import first_training_failure, may_restart
from launcher.supervise.waker import Waker

# Starts at once at most (each a round trip to its host): threads bounded, not one per task.
START_WORKERS = 32


class Supervisor:
    """Runs one plan on one backend. ``wake`` is what the backend was told to call when a task
    may have exited (its ``notify`` is ``wake.wake``); signal handlers call it too
    (``request_stop``), which is why it is a ``Waker`` and not a ``threading.Event``."""

    def __init__(self, plan: LaunchPlan, record: RunRecord, store: RunStore, config: SupervisorConfig, *,
                 backend: Backend, wake: Waker | None = None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, wait: Callable[[float], None] | None = None,
                 progress_time: Callable[[str], float | None] = progress_mtime,
                 say: Callable[[str], None] = lambda line: None) -> None:
        self.plan, self.record, self._store, self._config = plan, record, store, config
        self._backend, self._clock, self._wall, self._say = backend, clock, wall, say
        # A backend that runs the group as one unit restarts it itself (see backends.base.GroupBackend).
        self._group: GroupBackend | None = backend if isinstance(backend, GroupBackend) else None
        self._wake = wake or Waker()
        self._wait = self._flushing(wait or self._wait_for_event)  # the record is written before each wait
        self._dirty = False  # task events since the record was last written (``_changed``)
        self._progress_time = progress_time
        self._procs: dict[str, TaskProcess] = {}
        self._stop_requested = False
        self._force = False
        self._notice = False  # the stop came as a notice (the launcher's SIGTERM): a preemption unless `tfl stop` asked
        self._restarts = self._preemptions = 0  # this launcher's restarts (a resumed run counts anew)
        self._preempted_file = preempted_file(record)  # where the chief says at which step it saved
        self._save_error: StateWriteError | None = None
        self._elastic = ElasticPolicy(plan, record, config, backend, clock=clock, wall=wall, wait=self._wait, say=say,
                                      stopping=lambda: self._stop_requested) if config.min_tasks and not self._group else None
        self.plan = self._elastic.resumed() if self._elastic else plan  # a resumed run: without the hosts it had lost

    # --- called from signal handlers / other threads ------------------------------------
    def notify(self) -> None:
        self._wake.wake()

    def request_stop(self, force: bool = False, notice: bool = False) -> None:
        """First call: graceful stop of every task. ``force``: SIGKILL without grace. ``notice``:
        the launcher got SIGTERM: recorded as a preemption unless ``tfl stop`` sent it.
        Safe in a signal handler: it sets flags and wakes the loop, taking no lock."""
        self._stop_requested = True
        self._force = self._force or force
        self._notice = self._notice or notice
        self.notify()

    # --- the state machine --------------------------------------------------------------
    def run(self) -> RunRecord:
        try:
            start = self._elastic.before_start() if self._elastic else None  # a resumed run that lost too many
            if start is None or self._resized(start):
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
                self._stop()
                return False
            self._reap()
            self._check_stalls()
            failed = first_training_failure(self.record)
            if failed is not None:
                return self._on_training_failure(failed)
            if self._elastic is not None and (back := self._elastic.taken_back()):
                return self._take_back(self._elastic, back)
            if all(self.record.task(t.name).state == TaskState.SUCCEEDED for t in self.plan.training_tasks):
                self._finish_evaluator()
                if not self._stop_requested:
                    self._finish(RunState.SUCCEEDED, 0, "every training task succeeded")
                    return False
                continue
            self._wait(self._config.poll_interval)

    def _stop(self, during: str = "") -> None:
        """Every task gets the notice (SIGTERM) and the grace to save the agreed checkpoint, then SIGKILL."""
        self._set_state(RunState.STOPPING)
        self._teardown(list(self._procs.values()), TaskState.STOPPED)
        saved = saved_note(self.record, self._config.grace_period)
        if self._save_error is not None:
            self._finish(RunState.FAILED, 1, f"tasks stopped: {self._save_error}")
        elif self._notice and not self._store.stop_requested(self.record):
            self._finish(RunState.PREEMPTED, PREEMPTED_EXIT_CODE, f"preempted: tfl got SIGTERM{during}{saved}")
        else:
            self._finish(RunState.STOPPED, 130, f"stopped by the user{during}{saved}")

    def _start_group(self) -> None:
        """Start every task: one after another, or all at once where the backend's start is a
        round trip. A task that cannot start raises, once every other start has been recorded
        (so that the teardown stops them)."""
        launches = [t for t in self.plan.tasks if t.name not in self._procs]
        if not (self._backend.concurrent_start and len(launches) > 1):
            for launch in launches:
                if self._stop_requested:
                    return
                self._start(launch)
            return
        if self._stop_requested:
            return
        attempt = self.record.attempt
        with ThreadPoolExecutor(max_workers=min(START_WORKERS, len(launches)), thread_name_prefix="start") as pool:
            futures = [(t, pool.submit(self._backend.start, t, attempt)) for t in launches]
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
        self._changed()

    def _reap(self) -> None:
        """Move every task that has exited to SUCCEEDED or FAILED."""
        for name, proc in self._procs.items():
            task = self.record.task(name)
            if task.state != TaskState.RUNNING:
                continue
            code = self._backend.poll(proc)
            learned = learn_where(task, proc)
            if code is None:
                if learned:
                    self._changed()
                continue
            task.exit_code, task.ended = code, self._wall()
            task.state = ended_state(code, TaskState.FAILED)
            if code != 0:
                self._record_failure(proc, code)
            self._changed()

    def _record_failure(self, proc: TaskProcess, code: int | None, reason: str | None = None, time: float | None = None) -> None:
        """A task failed (a lost host's: when its host stopped answering, before the survivors it took down)."""
        task = self.record.task(proc.launch.name)
        if reason is None and code == PREEMPTED_EXIT_CODE:
            reason = preemption_reason(proc.launch.progress_path, self._preempted_file, self.record.attempt)
        self.record.failures.append(failure_record(
            task, code=code, reason=reason or proc.ended_by, log_path=proc.launch.log_path, lines=self._config.log_tail_lines,
            time=time or proc.unreachable_since or task.ended or self._wall(), attempt=self.record.attempt,
            of_run=proc.unit_ended and not reason))

    def _check_stalls(self) -> None:
        """A training task with no progress for ``stall_timeout`` s has failed (it may hang forever)."""
        timeout, now = self._config.stall_timeout, self._wall()
        for proc in stalled(self.record, self._procs.values(), timeout, now, self._progress_time) if timeout else []:
            task = self.record.task(proc.launch.name)
            task.state, task.ended = TaskState.FAILED, now
            self._record_failure(proc, None, f"stalled: no progress for {timeout:g} s (--stall-timeout)", now)
            self._changed()

    def _on_training_failure(self, failure: FailureRecord) -> bool:
        if failure.exit_code == PREEMPTED_EXIT_CODE and self._group is None:
            self._await_agreement()
            failure = first_training_failure(self.record, preempted=False) or failure  # mixed: the other failure counts
        running = [p for n, p in self._procs.items()
                   if self.record.task(n).state == TaskState.RUNNING and not (self._group and not p.launch.task.is_training)]
        self.record.stopped_because_of_failure = sorted(p.launch.name for p in running)
        failed = self._procs[failure.task]
        preempted = failure.exit_code == PREEMPTED_EXIT_CODE  # else no agreement can include the failed task
        if self._group:  # it stops the rest of its group itself: the failed task (if alive), then record them
            self._teardown([failed], TaskState.STOPPED, notice=preempted)
            self._mark(running, TaskState.STOPPED)
        else:  # the failed task too: a stalled one is still alive
            self._teardown(list(self._procs.values()), TaskState.STOPPED, notice=preempted)
        if self.record.task(failure.task).exit_code is None:
            self.record.task(failure.task).exit_code = self._backend.poll(failed)
        lost = self._lost_hosts()
        outcome = self._elastic.after_failure(self.plan, self._procs.values()) if self._elastic else None
        if outcome is not None:  # hosts lost: an elastic run goes on without them (``supervise.elastic``)
            return self._resized(outcome)
        if lost:  # a restart would wait on a host that does not answer (an elastic run goes on without it)
            self.record.stopped_because_of_failure = [n for n in self.record.stopped_because_of_failure
                                                      if self._procs[n].unreachable_since is None]
            self._finish(RunState.FAILED, 1, f"{lost}; no restart on a host known lost")
            return False
        if self._group is not None and self._group_restarted():  # restarted; an elastic one maybe resized
            self.plan = group_went_on(self._group, self.plan, self.record, self._wall(), say=self._say,
                                      restart=lambda: self._record_restart(failure, preempted))
            return True
        if self._group is None and may_restart(self._config, failure, preempted, self._preemptions if preempted else self._restarts,
                                                             self._stop_requested):
            self._record_restart(failure, preempted)
            return True
        if preempted and self._stop_requested:  # a stop came during the agreement: it decides how the run ends
            self._stop()
        elif preempted:
            self._finish(RunState.PREEMPTED, PREEMPTED_EXIT_CODE,
                         f"{failure.task} on {failure.host} was {failure.reason}; no preemption restart left "
                         f"(--max-preemptions {self._config.max_preemptions})")
        else:
            self._finish(RunState.FAILED, 1, failure_said(failure))
        return False

    def _resized(self, outcome: ElasticOutcome) -> bool:
        """An elastic run lost hosts or takes them back: go on at the new size (True), or end."""
        if outcome.plan is not None:
            self.plan, self._procs = outcome.plan, {}
            self._save()
            return True
        if outcome.stopped:  # as any stop: the machine's SIGTERM (no `tfl stop`) ends it preempted
            self._stop(" while waiting for lost hosts")
        else:
            self._finish(*outcome.end)
        return False

    def _take_back(self, elastic: ElasticPolicy, hosts: list[str]) -> bool:
        """Lost hosts answer again: the notice (SIGTERM: the group saves at an agreed step), then the hosts back."""
        self._set_state(RunState.RESTARTING)
        self._teardown(list(self._procs.values()), TaskState.STOPPED)
        return self._resized(ElasticOutcome(elastic.grow(hosts)))

    def _lost_hosts(self) -> str:
        """The hosts of this attempt known lost ("" when none): each one, since when, which tasks."""
        lost: dict[str, list[TaskProcess]] = {}
        for name, proc in self._procs.items():
            self._backend.poll(proc)  # fills in ``unreachable_since``
            if proc.unreachable_since is not None:
                lost.setdefault(self.record.task(name).host, []).append(proc)
                if not any(f.task == name and f.attempt == self.record.attempt for f in self.record.failures):
                    self._record_failure(proc, self.record.task(name).exit_code)
        return "; ".join(f"{procs[0].ended_by}: lost {', '.join(p.launch.name for p in procs)}" for procs in lost.values())

    def _await_agreement(self) -> None:
        """A training task was preempted: the others reach the same agreed checkpoint and leave
        on their own. Wait for that, up to the grace, or until one of them fails otherwise."""
        deadline = self._clock() + self._config.grace_period
        training = [p for p in self._procs.values() if p.launch.task.is_training]
        while not self._stop_requested and self._clock() < deadline:
            self._reap()
            if first_training_failure(self.record, preempted=False) is not None:
                return
            if all(self.record.task(p.launch.name).state != TaskState.RUNNING for p in training):
                return
            self._wait(min(self._config.poll_interval, max(0.0, deadline - self._clock())))

    def _record_restart(self, failure: FailureRecord, preempted: bool) -> None:
        reason = f"{failure.task} on {failure.host}: {failure.reason}"
        if preempted:
            self._preemptions += 1
        else:
            self._restarts += 1
        self.record.restarts.append(RestartRecord(attempt=self.record.attempt + 1, time=self._wall(), reason=reason,
                                                  kind="preemption" if preempted else "failure"))
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

    def _finish_evaluator(self) -> None:
        deadline = self._clock() + self._config.evaluator_timeout
        evaluators = [p for n, p in self._procs.items() if not p.launch.task.is_training]
        while not self._stop_requested and self._clock() < deadline:
            self._reap()
            if all(self.record.task(p.launch.name).state != TaskState.RUNNING for p in evaluators):
                return
            self._wait(min(self._config.poll_interval, max(0.0, deadline - self._clock())))
        self._teardown(evaluators, TaskState.STOPPED)

    def _teardown(self, procs: list[TaskProcess], state: TaskState, notice: bool = True) -> None:
        """Stop ``procs`` (``engines.teardown``; not a ``notice`` after a failure: TEARDOWN_SIGNAL) and record them."""
        teardown(procs, signal=self._backend.signal, alive=self._backend.alive, grace=self._config.grace_period,
                 force=lambda: self._force, clock=self._clock, wait=self._wait, notice=notice)
        self._mark(procs, state)

    def _mark(self, procs: list[TaskProcess], state: TaskState) -> None:
        """Record ``procs`` that are still recorded as running as ended in ``state``."""
        for proc in procs:
            task = self.record.task(proc.launch.name)
            if task.state == TaskState.RUNNING:
                code = self._backend.poll(proc)
                task.state = TaskState.PREEMPTED if code == PREEMPTED_EXIT_CODE else state  # it saved on our notice
                task.exit_code, task.ended = code, self._wall()
        self._changed()

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

    def _changed(self) -> None:
        """A task event: written with the next change of the run's state, or before the next
        wait, whichever comes first (at most once per tick, not once per task event)."""
        self._dirty = True

    def _flushing(self, wait: Callable[[float], None]) -> Callable[[float], None]:
        def flush_then_wait(timeout: float) -> None:
            if self._dirty:
                self._save()
            wait(timeout)
        return flush_then_wait

    def _save(self) -> None:
        """A run that can no longer be recorded (disk full...) is stopped: nobody could see or
        stop its tasks. Saving is still tried on the way down; ``run`` raises the first error."""
        self._dirty = False
        try:
            self._store.save(self.record)
        except StateWriteError as exc:
            if self._save_error is None:
                self._save_error = exc
                self.request_stop()

