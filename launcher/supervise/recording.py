"""The supervisor's small pure pieces: a run's first record, a task's failure record, how an
exit is told, when a task last made progress and which have stalled, where a task was found to
run, what a group backend's next attempt is (``launcher.supervise.supervisor`` applies them)."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable, Iterable

from launcher.engines.base import GroupBackend, ResizingGroup, TaskProcess
from launcher.plan.launch_plan import LaunchPlan
from launcher.records.states import TaskState
from launcher.records.store import FailureRecord, ResizeRecord, RunRecord, TaskRecord
from launcher.tasks import TaskId
from launcher.views.diagnosis import failure_tail


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


def failure_record(task: TaskRecord, *, code: int | None, reason: str | None, log_path: str, lines: int, time: float,
                   attempt: int, of_run: bool = False) -> FailureRecord:
    """A task that failed, as data: why (``reason``, else its exit told), its log's tail. ``of_run``: the
    reason is the run's (its whole unit ended under it), so no log of a task that did nothing wrong."""
    return FailureRecord(task=task.task, host=task.host, pid=task.pid, exit_code=code, reason=reason or describe_exit(code or 0),
                         log_tail=[] if of_run else failure_tail(log_path, lines), time=time, attempt=attempt, of_run=of_run)


def failure_said(failure: FailureRecord) -> str:
    """The failure in the run's message: the task that failed and why, or only why when that is the run's."""
    return failure.reason if failure.of_run else f"{failure.task} on {failure.host} failed: {failure.reason}"


def group_went_on(group: GroupBackend, plan: LaunchPlan, record: RunRecord, time: float, *,
                  say: Callable[[str], None], restart: Callable[[], None]) -> LaunchPlan:
    """A group backend started ``record.attempt + 1``: a plain restart (``restart`` records it),
    or, in an elastic run, a resize (recorded as the SSH resizes are: neither a failure nor a
    preemption), whose plan keeps the first ``to_tasks`` training tasks (Slurm renumbers the
    tasks left by rank) and the evaluator; the record's training tasks start afresh."""
    resize = group.resized(record.attempt + 1) if isinstance(group, ResizingGroup) else None
    if resize is None:
        restart()
        return plan
    training = plan.training_tasks[:resize.to_tasks]
    tasks = tuple(t for t in plan.tasks if not t.task.is_training or t in training)
    record.lost_hosts.update(resize.lost)
    reason = "lost: " + ", ".join(f"{h} ({why})" for h, why in sorted(resize.lost.items()))
    record.resizes.append(ResizeRecord(attempt=resize.attempt, time=time, from_tasks=resize.from_tasks,
                                       to_tasks=resize.to_tasks, reason=reason, hosts=sorted(resize.lost),
                                       notes=list(resize.notes)))
    say(f"tfl: resize: {resize.from_tasks} -> {resize.to_tasks} training tasks; {reason}"  # as supervise.elastic says it
        + "".join(f"; {note}" for note in resize.notes))
    kept = {r.task: r for r in record.tasks if not TaskId.parse(r.task).is_training}  # the evaluator runs on
    record.tasks = [kept.get(t.name) or TaskRecord(task=t.name, host=t.host, backend=record.backend, log_path=t.log_path,
                                                   progress_path=t.progress_path) for t in tasks]
    return dataclasses.replace(plan, tasks=tasks)


def learn_where(task: TaskRecord, proc: TaskProcess) -> bool:
    """Record the host and pid a backend learned only once the task ran (Slurm's node); whether they were new."""
    if (proc.host or task.host, proc.pid) == (task.host, task.pid):
        return False
    task.host, task.pid = proc.host or task.host, proc.pid
    return True


def stalled(record: RunRecord, procs: Iterable[TaskProcess], timeout: float, now: float,
            progress_time: Callable[[str], float | None]) -> list[TaskProcess]:
    """The running training tasks with no progress for ``timeout`` s (since they started, or their last record)."""
    found = []
    for proc in procs:
        task = record.task(proc.launch.name)
        if task.state != TaskState.RUNNING or not proc.launch.task.is_training:
            continue
        if now - max(task.started or now, progress_time(proc.launch.progress_path) or 0.0) > timeout:
            found.append(proc)
    return found
