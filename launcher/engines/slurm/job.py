"""One Slurm run's unit: a submitted job, or tfl's batch script inside an allocation.

``JobRef`` is what finds the unit again (from the live backend, or from a run's record in
another terminal); the functions beside it ask Slurm about it and stop it, each through a
``Runner`` that tests replace. ``SlurmJob`` is the live unit of a launch: it starts the
script (``sbatch``, or ``bash`` inside the allocation), and answers what each task's
outcome is from the run dir's files and the job's state (``outcome``), asking slurmctld at
most once a second.

Stopping: a submitted job is cancelled (``scancel JOB``: Slurm sends its tasks SIGTERM and,
after its KillWait, SIGKILL; the job kit's tasks save the agreed checkpoint in that time and
the script, seeing the job no longer RUNNING, restarts nothing); inside an allocation, which
is the user's, tfl's batch script gets SIGINT, passes SIGTERM to this run's steps with
``scancel --signal`` and restarts nothing.
SIGKILL: ``scancel --signal=KILL`` (the whole job, or this run's steps) and then the script.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from launcher.engines.slurm.jobstate import Runner, SlurmJobState, query_job, query_steps, run_command
from launcher.engines.slurm.node.batch import (
    EVALUATOR_ROLE,
    TRAINING_ROLE,
    RunFiles,
    SlurmJobPlan,
    StepEvents,
    read_events,
    read_task_info,
    step_name,
)
from launcher.engines.slurm.node.errors import SlurmError
from launcher.engines.slurm.node.nodes import rank_of_task
from launcher.engines.slurm.outcome import JobEnd
from launcher.engines.slurm.plan import slurm_unit
from launcher.files import open_private, private_dir, write_atomic
from launcher.plan.launch_plan import LaunchPlan
from launcher.records import identity
from launcher.tasklog import tail_lines

STATE_MAX_AGE = 1.0  # seconds a job state from squeue is good for: slurmctld is shared


@dataclass(frozen=True)
class JobRef:
    """How to find a run's unit: the job id (the allocation's, inside one), its name, and the
    batch script's process inside an allocation."""

    run_id: str
    files: RunFiles
    job_name: str
    job_id: str | None  # None: submitted, but the id never reached the record
    allocation: bool = False
    script_pid: int | None = None
    script_create_time: float | None = None

    def data(self) -> dict[str, str]:
        """For the run's record (``RunRecord.backend_data``)."""
        data = {"job_id": self.job_id or "", "job_name": self.job_name}
        if self.allocation:
            data |= {"allocation": "1", "script_pid": str(self.script_pid), "script_create_time": repr(self.script_create_time)}
        return data

    @classmethod
    def from_record(cls, run_id: str, run_dir: str, plan: SlurmJobPlan, data: Mapping[str, str]) -> JobRef:
        pid, created = data.get("script_pid", ""), data.get("script_create_time", "")
        return cls(run_id=run_id, files=RunFiles(run_dir), job_name=plan.job_name,
                   job_id=data.get("job_id") or plan.allocation, allocation=plan.allocation is not None,
                   script_pid=int(pid) if pid.isdigit() else None,
                   script_create_time=float(created) if created.replace(".", "", 1).isdigit() else None)


def find_job(ref: JobRef, run: Runner) -> str | None:
    """The job's id: recorded, or found by its name (a launcher killed right after sbatch)."""
    if ref.job_id or ref.allocation:
        return ref.job_id
    done = run(["squeue", "-h", "-t", "all", "-n", ref.job_name, "-o", "%i"])
    ids = done.stdout.split() if done.returncode == 0 else []
    return ids[0] if ids else None


def step_ids(ref: JobRef, run: Runner, *roles: str) -> list[str]:
    """This run's steps of the given roles, by name."""
    if ref.job_id is None:
        return []
    names = {step_name(r, ref.run_id) for r in roles}
    return [s.step_id for s in query_steps(ref.job_id, run) if s.name in names]


def signal_steps(ref: JobRef, run: Runner, signum: int, *roles: str) -> None:
    """Best effort (a teardown tries again): a step already gone, or Slurm not answering, is fine."""
    try:
        steps = step_ids(ref, run, *roles)
    except SlurmError:
        return
    for step in steps:
        run(["scancel", f"--signal={signal.Signals(signum).name.removeprefix('SIG')}", step])


def script_process(ref: JobRef) -> psutil.Process | None:
    """The batch script tfl runs inside an allocation, if it is alive (pid and create time)."""
    return identity.find_process(ref.script_pid, ref.script_create_time) if ref.allocation else None


def stop_job(ref: JobRef, run: Runner, signum: int) -> None:
    """Stop the whole unit: SIGTERM (graceful) or SIGKILL. Idempotent."""
    if not ref.allocation:
        if ref.job_id:
            if signum == signal.SIGKILL:
                run(["scancel", "--signal=KILL", "--full", ref.job_id])
            run(["scancel", ref.job_id])
        return
    if signum == signal.SIGKILL:
        signal_steps(ref, run, signal.SIGKILL, TRAINING_ROLE, EVALUATOR_ROLE)
    proc = script_process(ref)
    if proc is not None and ref.script_pid is not None:
        try:
            if signum == signal.SIGKILL:
                os.killpg(ref.script_pid, signum)  # the script leads its own group (with its sruns)
            else:
                # The script alone, with SIGINT: it stops the run and passes SIGTERM on to its steps'
                # tasks (SIGTERM to the script is a preemption notice, after which it would restart them).
                os.kill(ref.script_pid, signal.SIGINT)
        except (ProcessLookupError, PermissionError):
            pass


def batch_lines(ref: JobRef, lines: int = 5) -> list[str]:
    """The last lines of the batch script's output (its own, and what slurmstepd says there)."""
    return [ln for ln in tail_lines(ref.files.batch_output(None if ref.allocation else ref.job_id), lines) if ln.strip()]


def batch_tail(ref: JobRef) -> str:
    lines = batch_lines(ref)
    return lines[-1].strip() if lines else ""


class SlurmJob:
    """The live unit of one launch (shared by all its tasks' ``TaskProcess``)."""

    def __init__(self, plan: LaunchPlan, run: Runner = run_command) -> None:
        self.plan, self.tasks, self._run = slurm_unit(plan), plan.tasks, run
        self.ref = JobRef(run_id=plan.run_id, files=RunFiles(plan.run_dir), job_name=self.plan.job_name,
                          job_id=self.plan.allocation, allocation=self.plan.allocation is not None)
        self._script: subprocess.Popen[bytes] | None = None
        self._state: SlurmJobState | None = None
        self._state_at = float("-inf")
        self.stopped = False  # tfl has stopped the unit
        self.started = False
        self.first_attempt = 0  # the attempt the script starts with (the next one, for `tfl resume`)
        self.unsure = False  # the last question to Slurm got no answer

    # --- starting ---------------------------------------------------------------------------
    def start(self, environ: Mapping[str, str], attempt: int = 0) -> None:
        """Write the batch script into the run dir and start it: ``sbatch`` or, inside an allocation, ``bash``.
        ``attempt`` > 0 (``tfl resume``): the script begins there, and the last job's events are
        kept as ``events-before-<attempt>`` (they would end this one's before it began)."""
        files = self.ref.files
        try:
            private_dir(files.root, exist_ok=True)
            write_atomic(files.script, self.plan.script)
            if attempt and os.path.exists(files.events):
                os.replace(files.events, f"{files.events}-before-{attempt}")
            write_atomic(files.first_attempt, f"{attempt}\n")
            self.first_attempt = attempt
        except OSError as exc:
            raise SlurmError(f"cannot write the batch script to {files.script}: {exc.strerror}") from None
        if self.plan.allocation:
            self._start_script(environ)
        else:
            self._submit()
        self.started = True

    def _submit(self) -> None:
        argv = [*self.plan.sbatch, self.ref.files.script]
        done = self._run(argv)
        job_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not job_id.isdigit():
            raise SlurmError(f"sbatch refused the job: {sbatch_message(done.stderr or done.stdout)}")
        self.ref = replace(self.ref, job_id=job_id)

    def _start_script(self, environ: Mapping[str, str]) -> None:
        with open_private(self.ref.files.batch_output(None)) as out:
            self._script = subprocess.Popen(["bash", self.ref.files.script], env=dict(environ), stdin=subprocess.DEVNULL,
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            created: float | None = psutil.Process(self._script.pid).create_time()
        except psutil.Error:
            created = None  # gone already: end() reports its exit
        self.ref = replace(self.ref, script_pid=self._script.pid, script_create_time=created)

    # --- following --------------------------------------------------------------------------
    def events(self) -> StepEvents:
        return read_events(self.ref.files)

    def srun_err(self, attempt: int) -> str:
        try:
            return Path(self.ref.files.training_err(attempt)).read_text(errors="replace")
        except OSError:
            return ""

    def batch_out(self) -> str:
        return "\n".join(batch_lines(self.ref, 20))

    def nodes(self, attempt: int) -> dict[int, str]:
        """Each training rank's node in ``attempt``, as the tasks' drivers noted it."""
        found = {}
        for task in self.tasks:
            info = read_task_info(self.ref.files, task.task.slug) if task.task.is_training else None
            if info is not None and info.attempt == attempt:
                found[rank_of_task(task.task.type, task.task.index)] = info.node
        return found

    def state(self) -> SlurmJobState | None:
        """The submitted job's state, at most STATE_MAX_AGE old. When Slurm cannot be asked
        (slurmctld busy or restarting) the last answer stands: ``unsure`` says so."""
        if self.ref.job_id and time.monotonic() - self._state_at > STATE_MAX_AGE:
            self._state_at = time.monotonic()
            try:
                self._state, self.unsure = query_job(self.ref.job_id, self._run), False
            except SlurmError:
                self.unsure = True
        return self._state

    def end(self) -> JobEnd | None:
        """How the unit ended, or None while it is pending or runs (COMPLETING counts as running)."""
        if not self.started or self.ref.job_id is None:
            return None
        if self._script is not None:
            code = self._script.poll()
            if code is None:
                return None
            return JobEnd(self.ref.job_id, "EXITED", code, self.stopped, allocation=True, batch_tail=batch_tail(self.ref))
        state = self.state()
        if (state is not None and not state.is_terminal) or (state is None and self.unsure):
            return None
        if state is not None and state.state == "PREEMPTED" and self.plan.requeue:
            return None  # Slurm requeues it: pending again, then the script goes on with the next attempt
        return JobEnd(self.ref.job_id, state.state if state else "UNKNOWN", state.exit_code if state else None,
                      self.stopped, batch_tail=batch_tail(self.ref))

    # --- stopping ---------------------------------------------------------------------------
    def node_down(self, node: str) -> str:
        """What Slurm says of a node it lost under a task, and when it noticed (``jobstate``); "" if nothing."""
        from launcher.engines.slurm.jobstate import describe_node_down, node_down_command, parse_slurmd_timeout

        config = self._run(["scontrol", "show", "config"])
        timeout = parse_slurmd_timeout(config.stdout) if config.returncode == 0 else None
        said = self._run(node_down_command(node))
        note = describe_node_down(node, said.stdout, timeout) if said.returncode == 0 else ""
        if note:
            return note
        # srun hears of the failure when slurmctld finds the node not responding, before it takes it down
        shown = self._run(["scontrol", "show", "node", node])
        if "NOT_RESPONDING" in shown.stdout:
            return (f"; Slurm found {node} not responding at {time.strftime('%H:%M:%S')} "
                    f"(its slurmd silent{f' for SlurmdTimeout = {timeout}' if timeout else ''})")
        return ""

    def stop(self, signum: int) -> None:
        """Stop the unit. Its tasks share it, so a teardown asks once per task: the graceful stop goes
        out once (inside an allocation each SIGINT would make the batch script pass SIGTERM on again)."""
        if self.stopped and signum != signal.SIGKILL:
            return
        self.stopped = True
        stop_job(self.ref, self._run, signum)
        self._state_at = float("-inf")  # look again at once

    def signal_evaluator(self, signum: int) -> None:
        signal_steps(self.ref, self._run, signum, EVALUATOR_ROLE)

    def close(self, timeout: float = 15.0) -> None:
        """Wait a little for a unit that is ending by itself; stop what is still there."""
        if not self.started:
            return
        deadline = time.monotonic() + timeout
        while self.end() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            self._state_at = float("-inf")
        if self.end() is None:
            self.stop(signal.SIGKILL)
        if self._script is not None:
            try:
                self._script.wait(10)
            except subprocess.TimeoutExpired:
                pass


def sbatch_message(text: str) -> str:
    """sbatch's reason in one line, with the fix where we know it."""
    # sbatch follows an unknown option with a pointer to its help: the option is the reason
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith('Try "sbatch --help"')]
    last = lines[-1] if lines else "no output"
    for prefix in ("sbatch: error: Batch job submission failed: ", "sbatch: error: ", "sbatch: fatal: ", "sbatch: ",
                   "allocation failure: "):
        last = last.removeprefix(prefix)
    if "Invalid partition" in last or "invalid partition" in last:
        return f"{last}; the slurm block names a partition this cluster does not have (`sinfo -s` lists them)"
    if "Could not establish a configuration source" in last:
        return (f"{last}; the Slurm client here finds no slurm.conf: set SLURM_CONF to the cluster's slurm.conf, or run "
                "tfl on a login node where `scontrol ping` answers")
    if "Unable to process configuration file" in last:  # which file, and why, came before
        cause = next((ln.split("error: ", 1)[-1] for ln in lines if " file " in ln and "error: " in ln), "")
        return (f"{last}" + (f" ({cause})" if cause else "") + "; set SLURM_CONF to the cluster's slurm.conf, or run tfl "
                "on a login node where `scontrol ping` answers")
    if "unrecognized option" in last or "invalid option" in last:
        return (f"{last}; slurm.sbatch_args holds an option this sbatch does not take (`sbatch --help` lists them; "
                "one option per item, e.g. \"--account=ml\")")
    if "node configuration is not available" in last:
        return (f"{last}; the cluster's nodes that are up cannot hold it: lower slurm.nodes, tasks_per_node or "
                "gpus_per_task (`sinfo -N -l` shows the nodes and their state)")
    return last
