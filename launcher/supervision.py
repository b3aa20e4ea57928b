"""The supervisor's small pure pieces: a run's first record, a task's failure record, how an
exit is told, when a task last made progress (``launcher.supervisor`` applies them)."""

from __future__ import annotations

import os
import signal

from launcher.logstream import tail_lines
from launcher.plan import LaunchPlan
from launcher.runstore import FailureRecord, RunRecord, TaskRecord


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
                   attempt: int) -> FailureRecord:
    """A task that failed, as data: why (``reason``, else its exit told), its log's tail."""
    return FailureRecord(task=task.task, host=task.host, pid=task.pid, exit_code=code, reason=reason or describe_exit(code or 0),
                         log_tail=tail_lines(log_path, lines), time=time, attempt=attempt)
