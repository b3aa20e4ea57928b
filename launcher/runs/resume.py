"""``tfl resume RUN``: continue a stopped, preempted or failed run where it left off.

The same run: its recorded plan (``record.plan``: hosts, ports, environment, model dir), its
record and logs, the next attempt (``TFL_ATTEMPT``), so the job kit restores the agreed
checkpoint (or the last backup) from the same model dir. Whatever ran it runs it again,
through the backend protocol: ``prepare`` the hosts as a launch does, then the supervisor.

Refused, with the fix, for a run that succeeded, whose hosts keep the chief's checkpoint
where the other hosts' tasks cannot see it (no shared storage), whose launcher still runs, whose tasks
still live (a launcher killed with -9 leaves them: ``tfl stop RUN`` first), or whose private key
(its record's ``ssh.identity_file``) is gone or open to others. Two resumes at
once cannot both win: the claim is made under a lock on the run dir.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from launcher.engines import registry
from launcher.errors import UsageError
from launcher.files import RECORDED_KEY_FIX, private_key_problem
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.run_options import SupervisorConfig
from launcher.plan.storage import EXAMPLE, restart_need
from launcher.records.identity import ProcessIdentity, launcher_identity
from launcher.records.states import RunState, TaskState
from launcher.records.store import RestartRecord, RunRecord, RunStore, TaskRecord

LOCK_FILE = "launcher.lock"


def resume_config(record: RunRecord, overrides: dict[str, Any] | None = None) -> SupervisorConfig:
    """The run's own options (recorded at launch), with ``overrides`` (options given to resume)."""
    names = {f.name for f in dataclasses.fields(SupervisorConfig)}
    recorded = {k: v for k, v in record.config.items() if k in names}
    if not recorded:  # a record from before tfl kept the options
        recorded = {"max_restarts": record.max_restarts, "grace_period": record.grace_period}
    return SupervisorConfig(**{**recorded, **{k: v for k, v in (overrides or {}).items() if v is not None}})


def refusal(record: RunRecord) -> str | None:
    """Why the run cannot be resumed now (one line with the fix), or None."""
    run = record.run_id
    if record.state == RunState.SUCCEEDED:
        return f"run {run} succeeded: there is nothing to resume (launch the job again for a new run)"
    if not record.plan:
        return f"run {run} has no recorded plan (it never started): launch the job again"
    unseen = restart_need(recorded_plan(record))
    if unseen is not None:  # the tasks on the other hosts would start again from nothing, and the group die
        return (f"run {run}: a resume restores the chief's checkpoint on {unseen[0]}, which the tasks on "
                f"{', '.join(unseen[1])} cannot see (each host keeps its model dir on its own disk); launch the job "
                f"again with storage every host mounts in the cluster file ({EXAMPLE}) or a shared --model-dir")
    launcher = launcher_identity(record)
    if not record.state.is_terminal and launcher.elsewhere:
        return f"run {run}: its launcher runs on host {launcher.elsewhere}; resume it there once it has ended"
    if launcher.find() is not None:
        if record.state.is_terminal:  # its last save and the hosts' clean-up are under way: it would overwrite the claim
            return f"run {run} has ended but its launcher (pid {record.launcher_pid}) is still finishing: resume it in a moment"
        return (f"run {run} is still running (launcher pid {record.launcher_pid}): stop it first with "
                f"`tfl stop {run}`, or follow it with `tfl logs {run} --follow`")
    key = key_problem(record)
    if key is not None:  # said before a host is reached: the launch's own check would name the cluster file
        return key
    live = registry.get(record.backend).inspect(record, ask=True)
    alive = sorted(name for name, task in live.items() if task.alive)
    if alive:
        return (f"run {run}: its launcher is gone but {len(alive)} task(s) still run ({', '.join(alive)}): "
                f"stop them first with `tfl stop {run}`, then resume")
    return None


def key_problem(record: RunRecord) -> str | None:
    """What is wrong with a private key the run's record names (``ssh.identity_file``: gone since
    the launch, or open to others), in one line with the fix, or None."""
    seen: set[str] = set()
    for task in recorded_plan(record).tasks:
        key = os.path.expanduser(task.ssh.identity_file) if task.ssh and task.ssh.identity_file else None
        if key is None or key in seen:
            continue
        seen.add(key)
        problem = private_key_problem(key, RECORDED_KEY_FIX)
        if problem:
            return f"run {record.run_id}: {task.host}: {problem}"
    return None


def move_to(record: RunRecord, address: str | None) -> None:
    """``tfl resume --address``: the run goes on on its Ray cluster at a new address (the cluster started again on
    another host or port), and its record names that address from then on (``tfl status``, ``tfl stop``, a later
    resume). A run not on Ray, or a malformed address, is refused in one line."""
    if address is None:
        return
    move = getattr(recorded_plan(record).unit, "moved_to", None)  # only a unit with a cluster address has it
    if move is None:
        raise UsageError(f"run {record.run_id} ran on {record.backend}, not on Ray: --address gives a Ray run its "
                         "cluster's new address; resume it without --address")
    unit = move(address)
    record.plan = {**record.plan, "unit": {"kind": unit.kind, **unit.to_dict()}}


def job_gone(record: RunRecord) -> str | None:
    """Why a local run cannot be resumed because its job script is no longer where it was launched
    from (its tasks would start only to fail opening it, an attempt spent), or None."""
    tasks = (record.plan or {}).get("tasks") or []
    if record.backend != "local" or not tasks or os.path.isfile(os.path.join(tasks[0].get("cwd") or "", record.job)):
        return None
    return (f"run {record.run_id}: its job script {record.job} is gone (moved or removed since the launch); put it back "
            "there to resume the run, or launch the job from where it is now for a new run")


def starts_over(record: RunRecord) -> str | None:
    """A note for a resume whose model dir, read here, holds no checkpoint or backup (removed since
    the run stopped, or never written): the job starts from step 0, whatever the run's record said."""
    from launcher.views.report import kept_checkpoint
    from launcher.views.tensorboard import model_dir_of

    if kept_checkpoint(record) is not False:
        return None
    return (f"tfl: note: run {record.run_id}'s model dir {model_dir_of(record).path} holds no checkpoint or backup: "
            "the job starts over from step 0")


def check_resumable(record: RunRecord, *, job: bool = False) -> None:
    """``refusal`` as an error; ``job``: also a local run's job script gone (``job_gone``)."""
    why = refusal(record) or (job_gone(record) if job else None)
    if why is not None:
        raise UsageError(why)


@contextmanager
def _locked(run_dir: str) -> Iterator[None]:
    fd = os.open(Path(run_dir) / LOCK_FILE, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def claim(store: RunStore, run_id: str, config: SupervisorConfig, address: str | None = None) -> RunRecord:
    """Make this process the run's launcher for its next attempt: checked again under the run
    dir's lock (a second resume now finds this launcher alive and is refused). ``address``: ``move_to``."""
    record = store.load(run_id)
    with _locked(record.run_dir):
        record = store.load(run_id)
        check_resumable(record)
        move_to(record, address)
        # Not ended, yet resumable: its launcher is gone (`tfl status` shows it LOST, never as running).
        state = record.state.value if record.state.is_terminal else f"{RunState.LOST.value}: its launcher was gone"
        was = f"{state}: {record.message}" if record.message else state
        record.attempt += 1
        record.restarts.append(RestartRecord(attempt=record.attempt, time=time.time(),
                                             reason=f"resumed by `tfl resume` (the run was {was})", kind="resume"))
        for task in record.tasks:
            task.state, task.pid, task.create_time, task.start_ticks = TaskState.PENDING, None, None, None
            task.exit_code, task.ended = None, None
        record.state, record.ended, record.exit_code, record.message = RunState.STARTING, None, None, None
        record.stopped_because_of_failure = []
        _whole_unit(record)
        record.config, record.max_restarts, record.grace_period = (dataclasses.asdict(config), config.max_restarts,
                                                                   config.grace_period)
        me = ProcessIdentity.of(os.getpid())
        record.launcher_pid, record.launcher_create_time, record.launcher_start_ticks = me.pid, me.create_time, me.start_ticks
        record.launcher_boot_id, record.launcher_host = me.boot_id, me.host
        store.clear_stop_request(record)
        store.reopen(record)
    return record


def _whole_unit(record: RunRecord) -> None:
    """A plan run as one unit of its own (Slurm's job) resumes as a new unit at its full size: an
    elastic run's tasks left out by a resize are back, and its lost nodes may be."""
    plan = recorded_plan(record)
    if plan.unit is None or not record.resizes:
        return
    kept = {t.task: t for t in record.tasks}
    record.tasks = [kept.get(t.name) or TaskRecord(task=t.name, host=t.host, backend=record.backend, log_path=t.log_path,
                                                   progress_path=t.progress_path) for t in plan.tasks]
    record.lost_hosts = {}


def recorded_plan(record: RunRecord) -> LaunchPlan:
    return LaunchPlan.from_dict(record.plan)
