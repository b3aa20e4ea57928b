"""The sbatch script of a run and the srun lines in it. Pure functions, no I/O.

One allocation holds the run. The batch script resolves the nodes once (Slurm's order and
each node's NodeAddr, see nodes.py), then starts two kinds of step, each running tfl's small
task driver (``python -m launcher.slurm.task``), which builds the task's TF_CONFIG and
execs the job:

- the **training group**: ``srun --exact --nodes=N --ntasks=N*T --ntasks-per-node=T
  --distribution=block --kill-on-bad-exit=1``; one failed task ends the step. With
  ``max_restarts`` the script starts the group again as a new step in the same allocation,
  and the job resumes from the shared model dir.
- the **evaluator** (``evaluator: true``): ``srun --exact --nodes=1 --ntasks=1``, started
  first and in the background, outside the training group. It does not decide the job's
  result; once training has ended the script sends its task SIGTERM (``scancel --signal``
  on its step) and aborts the step if it is still there after a grace period.

The allocation asks for ``--ntasks-per-node=T``, or ``T+1`` with an evaluator: Slurm packs
``--ntasks=N*T+1`` onto as few nodes' CPUs as it can (4+1 on two nodes, not 2+2 and 1 more,
so the training step would not fit), and a heterogeneous job (``#SBATCH hetjob``) stayed
PENDING (Resources) on the test cluster for the 40 s we waited (only the backfill scheduler
starts those). So the evaluator's one task costs a spare task slot (with its CPUs and GPUs)
on every node but the one it lands on. ``--exact`` lets the two steps run side by side;
without it a step takes every CPU of the allocation on its nodes.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.slurm.errors import SlurmError
from launcher.slurm.nodes import LAYOUT_ENV, NODES_ENV, format_tasks_per_node
from launcher.slurm.settings import SlurmSettings

TASK_DRIVER = "launcher.slurm.task"
_PLAIN = re.compile(r"[A-Za-z0-9_./+@:,=-]+")  # what an #SBATCH line carries without quoting
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
EVALUATOR_GRACE_S = 30  # after SIGTERM, the evaluator's time to finish before its step is aborted


@dataclass(frozen=True)
class BatchJob:
    """Everything the batch script depends on."""

    settings: SlurmSettings
    job: str  # absolute path of the job script, on storage every node sees
    job_args: tuple[str, ...]
    run_id: str
    run_dir: str  # on shared storage: logs, progress, model dir
    env: Mapping[str, str]  # every task's environment: the description's env and tfl's values
    python: str  # the python on the nodes, with tfl importable
    cwd: str  # where the tasks start
    max_restarts: int = 0

    @property
    def job_name(self) -> str:
        return f"tfl-{self.run_id}"

    @property
    def tasks_per_node_allocated(self) -> int:
        return self.settings.tasks_per_node + int(self.settings.evaluator)


def _plain(value: str, what: str, fix: str) -> str:
    if not _PLAIN.fullmatch(value):
        raise SlurmError(f"{what} '{value}' has characters an #SBATCH line cannot carry (spaces, quotes, %, #); {fix}")
    return value


def sbatch_header(batch: BatchJob) -> list[str]:
    """The ``#SBATCH`` lines: what the allocation is."""
    s = batch.settings
    options = [
        f"--job-name={_plain(batch.job_name, 'run id', 'use a job file name of letters, digits, - and _')}",
        f"--nodes={s.nodes}",
        f"--ntasks-per-node={batch.tasks_per_node_allocated}",
        f"--output={_plain(batch.run_dir, 'run dir', 'set TFL_HOME to a plain path')}/slurm-%j.out",
    ]
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


def _driver(batch: BatchJob, role: str) -> list[str]:
    return [batch.python, "-u", "-m", TASK_DRIVER, role, batch.job, *batch.job_args]


def training_srun(batch: BatchJob) -> list[str]:
    """The training group's step: every training task, block-distributed, chief = rank 0."""
    s = batch.settings
    return ["srun", "--exact", f"--nodes={s.nodes}", f"--ntasks={s.training_tasks}",
            f"--ntasks-per-node={s.tasks_per_node}", "--distribution=block", "--kill-on-bad-exit=1",
            *_per_task_options(s), "--job-name=training", *_driver(batch, "training")]


def evaluator_srun(batch: BatchJob) -> list[str]:
    """The evaluator's step: one task on one node, outside the training group."""
    return ["srun", "--exact", "--nodes=1", "--ntasks=1", *_per_task_options(batch.settings),
            "--job-name=evaluator", *_driver(batch, "evaluator")]


def nodes_command(batch: BatchJob) -> list[str]:
    """Run once in the batch step: prints the job's nodes and NodeAddrs for ``TFL_SLURM_NODES``."""
    return [batch.python, "-m", TASK_DRIVER, "nodes"]


def batch_env(batch: BatchJob) -> dict[str, str]:
    """What the script exports for every step (srun passes the environment on)."""
    env = {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1", **batch.env,
           "TFL_RUN_ID": batch.run_id, "TFL_RUN_DIR": batch.run_dir,
           LAYOUT_ENV: format_tasks_per_node([batch.settings.tasks_per_node] * batch.settings.nodes)}
    bad = sorted(k for k in env if not _ENV_NAME.fullmatch(k))
    if bad:
        raise SlurmError(f"env key '{bad[0]}' is not a variable name (letters, digits, _; not starting with a digit); rename it")
    return env


def sbatch_command(batch: BatchJob, script_path: str) -> list[str]:
    """``sbatch --parsable [sbatch_args] SCRIPT``: the user's options on the command line, as given."""
    return ["sbatch", "--parsable", *batch.settings.sbatch_args, script_path]


def _stop_evaluator() -> list[str]:
    """SIGTERM to the evaluator's task, then its step aborted if it is still there after a grace
    period. ``scancel --signal`` signals a step's tasks and nothing else; SIGTERM to srun
    itself would abort the step with SIGKILL at once ("srun: forcing job termination")."""
    find = "squeue -h -s -j \"$SLURM_JOB_ID\" -o '%i %j' | awk '$2 == \"evaluator\" {print $1}'"
    ticks = EVALUATOR_GRACE_S * 10
    return [
        "# training has ended: stop the evaluator (it does not decide the result)",
        f"for step in $({find}); do scancel --signal=TERM \"$step\"; done",
        "waited=0",
        f"while kill -0 $evaluator 2>/dev/null && [ $waited -lt {ticks} ]; do sleep 0.1; waited=$((waited + 1)); done",
        "kill -TERM $evaluator 2>/dev/null",
        "wait $evaluator",
    ]


def render_batch_script(batch: BatchJob) -> str:
    """The whole sbatch script (also what ``--dry-run`` shows)."""
    s = batch.settings
    q = shlex.quote
    lines = [
        "#!/bin/bash",
        f"# tfl run {batch.run_id}: {shlex.join([batch.job, *batch.job_args])}",
        f"# training: {s.nodes} node(s) x {s.tasks_per_node} task(s), chief = first task"
        + ("; evaluator: a separate step" if s.evaluator else ""),
        *sbatch_header(batch),
        "set -u",
        f"cd {q(batch.cwd)} || exit 1",
        *(f"export {k}={q(v)}" for k, v in sorted(batch_env(batch).items())),
        f"{NODES_ENV}=$({shlex.join(nodes_command(batch))}) || exit 1",
        f"export {NODES_ENV}",
    ]
    if s.evaluator:
        lines += [f"{shlex.join(evaluator_srun(batch))} &", "evaluator=$!"]
    lines += [
        "attempt=0",
        "while :; do",
        f"  TFL_ATTEMPT=$attempt {shlex.join(training_srun(batch))}",
        "  status=$?",
        f"  if [ $status -eq 0 ] || [ $attempt -ge {batch.max_restarts} ]; then break; fi",
        "  attempt=$((attempt + 1))",
        f"  echo \"tfl: training step failed (exit $status); restart $attempt of {batch.max_restarts}\" >&2",
        "done",
    ]
    if s.evaluator:
        lines += _stop_evaluator()
    lines.append("exit $status")
    return "\n".join(lines) + "\n"
