"""The batch script of a Slurm run and the srun lines in it. Pure functions, no I/O.

One allocation holds the run: the script is submitted with ``sbatch`` (a ``slurm`` block in
the cluster file), or run by tfl inside an allocation that exists (``tfl launch --slurm``
under ``salloc`` or a user's own batch script). It resolves the nodes once (Slurm's order
and each node's NodeAddr, see nodes.py), then starts two kinds of step, each running tfl's
small task driver (``python -m launcher.engines.slurm.node.task``), which builds the task's TF_CONFIG
and execs the job:

- the **training group**: ``srun --exact --nodes=N --ntasks=N*T --ntasks-per-node=T
  --distribution=block --kill-on-bad-exit=1``; one failed task ends the step. With
  ``max_restarts`` the script starts the group again as a new step in the same allocation
  (``TFL_ATTEMPT`` counts them), and the job resumes from the shared model dir.
- the **evaluator** (``evaluator: true``): ``srun --exact --nodes=1 --ntasks=1``, started
  first and in the background, outside the training group. It does not decide the job's
  result; once training has ended it gets the evaluator timeout to finish its last
  checkpoint, then its task gets SIGTERM (``scancel --signal`` on its step) and, after the
  grace period, SIGKILL.

An **elastic run** (``--min-tasks``) is submitted with ``--no-kill``: after a training step
failed, the script asks which of its nodes Slurm still gives the job, and starts the next
attempt on those (``launcher.engines.slurm.resize``), or ends below the minimum.

Every step's stderr (srun's own "srun: error: n2: task 1: Exited with exit code 3" lines)
goes to a file per step, and the script notes what it did in the events file
(``launcher.engines.slurm.node.batch``): that is how the launcher follows the run.

Signals to the script: **SIGTERM is a preemption notice** (``slurm.preemption_notice``:
``sbatch --signal=B:TERM@N`` before the time limit, or ``scancel --signal=TERM --batch``):
it goes on to the training step's tasks with ``scancel --signal`` (never to srun, which would
abort its step at once); the job kit saves an agreed checkpoint and every task exits 170
(``contract.PREEMPTED_EXIT_CODE``). **SIGINT stops the run** (``tfl stop`` of a run inside an
allocation): SIGTERM to every step's tasks, and no restart follows.

A training step that ends preempted (status 170, and srun's first failed task exited 170) is
started again without counting against ``max_restarts``, at most ``max_preemptions`` times,
while the job still runs and, after a notice before the time limit, more than
``preemption_notice`` + 60 s are left (else the run ends preempted: ``tfl resume`` goes on).
When Slurm itself preempts the job (``PreemptTime`` set: its tasks
got SIGTERM from Slurm with the partition's GraceTime) the script starts nothing: with
``requeue`` it waits for Slurm to end and requeue the job, whose next run of this script
continues the attempts from the events file (``SLURM_RESTART_COUNT`` > 0 is noted).

The allocation asks for ``--ntasks-per-node=T``, or ``T+1`` with an evaluator: Slurm packs
``--ntasks=N*T+1`` onto as few nodes' CPUs as it can (4+1 on two nodes, not 2+2 and 1 more,
so the training step would not fit), and a heterogeneous job (``#SBATCH hetjob``) stayed
PENDING (Resources) on the test cluster for the 40 s we waited (only the backfill scheduler
starts those). So the evaluator's one task costs a spare task slot (with its CPUs and GPUs)
on every node but the one it lands on. Inside an allocation every allocated task trains,
and the evaluator shares the first node's resources (``srun --overlap``). ``--exact`` lets
the steps run side by side; without it a step takes every CPU of the allocation on its nodes.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.contract import PREEMPTED_EXIT_CODE, SLURM_LAYOUT, SLURM_NODES, run_variables
from launcher.engines.slurm.node.batch import (
    EVALUATOR_ERR,
    EVALUATOR_ROLE,
    EVENT_END,
    EVENT_EVALUATOR_EXIT,
    EVENT_EVALUATOR_STOPPING,
    EVENT_REQUEUED,
    EVENT_TRAINING,
    EVENTS_FILE,
    FIRST_ATTEMPT_FILE,
    TASK_DRIVER,
    TRAINING_ERR,
    TRAINING_ROLE,
    RunFiles,
    step_name,
)
from launcher.engines.slurm.node.errors import SlurmError
from launcher.engines.slurm.node.nodes import format_tasks_per_node
from launcher.engines.slurm.resize import check_lines, elastic_srun, resize_lines, start_lines
from launcher.engines.slurm.settings import SlurmSettings

DEFAULT_MAX_PREEMPTIONS = 100
TRAINING, EVALUATOR = TRAINING_ROLE, EVALUATOR_ROLE
_PLAIN = re.compile(r"[A-Za-z0-9_./+@:,=-]+")  # what an #SBATCH line carries without quoting
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class BatchJob:
    """Everything the batch script depends on."""

    settings: SlurmSettings
    job: str  # absolute path of the job script, on storage every node sees
    job_args: tuple[str, ...]
    run_id: str
    run_dir: str  # on shared storage: logs, progress, model dir, the script's files
    env: Mapping[str, str]  # the description's env; tfl's own variables are added (batch_env)
    python: str  # the python on the nodes, with tfl importable
    cwd: str  # where the tasks start
    max_restarts: int = 0
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS  # training steps ended preempted, restarted without counting
    grace_period: float = 5.0  # SIGTERM -> SIGKILL, for the evaluator's step
    evaluator_timeout: float = 600.0  # after training: the evaluator's time to finish
    virtual_devices: int | None = None
    allocation: bool = False  # True: run by tfl inside an existing allocation, not submitted
    min_tasks: int | None = None  # an elastic run (--min-tasks): after a node failure, go on with the nodes left

    @property
    def job_name(self) -> str:
        return f"tfl-{self.run_id}"

    @property
    def files(self) -> RunFiles:
        return RunFiles(self.run_dir)

    @property
    def tasks_per_node_allocated(self) -> int:
        return self.settings.tasks_per_node + int(self.settings.evaluator)

    def step_name(self, role: str) -> str:
        """A step's name: its role and the run, so that two runs in one allocation never meet."""
        return step_name(role, _plain(self.run_id, 'run id', 'use a job file name of letters, digits, - and _'))


def _plain(value: str, what: str, fix: str) -> str:
    if not _PLAIN.fullmatch(value):
        raise SlurmError(f"{what} '{value}' has characters an #SBATCH line cannot carry (spaces, quotes, %, #); {fix}")
    return value


def sbatch_header(batch: BatchJob) -> list[str]:
    """The ``#SBATCH`` lines: what the allocation is. (Inside an allocation: none.)"""
    if batch.allocation:
        return []
    s = batch.settings
    options = [
        f"--job-name={_plain(batch.job_name, 'run id', 'use a job file name of letters, digits, - and _')}",
        f"--nodes={s.nodes}",
        f"--ntasks-per-node={batch.tasks_per_node_allocated}",
        f"--output={_plain(batch.run_dir, 'run dir', 'set TFL_HOME to a plain path') and batch.files.batch_output_pattern}",
        # Without requeue a node failure or a preemption ends the run, said in one line; with it Slurm
        # starts the script again and the attempts go on (see the module docstring).
        "--requeue" if s.requeue else "--no-requeue",
    ]
    if batch.min_tasks is not None:
        options.append("--no-kill")  # a failed node leaves the job, which goes on with the others (elastic)
    if s.requeue:
        options.append("--open-mode=append")  # the requeued job's output follows the first run's
    if s.preemption_notice is not None:
        options.append(f"--signal=B:TERM@{s.preemption_notice}")  # the batch shell only: it passes it on
    if s.partition:
        options.append(f"--partition={s.partition}")
    if s.time:
        options.append(f"--time={s.time}")
    options += _per_task_options(s)
    return [f"#SBATCH {o}" for o in options]


def _per_task_options(s: SlurmSettings) -> list[str]:
    options = []
    if s.cpus_per_task is not None:
        options.append(f"--cpus-per-task={s.cpus_per_task}")
    if s.gpus_per_task is not None:
        options.append(f"--gpus-per-task={s.gpus_per_task}")
    return options


def driver_argv(batch: BatchJob, role: str) -> list[str]:
    """What every task of a step runs: the driver, which execs the job."""
    return [batch.python, "-u", "-m", TASK_DRIVER, role, batch.job, *batch.job_args]


def training_srun(batch: BatchJob) -> list[str]:
    """The training group's step: every training task, block-distributed, chief = rank 0."""
    s = batch.settings
    return ["srun", "--exact", f"--nodes={s.nodes}", f"--ntasks={s.training_tasks}",
            f"--ntasks-per-node={s.tasks_per_node}", "--distribution=block", "--kill-on-bad-exit=1",
            *_per_task_options(s), f"--job-name={batch.step_name(TRAINING)}", *driver_argv(batch, TRAINING)]


def evaluator_srun(batch: BatchJob) -> list[str]:
    """The evaluator's step: one task on one node, outside the training group."""
    share = ["--overlap"] if batch.allocation else []  # every allocated task trains: share the first node's
    return ["srun", "--exact", *share, "--nodes=1", "--ntasks=1", *_per_task_options(batch.settings),
            f"--job-name={batch.step_name(EVALUATOR)}", *driver_argv(batch, EVALUATOR)]


def nodes_command(batch: BatchJob) -> list[str]:
    """Run once in the batch step: prints the job's nodes and NodeAddrs for ``TFL_SLURM_NODES``."""
    return [batch.python, "-m", TASK_DRIVER, "nodes"]


def batch_env(batch: BatchJob) -> dict[str, str]:
    """What the script exports for every step (srun passes the environment on)."""
    env = {**batch.env, **run_variables(batch.run_id, batch.run_dir, batch.virtual_devices,
                                       evaluator=batch.settings.evaluator),
           SLURM_LAYOUT: format_tasks_per_node([batch.settings.tasks_per_node] * batch.settings.nodes)}
    bad = sorted(k for k in env if not _ENV_NAME.fullmatch(k))
    if bad:
        raise SlurmError(f"env key '{bad[0]}' is not a variable name (letters, digits, _; not starting with a digit); rename it")
    return env


def sbatch_command(batch: BatchJob, *extra: str) -> list[str]:
    """``sbatch --parsable [sbatch_args] [extra]``: the user's options on the command line, as given.
    The script's path (or nothing: the script on stdin) follows."""
    return ["sbatch", "--parsable", *batch.settings.sbatch_args, *extra]


def _steps(batch: BatchJob, *roles: str) -> str:
    """Shell: the ids of this run's steps of the given roles (``squeue -s``, by name)."""
    match = " || ".join(f'$2 == "{batch.step_name(r)}"' for r in roles)
    return f"squeue -h -s -j \"$SLURM_JOB_ID\" -o '%i %j' | awk {shlex.quote(match + ' {print $1}')}"


def _prologue(batch: BatchJob) -> list[str]:
    q = shlex.quote
    roles = (TRAINING, EVALUATOR) if batch.settings.evaluator else (TRAINING,)
    return [
        "set -u",
        "umask 077  # what the script and its tasks write into the run dir stays the owner's",
        f"files={q(batch.files.root)}",
        f"note() {{ echo \"$*\" >> \"$files/{EVENTS_FILE}\"; }}",
        f"cd {q(batch.cwd)} || {{ note {EVENT_END} 1; exit 1; }}",
        *(f"export {k}={q(v)}" for k, v in sorted(batch_env(batch).items())),
        "# a trapped signal interrupts `wait` while the step still runs: wait again",
        "wait_step() {",
        "  local status",
        "  while :; do",
        "    wait \"$1\"; status=$?",
        "    if [ $status -le 128 ]; then return $status; fi",
        "    if ! kill -0 \"$1\" 2>/dev/null; then wait \"$1\"; return $?; fi  # ended: its own status (bash keeps it)",
        "  done",
        "}",
        "# signals reach this run's tasks through scancel --signal (srun would abort its step at once)",
        f"signal_steps() {{ for step in $({_steps(batch, *roles)}); do scancel --signal=\"$1\" \"$step\"; done; }}",
        f"signal_training() {{ for step in $({_steps(batch, TRAINING)}); do scancel --signal=\"$1\" \"$step\"; done; }}",
        "stopping= passing= want_stop= want_notice=",
        "# bash runs a trap inside a running one (a second signal while the first is passed on), and the",
        "# nested run corrupts the outer one's loop (steps skipped, or signalled twice): the traps only note",
        "# what came, and one pass at a time signals the steps, until nothing is left to pass on",
        "pass_signals() {",
        "  [ -z \"$passing\" ] || return 0",
        "  passing=1",
        "  while [ -n \"$want_notice$want_stop\" ]; do",
        "    if [ -n \"$want_stop\" ]; then want_stop= want_notice=; signal_steps TERM",
        "    else want_notice=; signal_training TERM; fi",
        "  done",
        "  passing=",
        "}",
        "# SIGTERM: a preemption notice, for the training tasks (they save an agreed checkpoint and exit "
        f"{PREEMPTED_EXIT_CODE}); SIGINT: stop (once; a notice after it changes nothing)",
        "trap '[ -n \"$stopping\" ] || want_notice=1; pass_signals' TERM",
        "trap '[ -n \"$stopping\" ] || stopping=1 want_stop=1; pass_signals' INT",
        f"{SLURM_NODES}=$({shlex.join(nodes_command(batch))}) || {{ note {EVENT_END} 1; exit 1; }}",
        f"export {SLURM_NODES}",
    ]


def _policy_functions() -> list[str]:
    """Shell: what the restart policy asks of the step's srun stderr and of Slurm."""
    return [
        "# preempted: srun's first failed task exited with the preempted code (launcher.engines.slurm.outcome agrees)",
        f"preempted_step() {{ local first; first=$(grep -o -m1 'Exited with exit code [0-9]*' \"$1\" 2>/dev/null); "
        f"[ \"${{first##* }}\" = {PREEMPTED_EXIT_CODE} ]; }}",
        "job_running() { [ \"$(squeue -h -j \"$SLURM_JOB_ID\" -o %T 2>/dev/null)\" = RUNNING ]; }",
        "slurm_preempts() { scontrol show job -o \"$SLURM_JOB_ID\" 2>/dev/null | grep -q ' PreemptTime=[0-9]'; }",
        "# the job's time left in seconds (squeue %L: [D-]H:MM:SS, M:SS or S), -1 without a limit",
        "time_left() {",
        "  local t d=0 a b c; t=$(squeue -h -j \"$SLURM_JOB_ID\" -o %L 2>/dev/null)",
        "  case $t in *[0-9]*) ;; *) echo -1; return ;; esac",
        "  case $t in *-*) d=${t%%-*}; t=${t#*-} ;; esac",
        "  IFS=: read -r a b c <<< \"$t\"",
        "  if [ -z \"$b\" ]; then c=$a a=0 b=0; elif [ -z \"$c\" ]; then c=$b b=$a a=0; fi",
        "  echo $(( ((10#$d * 24 + 10#$a) * 60 + 10#$b) * 60 + 10#$c ))",
        "}",
        "# the first attempt: 0, or the next one after `tfl resume`; after a requeue the attempts go on from",
        "# the events file: next attempt, preemptions, failures (those since the first attempt)",
        f"first=$(cat \"$files/{FIRST_ATTEMPT_FILE}\" 2>/dev/null); case $first in ''|*[!0-9]*) first=0 ;; esac",
        "counts=$(awk -v first=\"$first\" '$1 == \"training\" && $3 == \"start\" { n = $2 + 1 } "
        f"$1 == \"training\" && $3 == \"exit\" && $2 >= first && $4 == {PREEMPTED_EXIT_CODE} {{ p++ }} "
        f"$1 == \"training\" && $3 == \"exit\" && $2 >= first && $4 != 0 && $4 != {PREEMPTED_EXIT_CODE} {{ f++ }} "
        "END { print n + 0, p + 0, f + 0 }' \"$files/events\" 2>/dev/null)",
        "read -r attempt preempted failed <<< \"${counts:-0 0 0}\"",
        "if [ $attempt -lt $first ]; then attempt=$first; fi",
        f"if [ \"${{SLURM_RESTART_COUNT:-0}}\" -gt 0 ] && [ $attempt -gt 0 ]; then note {EVENT_REQUEUED} \"$SLURM_RESTART_COUNT\"; fi",
    ]


def _time_limit_check(batch: BatchJob) -> list[str]:
    """After a notice before the time limit, a restart would have only the notice's time: the run
    ends preempted instead (the agreed checkpoint is on disk; ``tfl resume`` goes on)."""
    notice = batch.settings.preemption_notice
    if notice is None or batch.allocation:
        return []
    # Slurm may send the signal up to 60 s before the asked time.
    return [f"    left=$(time_left); if [ $left -ge 0 ] && [ $left -le {notice + 60} ]; then",
            "      echo \"tfl: training preempted $left s before the time limit: too little to restart; "
            "tfl resume continues the run\" >&2; break",
            "    fi"]


def _training_loop(batch: BatchJob) -> list[str]:
    err_path = f'"$files/{TRAINING_ERR.format(attempt="$attempt")}"'
    requeue = batch.settings.requeue and not batch.allocation
    elastic = batch.min_tasks is not None
    srun = elastic_srun(training_srun(batch), batch.settings.nodes, batch.settings.training_tasks) if elastic \
        else shlex.join(training_srun(batch))
    resize = resize_lines(batch.min_tasks) if batch.min_tasks is not None else []
    return [
        *_policy_functions(),
        *(start_lines(batch.settings.nodes, batch.settings.training_tasks) if elastic else []),
        "while :; do",
        f"  note {EVENT_TRAINING} $attempt start",
        f"  TFL_ATTEMPT=$attempt {srun} 2> {err_path} &",
        "  wait_step $!; status=$?",
        # The step's first task to end saved the agreed checkpoint and left: srun then ended the others
        # (--kill-on-bad-exit), which may make its own status 143. The step was preempted all the same.
        f"  if [ $status -ne 0 ] && [ -z \"$stopping\" ] && preempted_step {err_path}; then status={PREEMPTED_EXIT_CODE}; fi",
        *(check_lines([batch.python, "-m", TASK_DRIVER], err_path) if elastic else []),
        f"  note {EVENT_TRAINING} $attempt exit $status",
        "  if [ $status -eq 0 ] || [ -n \"$stopping\" ]; then break; fi",
        *resize,
        f"  {'elif' if resize else 'if'} [ $status -eq {PREEMPTED_EXIT_CODE} ] && preempted_step {err_path}; then",
        "    preempted=$((preempted + 1))",
        f"    if [ $preempted -gt {batch.max_preemptions} ]; then",
        f"      echo \"tfl: training preempted $preempted times, more than --max-preemptions {batch.max_preemptions}\" >&2; break",
        "    fi",
        "    if slurm_preempts; then",
        *(["      echo \"tfl: Slurm preempts job $SLURM_JOB_ID; it will be requeued and go on from the checkpoint\" >&2",
           "      while :; do sleep 1; done  # Slurm ends this script at the end of GraceTime, then requeues the job"]
          if requeue else
          ["      echo \"tfl: Slurm preempts job $SLURM_JOB_ID (not requeued: the slurm block has no \\\"requeue\\\": true)\" >&2",
           "      break"]),
        "    fi",
        *_time_limit_check(batch),
        f"    why=\"training preempted; restart without counting ($preempted of at most {batch.max_preemptions} preemptions)\"",
        "  else",
        "    failed=$((failed + 1))",
        f"    if [ $failed -gt {batch.max_restarts} ]; then break; fi",
        f"    why=\"training step failed (exit $status); restart $failed of {batch.max_restarts}\"",
        "  fi",
        "  if ! job_running; then break; fi  # cancelled or out of time: Slurm ends the job",
        "  attempt=$((attempt + 1))",
        "  echo \"tfl: $why\" >&2",
        "done",
    ]


def _wait_while(alive: str, seconds: float) -> str:
    ticks = max(0, round(seconds * 10))
    return f"waited=0; while {alive} && [ $waited -lt {ticks} ]; do sleep 0.1; waited=$((waited + 1)); done"


def _evaluator_end(batch: BatchJob) -> list[str]:
    """After training: the evaluator's time to finish its last checkpoint, then SIGTERM, grace, SIGKILL."""
    alive = "kill -0 $evaluator 2>/dev/null"
    find = _steps(batch, EVALUATOR)
    return [
        "# training has ended: the evaluator may finish its last checkpoint, then it is stopped (it does not decide the result)",
        _wait_while(alive, batch.evaluator_timeout),
        f"if {alive}; then",
        f"  note {EVENT_EVALUATOR_STOPPING}",
        f"  for step in $({find}); do scancel --signal=TERM \"$step\"; done",
        f"  {_wait_while(alive, batch.grace_period)}",
        f"  if {alive}; then for step in $({find}); do scancel --signal=KILL \"$step\"; done; fi",
        "fi",
        "wait_step $evaluator",
    ]


def render_batch_script(batch: BatchJob) -> str:
    """The whole batch script (also what ``--dry-run`` shows)."""
    s = batch.settings
    lines = [
        "#!/bin/bash",
        f"# tfl run {batch.run_id}: {shlex.join([batch.job, *batch.job_args])}",
        f"# training: {s.nodes} node(s) x {s.tasks_per_node} task(s), chief = first task"
        + ("; evaluator: a separate step" if s.evaluator else "")
        + ("; inside an allocation" if batch.allocation else ""),
        *sbatch_header(batch),
        *_prologue(batch),
    ]
    if s.evaluator:
        lines += [f"{{ {shlex.join(evaluator_srun(batch))} 2> \"$files/{EVALUATOR_ERR}\"; note {EVENT_EVALUATOR_EXIT} $?; }} &",
                  "evaluator=$!"]
    lines += _training_loop(batch)
    if s.evaluator:
        lines += _evaluator_end(batch)
    lines += [f"note {EVENT_END} $status", "exit $status"]
    return "\n".join(lines) + "\n"
