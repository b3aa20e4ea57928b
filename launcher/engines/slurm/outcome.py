"""How each task of a Slurm run ended, from what the run left in its run dir and Slurm's
word on the job. Pure: the backend reads the files and asks Slurm, this module decides.

Slurm keeps no exit code per task without accounting, but the batch script notes how each
step ended (``launcher.engines.slurm.node.batch``: the events file) and keeps srun's stderr, whose
``srun: error: n2: task 1: Exited with exit code 3`` lines name the task that ended the
step. With ``--kill-on-bad-exit`` srun then ends the others and reports them too
("Terminated"); those were *stopped because of it*, as in a local run, so only the root
cause's tasks get an exit code here. When the whole job ended under the tasks (a node
failure, the time limit, a cancellation outside tfl, the batch script failing before
training) the chief takes the failure, or the first task on the failed node, with one line
that says what happened (``Outcome.ended_by``). A cancellation of the whole job (someone's
``scancel JOB``) and the job's time limit are the run's cause, not the chief's (``Outcome.of_run``):
the run says it naming no task.

A step whose first failed task exited with ``contract.PREEMPTED_EXIT_CODE`` (170) was
preempted: every task that exited 170 saved the agreed checkpoint, and each reports 170 with
"preempted" as what ended it (the batch script notes such a step's exit as 170 even when srun,
having ended the rest, says 143). The batch script applies the same rule (``preempted_step`` in
``launcher.engines.slurm.script``) to restart such a step without counting it against max_restarts.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from launcher.contract import PREEMPTED_EXIT_CODE
from launcher.engines.slurm.jobstate import SrunTaskFailure, parse_srun_failures, root_cause
from launcher.engines.slurm.node.batch import LostNodes, StepEvents
from launcher.engines.slurm.node.nodes import NODE_FAILURE, task_of_rank

# slurmstepd's line in srun's stderr when the step was cancelled: bare, someone's scancel; "DUE TO TIME LIMIT",
# the time limit; any other "DUE TO …" (preemption, node failure) is told apart elsewhere.
_CANCELLED = re.compile(r"\*\*\* STEP (\S+) ON \S+ CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*")
# slurmstepd's line in the batch script's output (batch-<id>.out) when the whole job was cancelled: bare, someone's
# ``scancel JOB``; the one in srun's stderr above names only the training step, or is not there at all.
_JOB_CANCELLED = re.compile(r"\*\*\* JOB (\S+) ON \S+ CANCELLED AT (\S+)(?: DUE TO ([A-Z ]+?))? \*\*\*")
# srun ending the step itself, because one of its tasks failed (--kill-on-bad-exit): its cancel is not someone's.
_SRUN_ENDED_IT = re.compile(r"^srun: error: \S+: tasks? [\d,-]+: |_step_signal: Terminating StepId=", re.M)
# srun names a signalled task by strsignal(): "Killed", "Terminated", "Segmentation fault"...
_SIGNAL_WORDS = {signal.strsignal(s) or s.name: -int(s) for s in signal.Signals}


@dataclass(frozen=True)
class JobEnd:
    """The whole unit has ended: a submitted job is in a terminal state (or Slurm forgot it),
    or the batch script tfl ran inside an allocation has exited."""

    job_id: str
    state: str  # Slurm's (COMPLETED, FAILED, CANCELLED, NODE_FAIL, TIMEOUT...), UNKNOWN, or EXITED (the script)
    exit_code: int | None
    by_tfl: bool  # tfl stopped it (the supervisor's teardown, tfl stop)
    allocation: bool = False
    batch_tail: str = ""  # the last line of the batch script's output


@dataclass(frozen=True)
class Outcome:
    code: int  # as poll() reports it: 0, the exit status, or -signal
    ended_by: str | None = None  # why, when the code does not say
    failed_node: str | None = None  # the node Slurm lost under the task (NODE_FAIL), when named
    of_run: bool = False  # ``ended_by`` is the run's, not the task's: the whole job ended under every task


def failure_code(failure: SrunTaskFailure) -> int:
    if failure.exit_code is not None:
        return failure.exit_code
    return _SIGNAL_WORDS.get(failure.what, 1)


PREEMPTED = f"preempted: saved the agreed checkpoint and exited {PREEMPTED_EXIT_CODE}"


def preempted_step(status: int | None, srun_err: str) -> bool:
    """Whether a training step that ended with ``status`` was preempted (the script's rule)."""
    cause = root_cause(parse_srun_failures(srun_err))
    return status == PREEMPTED_EXIT_CODE and cause is not None and cause.exit_code == PREEMPTED_EXIT_CODE


def preemption_counts(events: StepEvents, srun_err: Callable[[int], str], upto: int, since: int = 0) -> tuple[int, int]:
    """(preempted steps, failed steps) among the training attempts from ``since`` (the job's first:
    0, or the one ``tfl resume`` started it with) up to ``upto``, as the script counts them."""
    preempted = failed = 0
    for attempt, status in events.exits.items():
        if attempt > upto or attempt < since or status == 0 or attempt in events.lost:  # a resize counts as neither
            continue
        if status == PREEMPTED_EXIT_CODE and preempted_step(status, srun_err(attempt)):
            preempted += 1
        else:
            failed += 1
    return preempted, failed


def failed_node(srun_err: str) -> str | None:
    match = NODE_FAILURE.search(srun_err)
    return match[1] if match else None


def training_outcome(rank: int, attempt: int, events: StepEvents, srun_err: str, end: JobEnd | None,
                     nodes: Mapping[int, str], *, job_id: str, stopped: bool = False, elastic: bool = False,
                     batch_out: str = "") -> Outcome | None:
    """The training task of ``rank`` in ``attempt``: its outcome, or None while it runs (or
    when srun stopped it because another task failed: see ``training_alive``).
    ``srun_err``: the attempt's srun stderr; ``nodes``: each rank's node, where known;
    ``stopped``: tfl has stopped the job (then a failed step is tfl's doing); ``elastic``: the job
    was submitted with ``--no-kill`` and goes on without a failed node; ``batch_out``: the end of the batch
    script's output, where slurmstepd says that the whole job was cancelled."""
    status = events.exits.get(attempt)
    if status == 0:
        return Outcome(0)
    if status is None and end is None:
        return None
    if stopped or (end is not None and end.by_tfl):
        return Outcome(-signal.SIGTERM)
    node = failed_node(srun_err)
    if node is not None or (end is not None and end.state == "NODE_FAIL"):
        victim = next((r for r, n in sorted(nodes.items()) if n == node), 0)
        return Outcome(status or 1, node_failure(job_id, node, ended=not elastic), node) if rank == victim else None
    whole = job_cancellation(batch_out, end) or time_limit(batch_out, srun_err, end, job_id)
    if whole is not None:  # the run's cause, carried by the chief (srun's "Terminated" or "Killed" are its doing)
        return Outcome(status or 1, whole, of_run=True) if rank == 0 else None
    cancelled = cancellation(srun_err, end, job_id)
    if cancelled is not None:  # the tasks srun reports "Terminated" were ended by it, not the cause
        return Outcome(status or 1, cancelled) if rank == 0 else None
    if status is not None:
        cause = root_cause(parse_srun_failures(srun_err))
        if cause is None:  # srun failed without naming a task (e.g. it could not start the step)
            return Outcome(status, f"the training step ended with status {status}: {_last_line(srun_err)}") if rank == 0 else None
        if cause.exit_code == PREEMPTED_EXIT_CODE:  # every task that saved and left reports it
            saved = {r for f in parse_srun_failures(srun_err) if f.exit_code == PREEMPTED_EXIT_CODE for r in f.ranks}
            return Outcome(PREEMPTED_EXIT_CODE, PREEMPTED) if rank in saved else None
        return Outcome(failure_code(cause)) if rank in cause.ranks else None
    assert end is not None
    return Outcome(end.exit_code or 1, describe_end(end)) if rank == 0 else None


def job_cancellation(batch_out: str, end: JobEnd | None) -> str | None:
    """One line when someone cancelled the whole job outside tfl (``scancel JOB``), else None: slurmstepd's
    line in the batch script's output (with when), or Slurm's state once the job has ended."""
    match = _JOB_CANCELLED.search(batch_out)
    if match is not None and match[3] is None:
        return f"Slurm job {match[1]} was cancelled outside tfl (scancel at {match[2]})"
    if end is not None and end.state == "CANCELLED" and not end.by_tfl and not end.allocation:
        return describe_end(end)
    return None


def time_limit(batch_out: str, srun_err: str, end: JobEnd | None, job_id: str) -> str | None:
    """One line when the job reached its time limit (the whole job's: tfl gives its steps none), else None:
    Slurm's TIMEOUT once the job has ended, or before that slurmstepd's ``DUE TO TIME LIMIT`` line for
    the job in the batch script's output, or for the training step in srun's stderr."""
    if end is not None and end.state == "TIMEOUT" and not end.by_tfl:
        return describe_end(end)
    job = _JOB_CANCELLED.search(batch_out)
    step = _CANCELLED.search(srun_err)
    if (job is not None and job[3] == "TIME LIMIT") or (step is not None and step[3] == "TIME LIMIT"
                                                          and not _SRUN_ENDED_IT.search(srun_err, 0, step.start())):
        return describe_end(JobEnd(job_id, "TIMEOUT", None, False))
    return None


def cancellation(srun_err: str, end: JobEnd | None, job_id: str) -> str | None:
    """One line when someone cancelled the job or its training step outside tfl (``scancel``); else None."""
    if end is not None and end.state == "CANCELLED" and not end.by_tfl:
        return describe_end(end)
    match = _CANCELLED.search(srun_err)
    if match is None or match[3] is not None or _SRUN_ENDED_IT.search(srun_err, 0, match.start()):
        return None
    return f"Slurm step {match[1]} was cancelled outside tfl (scancel at {match[2]})"


def node_failure(job_id: str, node: str | None, ended: bool = True) -> str:
    """``ended``: Slurm ended the job; else the job goes on without the node (``--no-kill``: an elastic run)."""
    what = f"Slurm ended job {job_id} (NODE_FAIL)" if ended else f"Slurm took it out of job {job_id}, which goes on (--no-kill)"
    return f"node {node or '(unknown)'} failed: {what}; `sinfo -R` says why"


def training_alive(attempt: int, events: StepEvents, end: JobEnd | None) -> bool:
    """Whether a training task of ``attempt`` may still run (also while the job is pending)."""
    return attempt not in events.exits and end is None


def evaluator_outcome(events: StepEvents, end: JobEnd | None) -> Outcome | None:
    """The evaluator's outcome; None while it runs, or once the script or tfl stopped it."""
    if events.evaluator_exit is not None and not events.evaluator_stopping:
        return Outcome(events.evaluator_exit)
    if end is not None and end.by_tfl and events.evaluator_exit is None:
        return Outcome(-signal.SIGTERM)
    return None


def evaluator_alive(events: StepEvents, end: JobEnd | None) -> bool:
    return events.evaluator_exit is None and end is None


def describe_end(end: JobEnd) -> str:
    """One line: how the job ended under its tasks, and what to do about it."""
    job = f"allocation {end.job_id}" if end.allocation else f"Slurm job {end.job_id}"
    if end.state == "NODE_FAIL":
        return node_failure(end.job_id, None)
    if end.state == "CANCELLED":
        return f"{job} was cancelled outside tfl (scancel)"
    if end.state == "TIMEOUT":
        return f"{job} reached its time limit (TIMEOUT); give the slurm block a longer \"time\""
    if end.state == "UNKNOWN":
        return f"Slurm no longer knows job {end.job_id}: it ended unseen (MinJobAge passed)"
    if end.state in ("COMPLETED", "FAILED", "EXITED"):
        code = "" if end.exit_code is None else f" with status {end.exit_code}"
        return f"tfl's batch script for {job} ended{code} before training did: {end.batch_tail or 'no output'}"
    return f"Slurm ended job {end.job_id}: {end.state}"


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def renamed_notes(lost: LostNodes) -> tuple[str, ...]:
    """The training tasks that the next attempt numbers anew (block distribution: rank r on node r // T)."""
    per_node = lost.from_tasks // max(1, len(lost.before))
    notes = []
    for rank in range(lost.to_tasks):
        node = lost.after[rank // per_node]
        old = lost.before.index(node) * per_node + rank % per_node
        if old != rank:
            notes.append(f"{_task(old)} on {node} is now {_task(rank)}")
    return tuple(notes)


def _task(rank: int) -> str:
    kind, index = task_of_rank(rank)
    return f"{kind}:{index}"


def below_minimum(events: StepEvents, attempt: int, min_tasks: int | None) -> str:
    """"; …below --min-tasks N, lost: NODES" when an elastic run's ``attempt`` left too few tasks; else ""."""
    lost = events.lost.get(attempt)
    if lost is None or min_tasks is None or lost.to_tasks >= min_tasks:
        return ""
    return (f"; {lost.to_tasks} training task{'s' * (lost.to_tasks != 1)} left, below --min-tasks {min_tasks} "
            f"(lost: {', '.join(lost.lost)})")
