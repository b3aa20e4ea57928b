"""Status and stop of a recorded Slurm run, from any terminal: the record (its plan and
``backend_data``) finds the job; Slurm and the run dir say the rest.

Status asks slurmctld once per run (``squeue``, then ``sacct`` where accounting is on, then
``scontrol show job``: ``launcher.engines.slurm.jobstate``): the job's state with its pending reason
(``Resources``, ``Priority``...), and each task's from the batch script's events. ``stop``
cancels the job (inside an allocation: SIGINT to tfl's batch script, which passes SIGTERM to the
run's steps), waits for it to end, SIGKILL after the grace period; a job already gone is fine.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import replace

from launcher.engines.base import TaskLive
from launcher.engines.slurm.job import JobRef, find_job, script_process, stop_job
from launcher.engines.slurm.jobstate import Runner, SlurmJobState, query_job
from launcher.engines.slurm.node.batch import SlurmJobPlan, StepEvents, read_events, read_task_info
from launcher.engines.slurm.node.errors import SlurmError
from launcher.engines.teardown import teardown
from launcher.records.states import TaskState
from launcher.records.store import RunRecord
from launcher.tasks import TaskId

_BATCH_OUTPUT = re.compile(r"batch-(\d+)\.out")  # ``SlurmFiles.batch_output`` of a submitted job


def job_ref(record: RunRecord) -> JobRef:
    unit = record.plan.get("unit") or record.plan.get("slurm")  # "slurm": recorded before plans had units
    plan = {k: v for k, v in unit.items() if k != "kind"} if isinstance(unit, dict) else None
    if plan is None or unit.get("kind", "slurm") != "slurm":  # type: ignore[union-attr]
        raise SlurmError(f"run {record.run_id}: its record has no Slurm plan; it was not run by this tfl's slurm backend")
    return JobRef.from_record(record.run_id, record.run_dir, SlurmJobPlan.from_dict(plan), record.backend_data)


def _state(ref: JobRef, run: Runner) -> SlurmJobState | None:
    job_id = find_job(ref, run)
    return query_job(job_id, run) if job_id else None


def _ended(ref: JobRef, state: SlurmJobState | None) -> bool:
    """Nothing of the run runs any more (inside an allocation: tfl's batch script has exited)."""
    if ref.allocation:
        return script_process(ref) is None
    return state is None or state.is_terminal


def inspect(record: RunRecord, run: Runner) -> dict[str, TaskLive]:
    if record.state.is_terminal:  # nothing to ask Slurm: the record says it all
        return {t.task: TaskLive(alive=False) for t in record.tasks}
    ref = job_ref(record)
    try:
        state = None if ref.allocation else _state(ref, run)
    except SlurmError:  # slurmctld down or unreachable: say so per task, never a traceback
        return {t.task: TaskLive(alive=False, state="unreachable" if t.state == TaskState.RUNNING else None)
                for t in record.tasks}
    ended, events, now = _ended(ref, state), read_events(ref.files), time.time()
    live = {}
    for task in record.tasks:
        running = task.state == TaskState.RUNNING
        if ended or not running:
            live[task.task] = TaskLive(alive=False, state="gone" if running and not record.state.is_terminal else None)
        elif state is not None and state.is_pending:
            live[task.task] = TaskLive(alive=False, state="pending")
        else:
            alive = _task_alive(TaskId.parse(task.task), task.attempt, events)
            info = read_task_info(ref.files, TaskId.parse(task.task).slug)
            here = info is not None and info.attempt == task.attempt
            live[task.task] = TaskLive(alive=alive, uptime_s=round(now - info.time, 1) if alive and info and here else None,
                                       host=info.node if info and here else None)
    return live


def _task_alive(task: TaskId, attempt: int, events: StepEvents) -> bool:
    if task.is_training:
        return attempt in events.started and attempt not in events.exits
    return events.evaluator_exit is None


def describe(record: RunRecord, run: Runner) -> dict[str, str]:
    """The job as Slurm sees it now: id, state, pending reason, nodes (inside an allocation: the script too)."""
    ref = job_ref(record)
    if ref.allocation:
        return {"allocation": ref.job_id or "?", "batch script": "running" if script_process(ref) else "ended"}
    try:
        state = _state(ref, run)
    except SlurmError as exc:
        return {"job": ref.job_id or "?", "state": f"unknown ({exc})"}
    if state is None:
        facts = {"job": ref.job_id or "not submitted", "state": "gone (Slurm no longer knows it)"}
    else:
        facts = {"job": state.job_id, "state": state.state}
        if state.reason and (state.is_pending or state.is_terminal):
            facts["reason"] = state.reason
        if state.nodelist:
            facts["nodes"] = state.nodelist
        requeued = read_events(ref.files).requeued
        if requeued:
            facts["requeued"] = f"{requeued} time(s) by Slurm"
    earlier = earlier_jobs(ref, facts["job"])
    if earlier:  # a resumed run's: for `sacct -j` of the attempts before
        facts["earlier jobs"] = " ".join(earlier)
    return facts


def earlier_jobs(ref: JobRef, job_id: str) -> list[str]:
    """The run's other Slurm jobs, oldest first: `tfl resume` submits a new job in the same run dir, and
    every job that started wrote its ``batch-<id>.out`` there (a requeued job keeps its id)."""
    try:
        names = os.listdir(ref.files.root)
    except OSError:
        return []
    ids = {match[1] for name in names if (match := _BATCH_OUTPUT.fullmatch(name))} - {job_id}
    return sorted(ids, key=int)


def stop(record: RunRecord, run: Runner, grace: float) -> int:
    """Stop what is left of the run (idempotent); returns 1 when something was still there."""
    ref = job_ref(record)
    job_id = find_job(ref, run)
    if job_id is None:
        return 0
    ref = replace(ref, job_id=job_id)

    def alive(_: JobRef) -> bool:
        return not _ended(ref, None if ref.allocation else query_job(job_id, run))

    if not alive(ref):
        return 0
    teardown([ref], signal=lambda r, signum: stop_job(r, run, signum), alive=alive, grace=grace, kill_wait=15.0)
    return 1
