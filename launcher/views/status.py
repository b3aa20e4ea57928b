"""What ``tfl status`` shows: run records joined with the live process table (psutil).

A pid is ours only if its create time matches the recorded one, so a reused pid is never
taken for a task. A run whose record says it is running but whose launcher is gone is LOST.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from launcher.engines import registry
from launcher.engines.base import NO_ANSWER, GroupBackend, TaskLive
from launcher.records.identity import launcher_identity
from launcher.records.preparing import Preparing, preparing_runs, resolve_run
from launcher.records.states import RunState
from launcher.records.store import STATE_FILE, RunRecord, RunStore, TaskRecord, UnreadableRun
from launcher.tasks import TaskId


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
    elsewhere: str | None = None  # the launcher's host, when not this machine: live facts only there
    backend: str = "local"
    backend_state: dict[str, str] = field(default_factory=dict)  # a group backend's own view (Slurm: job, state, reason)
    preemptions: int = 0  # among the restarts: those after a preemption (not counted against --max-restarts)
    # An elastic run (--min-tasks): its training tasks now, its minimum and full size, the hosts
    # left out now (each with why) and every resize (from, to, why, hosts).
    min_tasks: int | None = None
    training_tasks: int = 0
    full_training_tasks: int = 0
    lost_hosts: dict[str, str] = field(default_factory=dict)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    network: str = "host"  # who can reach the task ports: private (a namespace of the run's own) | host
    fenced: bool = False  # every training task's host admits only the run's hosts to its task ports (ssh.firewall)
    launcher_pid: int | None = None
    from_launcher: bool = False  # the tasks as the live launcher knows them: their hosts were not asked
    silent_hosts: list[str] = field(default_factory=list)  # hosts asked that did not answer in time

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RECENT = 20  # `tfl status` lists the active runs and this many of the latest


def run_list(store: RunStore, *, every: bool = False) -> tuple[list[RunView], list[UnreadableRun], int]:
    """The runs ``tfl status`` lists, oldest first, the unreadable ones among them, and how
    many it left out: the active runs and the ``RECENT`` latest (reading only their records),
    or ``every`` run."""
    # The launches being prepared before the records: one recorded between the two reads is then among the
    # records, where read after them it was in neither (its note gone, its record not read) and not listed.
    notes = preparing_runs(store.home)
    records, unreadable, hidden = (*store.scan(), 0) if every else store.recent(RECENT)
    recorded = {r.run_id for r in records} | {u.run_id for u in unreadable}
    preparing = [preparing_view(p) for p in notes if p.run_id not in recorded]
    # A launch being prepared has a run dir and no record: counted among the dirs not read, yet listed here.
    return [run_view(r) for r in records] + preparing, unreadable, max(0, hidden - len(preparing))


def one_view(store: RunStore, ref: str | None) -> RunView:
    """``tfl status RUN``: the run as its backend sees it now, or a detached launch being prepared."""
    found = resolve_run(store, ref)
    return preparing_view(found) if isinstance(found, Preparing) else run_view(found, measure=True)


PREPARING = "preparing"  # a detached launch whose hosts are being made ready: no record yet (records.preparing)


def preparing_view(preparing: Preparing) -> RunView:
    """A launch being prepared, as its note says: preparing while its launcher lives, else lost."""
    alive = preparing.launcher.alive()
    pid = preparing.launcher.pid
    message = (f"its background launcher (pid {pid}) is making the hosts ready (checks, code shipped); the run is "
               f"recorded once they are, and `tfl stop {preparing.run_id}` calls it off" if alive else
               f"its background launcher (pid {pid}) ended before the run was recorded; nothing ran (its log: "
               f"{preparing.run_dir}/launcher.log; `tfl rm {preparing.run_id}` removes its dir)")
    tasks = [TaskView(task=task, host=host, state=PREPARING if alive else "gone", attempt=0, pid=None, alive=False,
                      cpu_percent=None, rss_mb=None, uptime_s=None, exit_code=None, progress=None)
             for task, host in preparing.tasks]
    return RunView(run_id=preparing.run_id, job=preparing.job, state=PREPARING if alive else RunState.LOST.value, alive=0,
                   total=len(tasks), started=preparing.created, duration_s=round(time.time() - preparing.created, 1),
                   restarts=0, restart_reasons=[], message=message, tasks=tasks, network=preparing.network,
                   launcher_pid=pid)


def effective_state(record: RunRecord) -> RunState:
    """The recorded state, or LOST when the record says running but its launcher is gone.
    A launcher on another machine (a shared TFL_HOME) cannot be looked for from here: its
    run keeps the recorded state, and ``RunView.elsewhere`` names the host."""
    if record.state.is_terminal:
        return record.state
    launcher = launcher_identity(record)
    if record.launcher_pid and not launcher.elsewhere and not launcher.alive():
        return RunState.LOST
    return record.state


def _ended_since(record: RunRecord) -> RunRecord | None:
    """The run's record read again, when the run has ended since ``record`` was read, else None. A
    launcher saves the run's end, then exits: a record read before the one and a launcher looked for
    after the other (the hosts asked meanwhile, the cpu % sampled) made a run that succeeded "lost"."""
    try:
        text = (Path(record.run_dir) / STATE_FILE).read_text()
        if RunState(json.loads(text)["state"]).is_terminal:  # only then the whole record: a lost run's stays unread
            again = RunRecord.from_json(text)
            return again if (again.run_id, again.created) == (record.run_id, record.created) else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def run_view(record: RunRecord, *, measure: bool = False) -> RunView:
    """The run as its backend sees it now. ``measure``: one run's view, which asks every host
    and samples cpu % (costly); the list of runs answers from what is at hand, and for a
    finished run that is its record (no backend to import: `tfl status` stays quick)."""
    wanted = measure or not record.state.is_terminal
    backend = registry.get(record.backend) if wanted else None
    live = backend.inspect(record, ask=measure) if backend is not None else {}
    state = effective_state(record)
    ended = _ended_since(record) if state == RunState.LOST else None
    if ended is not None:
        return run_view(ended, measure=measure)
    tasks = [_task_view(t, live.get(t.task, TaskLive(alive=False))) for t in record.tasks]
    backend_state: dict[str, str] = backend.describe(record) if measure and isinstance(backend, GroupBackend) else {}
    now = time.time()
    return RunView(
        run_id=record.run_id, job=record.job, state=_shown_state(state, live),
        alive=sum(t.alive for t in tasks), total=len(tasks), started=record.created,
        duration_s=round((record.ended or now) - record.created, 1), restarts=len(record.restarts),
        restart_reasons=[r.reason for r in record.restarts], message=record.message, tasks=tasks,
        elsewhere=None if record.state.is_terminal else launcher_identity(record).elsewhere,
        backend=record.backend, backend_state=backend_state,
        preemptions=sum(r.kind == "preemption" for r in record.restarts), min_tasks=record.min_tasks,
        # Not those on hosts just lost: while the run waits for them they are still the record's tasks.
        training_tasks=sum(TaskId.parse(t.task).is_training and t.host not in record.lost_hosts for t in record.tasks),
        full_training_tasks=sum(TaskId.parse(t["task"]).is_training for t in record.plan.get("tasks", [])),
        lost_hosts=dict(record.lost_hosts), resizes=[asdict(r) for r in record.resizes],
        network=str(record.plan.get("network", "host")), fenced=_fenced(record.plan),
        launcher_pid=record.launcher_pid, from_launcher=any(t.source == "launcher" for t in live.values()),
        silent_hosts=sorted({t.host for t in tasks if t.state == NO_ANSWER}),
    )


def _fenced(plan: dict[str, Any]) -> bool:
    training = [t for t in plan.get("tasks", []) if TaskId.parse(t["task"]).is_training]
    return bool(training) and all((t.get("ssh") or {}).get("firewall") for t in training)


PENDING = "pending"  # a run whose tasks all wait in their engine's queue (a Slurm job PENDING); never recorded


def _shown_state(state: RunState, live: dict[str, TaskLive]) -> str:
    """The run's state as ``tfl status`` says it: a running run whose engine holds its tasks in
    its queue (their live state ``pending``) and runs none of them is pending, not running."""
    if state == RunState.RUNNING and any(t.state == PENDING for t in live.values()) and not any(t.alive for t in live.values()):
        return PENDING
    return state.value


def _task_view(task: TaskRecord, live: TaskLive) -> TaskView:
    return TaskView(
        task=task.task, host=live.host or task.host, state=live.state or task.state.value, attempt=task.attempt, pid=task.pid,
        alive=live.alive, cpu_percent=live.cpu_percent, rss_mb=live.rss_mb, uptime_s=live.uptime_s,
        exit_code=task.exit_code, progress=read_progress(task.progress_path),
    )


def read_progress(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return None
