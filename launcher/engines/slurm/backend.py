"""SlurmBackend: a run's tasks as one Slurm job (or as steps of an allocation that exists).

The protocol, honestly fitted to a whole-run backend (``base.GroupBackend``):

- ``prepare``: Slurm's client commands on PATH, and ``sbatch --test-only`` of the very
  script (its refusal, e.g. an unknown partition, is one line before the run exists).
- ``start``: the first task's start submits the job (``sbatch --parsable``), or starts tfl's
  batch script inside the allocation; the job starts every task, so the other starts (and
  those of a restarted attempt, which the script made) only hand out the task's handle.
  ``tfl resume`` starts at the run's next attempt: the script begins there (``first-attempt``
  in the run dir), after the last job's events were moved aside.
- ``poll`` / ``alive``: from the batch script's events and srun's stderr in the run dir, and
  the job's state (``outcome``); ``poll`` also fills in the task's node and pid once its
  driver has noted them.
- ``signal``: a training task is signalled through its job, which stops the run (the script
  would otherwise start the group again); the evaluator through its own step.
- ``restarted``: the script's policy, written into it from ``--max-restarts`` and
  ``--max-preemptions`` (a step that ended preempted, 170, does not count as a failure).
- ``inspect`` / ``stop_recorded`` / ``describe``: ``launcher.engines.slurm.recorded``.

Logs and progress need nothing: the tasks write them into the run dir, on storage every node
shares, where the console follower and ``tfl status`` read them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Callable

from launcher.engines.base import Cleanup, GroupResize, Stopped, TaskLive, TaskProcess
from launcher.engines.preflight import Check, HostTasks
from launcher.engines.slurm import recorded
from launcher.engines.slurm.job import SlurmJob, sbatch_message
from launcher.engines.slurm.jobstate import CommandResult, Runner, run_command
from launcher.engines.slurm.node.batch import read_task_info
from launcher.engines.slurm.node.errors import SlurmError
from launcher.engines.slurm.node.nodes import rank_of_task
from launcher.engines.slurm.outcome import (
    Outcome,
    below_minimum,
    evaluator_alive,
    evaluator_outcome,
    node_failure,
    preemption_counts,
    renamed_notes,
    training_alive,
    training_outcome,
)
from launcher.engines.slurm.plan import in_allocation, slurm_unit
from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.records.store import RunRecord

SUBMIT_COMMANDS = ("sbatch", "squeue", "scontrol", "scancel")
ALLOCATION_COMMANDS = ("srun", "squeue", "scontrol", "scancel")
HOST = "slurm"  # the host of every check


class SlurmBackend:
    name = "slurm"
    concurrent_start = False

    def __init__(self, notify: Callable[[], None] = lambda: None, run: Runner = run_command,
                 environ: dict[str, str] | None = None) -> None:
        # ``notify`` is never called: nothing here learns of an exit before the supervisor's next
        # poll (every poll_interval), which reads the run dir's files and asks Slurm at most once a second.
        self._notify, self._run = notify, run
        self._environ = dict(os.environ) if environ is None else environ
        self._job: SlurmJob | None = None
        self._plan: LaunchPlan | None = None  # the plan moved to the allocation a resume runs in
        self._node_notes: dict[str, str] = {}  # node -> what Slurm says of it once it took it down

    # --- before a run -------------------------------------------------------------------
    def probe(self, hosts: Sequence[HostTasks], *, quick: bool) -> list[Check]:
        """Slurm's client commands; the job itself is tried by ``prepare``, in the launcher that
        submits it."""
        return command_checks(SUBMIT_COMMANDS)

    def resolve(self, plan: LaunchPlan) -> LaunchPlan:
        # every path is in the run dir, on storage the nodes share; only a resumed run's allocation may differ
        return self._plan if self._plan is not None and self._plan.run_id == plan.run_id else plan

    def prepare(self, plan: LaunchPlan) -> list[Check]:
        slurm = slurm_unit(plan)
        self._job = SlurmJob(plan, self._run)
        if slurm.allocation:
            checks = command_checks(ALLOCATION_COMMANDS) + conf_checks(self._environ)
            moved = in_allocation(plan, self._environ)
            if isinstance(moved, str):
                checks.append(Check(HOST, "allocation", "fail", moved))
            else:  # resumed inside another allocation: the run's steps go there
                self._job, self._plan = SlurmJob(moved, self._run), moved
            return checks
        checks = command_checks(SUBMIT_COMMANDS) + conf_checks(self._environ)
        if all(c.status == "ok" for c in checks):
            checks.append(self._test_only(plan))
        return checks

    def _test_only(self, plan: LaunchPlan) -> Check:
        """``sbatch --test-only`` of the very script: sbatch's own judgement, submitting nothing.
        (The script goes through a private temp file: the run dir does not exist yet.)"""
        slurm = slurm_unit(plan)
        fd, path = tempfile.mkstemp(prefix="tfl-", suffix=".sbatch")  # 0600
        try:
            with os.fdopen(fd, "w") as f:
                f.write(slurm.script)
            done = self._run([*slurm.test_only, path])
        finally:
            os.unlink(path)
        said = (done.stderr or done.stdout).strip()
        if done.returncode != 0:
            return Check(HOST, "sbatch", "fail", f"sbatch refused the job: {sbatch_message(said)}")
        return Check(HOST, "sbatch", "ok", said.splitlines()[-1] if said else "sbatch --test-only accepted the job")

    # --- a live run ---------------------------------------------------------------------
    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        if self._job is None:
            raise LaunchError(f"{launch.name}: the slurm backend was not prepared with this run's plan")
        if not self._job.started:  # at attempt 0, or at the next one for `tfl resume`
            self._job.start(self._environ, attempt)
        return TaskProcess(launch=launch, attempt=attempt, pid=None, create_time=None, pgid=None, handle=self._job)

    def poll(self, proc: TaskProcess) -> int | None:
        outcome = self._outcome(proc)
        info = read_task_info(proc.handle.ref.files, proc.launch.task.slug)
        if info is not None and info.attempt == proc.attempt:
            proc.host, proc.pid = info.node, info.pid
        if outcome is None:
            return None
        proc.ended_by, proc.unit_ended = outcome.ended_by, outcome.of_run
        if outcome.failed_node and proc.ended_by:  # when Slurm noticed, and why (asked once per node)
            node = outcome.failed_node
            if node not in self._node_notes:
                self._node_notes[node] = proc.handle.node_down(node)
            proc.ended_by += self._node_notes[node] + below_minimum(proc.handle.events(), proc.attempt, proc.handle.plan.min_tasks)
        return outcome.code

    def _outcome(self, proc: TaskProcess) -> Outcome | None:
        job: SlurmJob = proc.handle
        events, task = job.events(), proc.launch.task
        if not task.is_training:
            return evaluator_outcome(events, job.end() if evaluator_alive(events, None) else None)
        end = job.end() if proc.attempt not in events.exits else None
        if end is not None:  # the script writes its events before it ends: read them again, or an exit
            events = job.events()  # written between the first read and the end would be taken for none at all
            end = end if proc.attempt not in events.exits else None
        ended_badly = end is not None or events.exits.get(proc.attempt, 0) != 0
        return training_outcome(rank_of_task(task.type, task.index), proc.attempt, events, job.srun_err(proc.attempt),
                                end, job.nodes(proc.attempt) if ended_badly else {}, job_id=job.ref.job_id or "?",
                                stopped=job.stopped, elastic=job.plan.min_tasks is not None,
                                batch_out=job.batch_out() if ended_badly else "")

    def alive(self, proc: TaskProcess) -> bool:
        job: SlurmJob = proc.handle
        events = job.events()
        if not proc.launch.task.is_training:
            return evaluator_alive(events, None) and job.end() is None
        return training_alive(proc.attempt, events, None) and job.end() is None

    def signal(self, proc: TaskProcess, signum: int) -> None:
        job: SlurmJob = proc.handle
        if proc.launch.task.is_training:
            job.stop(signum)  # the run: the batch script would start the group again after its tasks alone
        else:
            job.signal_evaluator(signum)

    def close(self) -> None:
        if self._job is not None:
            self._job.close()

    # --- the unit (base.GroupBackend) ---------------------------------------------------
    def run_data(self) -> dict[str, str]:
        return self._job.ref.data() if self._job is not None and self._job.started else {}

    def restarted(self, attempt: int) -> bool | None:
        job = self._job
        if job is None:
            return False
        events = job.events()
        if attempt + 1 in events.started:
            return True
        if job.stopped or events.end is not None or events.exits.get(attempt) == 0:
            return False
        lost = events.lost.get(attempt)  # an elastic run lost nodes: noted before the exit
        if lost is not None:
            return None if lost.to_tasks >= (job.plan.min_tasks or 0) and job.end() is None else False
        if attempt in events.exits:  # the script's policy: preemptions and failures have their own caps
            preempted, failed = preemption_counts(events, job.srun_err, attempt, job.first_attempt)
            if preempted > job.plan.max_preemptions or failed > job.plan.max_restarts:
                return False
        if job.end() is None:
            return None
        return attempt + 1 in job.events().started  # the script wrote its last events before it ended: read them again

    def resized(self, attempt: int) -> GroupResize | None:
        """An elastic run's ``attempt`` on the nodes left after the last one lost some (its ``lost`` event)."""
        job = self._job
        lost = job.events().lost.get(attempt - 1) if job is not None and job.plan.min_tasks is not None else None
        if job is None or lost is None or lost.to_tasks < (job.plan.min_tasks or 0):
            return None
        why = node_failure(job.ref.job_id or "?", None, ended=False).split(": ", 1)[1]
        return GroupResize(attempt=attempt, from_tasks=lost.from_tasks, to_tasks=lost.to_tasks,
                           lost={n: f"node failure: {why}{self._node_notes.get(n, '')}" for n in lost.lost},
                           notes=renamed_notes(lost))

    # --- a recorded run, from any terminal ------------------------------------------------
    def inspect(self, record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
        return recorded.inspect(record, self._asking)

    def describe(self, record: RunRecord) -> dict[str, str]:
        return recorded.describe(record, self._asking)

    def stop_recorded(self, record: RunRecord, grace: float) -> Stopped:
        bad = conf_checks(self._environ)
        if bad and record.state.is_terminal:  # its launcher ended the job; Slurm cannot be asked to make sure
            return Stopped(unreached=[f"slurm: {bad[0].detail}"])
        return Stopped(recorded.stop(record, self._asking, grace))

    def _asking(self, argv: Sequence[str]) -> CommandResult:
        """The runner of `tfl status` and `tfl stop`: a SLURM_CONF that names no file fails each
        command at once, in one line naming the fix, not after Slurm's 60 s of retries."""
        bad = conf_checks(self._environ)
        if bad:
            raise SlurmError(bad[0].detail)
        return self._run(argv)

    def clean_recorded(self, record: RunRecord) -> Cleanup:
        """Nothing outside the run dir: a Slurm run's files (script, logs, progress) are in it,
        on storage the nodes share, and the run store removes it."""
        return Cleanup()


def conf_checks(environ: Mapping[str, str]) -> list[Check]:
    """A SLURM_CONF that names no file: each Slurm command would retry it for 60 s, then say only
    "Unable to process configuration file"."""
    conf = environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        return [Check(HOST, "SLURM_CONF", "fail", f"SLURM_CONF={conf} is not a file; set it to the cluster's slurm.conf, "
                                                  "or unset it where Slurm's commands find their own")]
    return []


def command_checks(commands: Sequence[str]) -> list[Check]:
    missing = [c for c in commands if shutil.which(c) is None]
    if missing:
        return [Check(HOST, "commands", "fail", f"{', '.join(missing)} not on PATH; install Slurm's client commands "
                                                "(slurm-client) or fix PATH")]
    return [Check(HOST, "commands", "ok", f"{', '.join(commands)} found")]
