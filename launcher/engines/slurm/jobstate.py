"""A Slurm job's state from ``squeue``, then ``sacct``, then ``scontrol show job``.

Only ``-o``/``--format`` output is read, never ``--json`` (its shape differs between Slurm
versions). The commands run through a ``Runner`` that tests replace, so the fallback order
is tested without Slurm:

1. ``squeue -h -t all -j ID -o '%i|%T|%r|%N'``: pending and running jobs, and ended ones
   while slurmctld still holds them (MinJobAge, 300 s by default). No exit code.
2. ``sacct -n -P -X -j ID -o JobIDRaw,State,ExitCode,NodeList,Reason``: jobs of any age,
   where accounting is enabled. Without slurmdbd it prints "Slurm accounting storage is
   disabled" and exits 1: skipped.
3. ``scontrol show job -o ID``: what slurmctld still holds, with the exit code.

None of them knowing the job ("Invalid job id specified") gives None; any other failure
(slurmctld down, Slurm not configured) is a SlurmError with Slurm's own last line.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.engines.slurm.node.errors import SlurmError

SQUEUE_FORMAT = "%i|%T|%r|%N"
SACCT_FIELDS = "JobIDRaw,State,ExitCode,NodeList,Reason"
STEP_FORMAT = "%i|%j|%N"
# Job states after which nothing of the job runs any more (squeue/sacct/scontrol spell them alike).
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
    "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
})
_UNKNOWN_JOB = "Invalid job id specified"
_NO_ACCOUNTING = "accounting storage is disabled"


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


Runner = Callable[[Sequence[str]], CommandResult]


@dataclass(frozen=True)
class SlurmJobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ...
    reason: str | None  # why it is pending (e.g. Resources) or why it ended; None for Slurm's "None"
    nodelist: str | None  # compressed, e.g. n[1-2]; None before it has nodes
    exit_code: int | None  # the batch script's exit status, where the source tells it
    signal: int | None  # the signal that ended it, where the source tells it
    source: str  # squeue, sacct or scontrol

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def is_pending(self) -> bool:
        return self.state == "PENDING"


@dataclass(frozen=True)
class SlurmStep:
    step_id: str  # e.g. 25.0, 25.batch
    name: str  # training, evaluator, batch
    nodelist: str


# The umask Slurm gives a job it submits (sbatch passes it on as SLURM_UMASK, which it takes from the environment
# when set, else from its own umask). slurmstepd creates the job's output file (``--output``: the run dir's
# batch-<id>.out) under it before the batch script's own ``umask 077`` runs: under the user's 022 it was 0644.
SUBMIT_UMASK = "0077"


def run_command(argv: Sequence[str]) -> CommandResult:
    """The real runner: the command's status and output (a missing command is status 127)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60,
                              env={**os.environ, "SLURM_UMASK": SUBMIT_UMASK})
    except FileNotFoundError:
        return CommandResult(127, "", f"{argv[0]}: command not found")
    except subprocess.TimeoutExpired:
        return CommandResult(124, "", f"{argv[0]} did not answer within 60 s")
    return CommandResult(done.returncode, done.stdout, done.stderr)


def squeue_command(job_id: str) -> list[str]:
    return ["squeue", "-h", "-t", "all", "-j", job_id, "-o", SQUEUE_FORMAT]


def sacct_command(job_id: str) -> list[str]:
    return ["sacct", "-n", "-P", "-X", "-j", job_id, "-o", SACCT_FIELDS]


def scontrol_command(job_id: str) -> list[str]:
    return ["scontrol", "show", "job", "-o", job_id]


def steps_command(job_id: str) -> list[str]:
    return ["squeue", "-h", "-s", "-j", job_id, "-o", STEP_FORMAT]


def _none(value: str) -> str | None:
    value = value.strip()
    return None if value in ("", "None", "(null)") else value


def _exit_code(text: str) -> tuple[int | None, int | None]:
    """Slurm's ``EXIT:SIGNAL`` (e.g. ``3:0``, ``0:15``)."""
    match = re.fullmatch(r"(\d+):(\d+)", text.strip())
    return (int(match[1]), int(match[2])) if match else (None, None)


def parse_squeue(text: str, job_id: str) -> SlurmJobState | None:
    """``squeue -o SQUEUE_FORMAT`` output -> the job's state, or None if it is not listed."""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 4 and fields[0] == job_id:
            reason = _none(fields[2])
            return SlurmJobState(job_id, fields[1], reason, _none(fields[3]), None, None, "squeue")
    return None


def parse_sacct(text: str, job_id: str) -> SlurmJobState | None:
    """``sacct -n -P -o SACCT_FIELDS`` output -> the job's state ("CANCELLED by 0" is CANCELLED)."""
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 5 and fields[0] == job_id:
            code, sig = _exit_code(fields[2])
            state = fields[1].split()[0] if fields[1].strip() else "UNKNOWN"
            nodes = None if fields[3] in ("None assigned", "") else fields[3]
            return SlurmJobState(job_id, state, _none(fields[4]), nodes, code, sig, "sacct")
    return None


def parse_scontrol_job(text: str) -> SlurmJobState | None:
    """``scontrol show job -o ID`` output (``Key=Value`` words; values may hold spaces)."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), None)
    if line is None:
        return None
    values = dict(re.findall(r"(?:^|\s)([A-Za-z][A-Za-z/:_]*)=(.*?)(?=\s[A-Za-z][A-Za-z/:_]*=|\s*$)", line))
    code, sig = _exit_code(values.get("ExitCode", ""))
    return SlurmJobState(values["JobId"], values.get("JobState", "UNKNOWN"), _none(values.get("Reason", "")),
                         _none(values.get("NodeList", "")), code, sig, "scontrol")


def parse_steps(text: str) -> list[SlurmStep]:
    """``squeue -s -o STEP_FORMAT`` output -> the job's running steps."""
    steps = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 3:
            steps.append(SlurmStep(*fields))
    return steps


@dataclass(frozen=True)
class SrunTaskFailure:
    """One ``srun: error: NODE: task(s) RANKS: WHAT`` line: a task of a step that ended badly."""

    node: str
    ranks: tuple[int, ...]
    what: str  # "Exited with exit code 3", "Terminated", "Killed", ...
    exit_code: int | None  # for "Exited with exit code N"


_SRUN_TASK_ERROR = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<ranks>[\d,-]+): (?P<what>.+)")


def _ranks(text: str) -> tuple[int, ...]:
    ranks: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        ranks += range(int(low), int(high or low) + 1)
    return tuple(ranks)


def parse_srun_failures(text: str) -> list[SrunTaskFailure]:
    """srun's stderr -> its failed tasks, in the order srun saw them.

    With ``--kill-on-bad-exit`` srun's own status is the largest among its tasks (143 for the
    tasks it then terminated), not the failed task's; the first failure here with an exit code
    is the root cause.
    """
    failures = []
    for line in text.splitlines():
        match = _SRUN_TASK_ERROR.search(line)
        if match:
            code = re.fullmatch(r"Exited with exit code (\d+)", match["what"].strip())
            failures.append(SrunTaskFailure(match["node"], _ranks(match["ranks"]), match["what"].strip(),
                                            int(code[1]) if code else None))
    return failures


def root_cause(failures: Sequence[SrunTaskFailure]) -> SrunTaskFailure | None:
    """The first failure srun did not cause itself, else the first failure.

    srun ends the other tasks with SIGTERM (``--kill-on-bad-exit``: "Terminated"), so those are
    consequences wherever their line falls. Every other failure counts in srun's order, signals
    included: a task killed from outside ("Killed") before a survivor exits 1 is the cause (the
    job kit takes srun's SIGTERM as a notice and waits for a step, in which time the survivor's
    collective may fail on the dead peer first: exit 1, not "Terminated").
    """
    return next((f for f in failures if f.what != "Terminated"), failures[0] if failures else None)


def _failure(argv: Sequence[str], done: CommandResult) -> SlurmError:
    if done.returncode == 127:
        return SlurmError(f"{argv[0]} is not on PATH; install Slurm's client commands (slurm-client) or fix PATH")
    lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return SlurmError(f"{' '.join(argv)} exited {done.returncode}: {lines[-1] if lines else 'no output'}")


def query_job(job_id: str, run: Runner = run_command) -> SlurmJobState | None:
    """The job's state from the first source that knows it, or None if none does."""
    argv = squeue_command(job_id)
    done = run(argv)
    if done.returncode == 0 and (found := parse_squeue(done.stdout, job_id)):
        return found
    if done.returncode != 0 and _UNKNOWN_JOB not in done.stderr:
        raise _failure(argv, done)
    argv = sacct_command(job_id)
    done = run(argv)
    if done.returncode == 0 and (found := parse_sacct(done.stdout, job_id)):
        return found
    if done.returncode not in (0, 127) and _NO_ACCOUNTING not in done.stderr + done.stdout:
        raise _failure(argv, done)
    argv = scontrol_command(job_id)
    done = run(argv)
    if done.returncode == 0:
        return parse_scontrol_job(done.stdout)
    if _UNKNOWN_JOB in done.stderr:
        return None
    raise _failure(argv, done)


def query_steps(job_id: str, run: Runner = run_command) -> list[SlurmStep]:
    argv = steps_command(job_id)
    done = run(argv)
    if done.returncode == 0:
        return parse_steps(done.stdout)
    if _UNKNOWN_JOB in done.stderr:
        return []
    raise _failure(argv, done)


def node_down_command(node: str) -> list[str]:
    """Why and since when Slurm holds ``node`` down (``sinfo -R``: reason, its time) and how long
    it waits on a silent slurmd (SlurmdTimeout), in one call's worth of output each."""
    return ["sinfo", "-h", "-R", "-n", node, "-o", "%E|%H"]


def describe_node_down(node: str, sinfo_out: str, slurmd_timeout: str | None) -> str:
    """``; Slurm marked n2 down at 01:02:03 (Not responding), ...`` or "" when sinfo says nothing."""
    line = next((x for x in sinfo_out.splitlines() if "|" in x), "")
    if not line:
        return ""
    reason, when = (part.strip() for part in line.rsplit("|", 1))
    clock = when.split("T", 1)[1] if "T" in when else when
    silent = reason.startswith("Not responding") and slurmd_timeout
    noticed = f", at most SlurmdTimeout = {slurmd_timeout} after its slurmd fell silent" if silent else ""
    return f"; Slurm marked {node} down at {clock} ({reason}{noticed})"


def parse_slurmd_timeout(config_out: str) -> str | None:
    """SlurmdTimeout from ``scontrol show config`` ("300 sec")."""
    for line in config_out.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmdTimeout":
            return value.strip()
    return None
