"""What ``tfl status`` shows: run records joined with the live process table (psutil).

A pid is ours only if its create time matches the recorded one, so a reused pid is never
taken for a task. A run whose record says it is running but whose launcher is gone is LOST.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from launcher.runstore import RunRecord, TaskRecord
from launcher.states import RunState, TaskState


def find_process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The live process with this pid *and* create time, else None."""
    if pid is None or create_time is None:
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


@dataclass
class TaskView:
    task: str
    host: str
    state: str
    attempt: int
    pid: int | None
    alive: bool
    cpu_percent: float | None
    rss_mb: float | None
    uptime_s: float | None
    exit_code: int | None
    progress: dict[str, Any] | None


@dataclass
class RunView:
    run_id: str
    job: str
    state: str
    alive: int
    total: int
    started: float
    duration_s: float
    restarts: int
    restart_reasons: list[str]
    message: str | None
    tasks: list[TaskView]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def effective_state(record: RunRecord) -> RunState:
    if record.state.is_terminal:
        return record.state
    if record.launcher_pid and not find_process(record.launcher_pid, record.launcher_create_time):
        return RunState.LOST
    return record.state


def run_view(record: RunRecord, *, measure: bool = False) -> RunView:
    """``measure`` samples cpu % over 0.1 s (costly, so only for a single run's view)."""
    procs = {t.task: find_process(t.pid, t.create_time) for t in record.tasks if t.backend == "local"}
    if measure:
        for proc in procs.values():
            _cpu(proc)
        time.sleep(0.1)
    tasks = [_task_view(t, procs.get(t.task), measure) for t in record.tasks]
    _remote_views(record, tasks, ask=measure)
    now = time.time()
    return RunView(
        run_id=record.run_id, job=record.job, state=effective_state(record).value,
        alive=sum(t.alive for t in tasks), total=len(tasks), started=record.created,
        duration_s=round((record.ended or now) - record.created, 1), restarts=len(record.restarts),
        restart_reasons=[r.reason for r in record.restarts], message=record.message, tasks=tasks,
    )


def _remote_views(record: RunRecord, views: list[TaskView], *, ask: bool) -> None:
    """SSH tasks: one run's view asks their hosts (over SSH, all at once); the list of runs
    does not, and counts them alive while their launcher is (its agents kill them without it)."""
    remote = {t.task: t for t in record.tasks if t.backend == "ssh" and t.state == TaskState.RUNNING}
    if not remote:
        return
    infos: dict[str, Any] = {}
    if ask:
        from launcher.remotestatus import remote_task_info

        infos = remote_task_info(record)
    for view in (v for v in views if v.task in remote):
        info = infos.get(view.task) if ask else {"alive": effective_state(record) != RunState.LOST}
        if not info or "error" in info:
            view.state = "unreachable"
            continue
        view.alive = bool(info["alive"])
        view.state = view.state if view.alive else "gone"
        view.cpu_percent, view.rss_mb = info.get("cpu_percent"), info.get("rss_mb")
        created = remote[view.task].create_time
        view.uptime_s = round(time.time() - created, 1) if view.alive and created else None


def _task_view(task: TaskRecord, proc: psutil.Process | None, measure: bool) -> TaskView:
    alive = proc is not None
    state = task.state.value
    if task.state == TaskState.RUNNING and not alive and task.backend == "local":
        state = "gone"  # recorded as running, but the process has vanished (launcher killed?)
    return TaskView(
        task=task.task, host=task.host, state=state, attempt=task.attempt, pid=task.pid, alive=alive,
        cpu_percent=_cpu(proc) if measure and proc else None,
        rss_mb=_rss_mb(proc) if proc else None,
        uptime_s=round(time.time() - task.create_time, 1) if alive and task.create_time else None,
        exit_code=task.exit_code, progress=read_progress(task.progress_path),
    )


def _cpu(proc: psutil.Process | None) -> float | None:
    try:
        return proc.cpu_percent(None) if proc else None
    except psutil.Error:
        return None


def _rss_mb(proc: psutil.Process) -> float | None:
    try:
        return round(proc.memory_info().rss / 2**20, 1)
    except psutil.Error:
        return None


def read_progress(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return None
