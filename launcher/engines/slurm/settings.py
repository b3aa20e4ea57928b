"""The ``slurm`` block of a cluster description, validated with pydantic.

A Slurm description has a ``slurm`` block where an SSH/local one has ``cluster``::

    {"slurm": {"nodes": 2, "tasks_per_node": 1, "evaluator": true, "partition": "debug",
               "time": "01:00:00", "gpus_per_task": 1, "sbatch_args": ["--account=ml"],
               "preemption_notice": 120, "requeue": true},
     "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}}

Slurm decides the hosts, so there are no ``hosts``, ``ssh`` or ``devices`` keys. Values are
taken as written (``"2"`` is not a count, ``1`` is not ``true``); every error is one line
naming the field and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from launcher.describe.fields import describe_error
from launcher.describe.spec import ElasticSettings
from launcher.engines.slurm.node.errors import SlurmLayoutError
from launcher.engines.slurm.node.nodes import MAX_TASKS_PER_ADDRESS, parse_tasks_per_node
from launcher.errors import ClusterFileError, UsageError

MAX_NOTICE_SECONDS = 65535
_TIME = re.compile(r"(\d+-)?\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE|unlimited|infinite")
_PARTITION = re.compile(r"[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
# sbatch options tfl sets itself, each with the field to use instead.
_OWNED_OPTIONS = {
    "-N": "slurm.nodes", "--nodes": "slurm.nodes",
    "-n": "slurm.tasks_per_node", "--ntasks": "slurm.tasks_per_node", "--ntasks-per-node": "slurm.tasks_per_node",
    "-p": "slurm.partition", "--partition": "slurm.partition",
    "-t": "slurm.time", "--time": "slurm.time",
    "--gpus-per-task": "slurm.gpus_per_task",
    "-c": "slurm.cpus_per_task", "--cpus-per-task": "slurm.cpus_per_task",
    "-J": "nothing (tfl names the job after the run)", "--job-name": "nothing (tfl names the job after the run)",
    "-o": "nothing (tfl writes the logs into the run dir)", "--output": "nothing (tfl writes the logs into the run dir)",
    "-e": "nothing (tfl writes the logs into the run dir)", "--error": "nothing (tfl writes the logs into the run dir)",
    "-D": "nothing (tasks start in the launch directory)", "--chdir": "nothing (tasks start in the launch directory)",
    "--export": "the top-level env (tfl passes the environment to every task)",
    "-a": "nothing (one run is one job)", "--array": "nothing (one run is one job)",
    "--wrap": "nothing (tfl writes the batch script)", "--parsable": "nothing (tfl passes it)",
    "--signal": "slurm.preemption_notice", "--requeue": "slurm.requeue", "--no-requeue": "slurm.requeue",
    "-W": "nothing (tfl follows the job)", "--wait": "nothing (tfl follows the job)",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def _count(value: object, example: str, *, low: int = 1, high: int | None = None) -> object:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{value!r} is not a whole number (write e.g. {example})")
    if value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{value} is out of range; it must be {span} (e.g. {example})")
    return value


class SlurmSettings(_Strict):
    """How to ask Slurm for the run: one allocation, a training group and maybe an evaluator."""

    nodes: int = Field(description="nodes for the training group (one allocation)")
    tasks_per_node: int = Field(1, description="training tasks per node; the first task is the chief")
    evaluator: bool = Field(False, description="also run a sidecar evaluator, as a separate step")
    partition: str | None = Field(None, description="partition to submit to (default: the cluster's default)")
    time: str | None = Field(None, description="time limit, as sbatch --time takes it (e.g. 01:00:00, 2-00:00:00)")
    gpus_per_task: int | None = Field(None, description="GPUs per task (sbatch/srun --gpus-per-task); omit for CPU only")
    cpus_per_task: int | None = Field(None, description="CPUs per task (sbatch/srun --cpus-per-task; default: Slurm's, often 1)")
    sbatch_args: list[str] = Field(default_factory=list, description="extra sbatch options, one per item (e.g. \"--account=ml\")")
    preemption_notice: int | None = Field(None, description="seconds before the job's time limit that tfl's batch script "
                                          "gets SIGTERM (sbatch --signal=B:TERM@N) and passes it to the training tasks, "
                                          "which save an agreed checkpoint and exit 170; omit for none")
    requeue: bool = Field(False, description="let Slurm requeue the job when it is preempted (PreemptMode=REQUEUE) or its "
                                             "node fails; the job resumes from the model dir as the next attempt")

    @field_validator("nodes", mode="before")
    @classmethod
    def _nodes(cls, value: object) -> object:
        return _count(value, "2")

    @field_validator("tasks_per_node", mode="before")
    @classmethod
    def _tasks_per_node(cls, value: object) -> object:
        # Each task needs its own port slot on its node (see nodes.task_ports).
        return _count(value, "1", high=MAX_TASKS_PER_ADDRESS)

    @field_validator("gpus_per_task", "cpus_per_task", mode="before")
    @classmethod
    def _per_task(cls, value: object) -> object:
        return None if value is None else _count(value, "1 (or leave the key out)")

    @field_validator("preemption_notice", mode="before")
    @classmethod
    def _preemption_notice(cls, value: object) -> object:
        # sbatch keeps sig_time in 16 bits; Slurm may send the signal up to 60 s early anyway.
        return None if value is None else _count(value, "120 (seconds; or leave the key out)", high=MAX_NOTICE_SECONDS)

    @field_validator("evaluator", "requeue", mode="before")
    @classmethod
    def _evaluator(cls, value: object) -> object:
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME.fullmatch(value):
            raise ValueError(f"'{value}' is not a Slurm time limit (write minutes, [days-]hours:minutes:seconds "
                             "or days-hours, e.g. \"01:00:00\")")
        return value

    @field_validator("partition")
    @classmethod
    def _partition(cls, value: str | None) -> str | None:
        if value is not None and not _PARTITION.fullmatch(value):
            raise ValueError(f"'{value}' is not a partition name (letters, digits, '_', '.', '-'; "
                             "several separated by commas; `sinfo -s` lists them)")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, args: list[str]) -> list[str]:
        for i, arg in enumerate(args):
            problem = sbatch_arg_problem(arg)
            if problem:
                raise ValueError(f"item {i} {problem}")
        return args

    @property
    def training_tasks(self) -> int:
        return self.nodes * self.tasks_per_node


def sbatch_arg_problem(arg: str) -> str | None:
    """Why one ``sbatch_args`` item cannot be used, or None."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return f"'{arg}' is not an option; write each option with its value as one item (e.g. \"--account=ml\")"
    if any(c in arg for c in "\n\r\0"):
        return f"{arg!r} holds a line break; write the option on one line"
    name = re.split(r"[=\s]", arg, maxsplit=1)[0] if arg.startswith("--") else arg[:2]
    if name in _OWNED_OPTIONS:
        return f"'{arg}': tfl sets {name} itself; use {_OWNED_OPTIONS[name]} instead"
    # Each item is one argument of sbatch: "--account ml" is an option of that whole name, and
    # "-A ml" gives -A the value " ml", space and all.
    if arg.startswith("--") and re.match(r"--[^=\s]+\s", arg):
        return f"'{arg}' has its value after a space; write it after '=' (\"{name}={arg[len(name):].strip()}\")"
    if not arg.startswith("--") and arg[2:3].isspace():
        return f"'{arg}' has its value after a space; write it right after the letter (\"{name}{arg[2:].strip()}\")"
    return None


class SlurmClusterSpec(_Strict):
    """A cluster description whose tasks Slurm places."""

    kind: ClassVar[str] = "slurm"  # its description kind (launcher.describe.kinds)
    slurm: SlurmSettings
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for every task")
    elastic: ElasticSettings | None = Field(None, description="go on with the nodes left after a node failure "
                                                              "(like tfl launch --min-tasks)")

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        reserved = sorted(k for k in env if k == "TF_CONFIG" or k.startswith("TFL_"))
        if reserved:
            raise ValueError(f"sets {reserved[0]}, which tfl sets for each task; remove it")
        return env

    @field_validator("elastic")
    @classmethod
    def _elastic(cls, elastic: ElasticSettings | None) -> ElasticSettings | None:
        if elastic is not None and elastic.evaluator_moves_to is not None:
            raise ValueError("evaluator_moves_to is for a cluster file of hosts (Slurm picks the nodes, and a node it "
                             "takes out of the job does not come back); remove it")
        return elastic

    @model_validator(mode="before")
    @classmethod
    def _not_both(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in ("cluster", "hosts", "ssh", "devices"):
                if key in data:
                    raise ValueError(f"'{key}' cannot be used with 'slurm' (Slurm places the tasks); remove '{key}'")
        return data


def parse_slurm_cluster(data: Any, name: str = "cluster") -> SlurmClusterSpec:
    """Parsed JSON -> SlurmClusterSpec, or ClusterFileError naming ``name``, the field and the fix."""
    if not isinstance(data, dict):
        raise ClusterFileError(f"{name}: the file must hold a JSON object with a 'slurm' key")
    try:
        return SlurmClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise ClusterFileError(f"{name}: {describe_error(exc, SlurmClusterSpec)}") from None


class AllocationSpec(SlurmClusterSpec):
    """``tfl launch --slurm``: the allocation tfl runs inside (``salloc``, a user's batch
    script), read from Slurm's variables. Every allocated task trains."""

    job_id: str = Field(description="the allocation's job id (SLURM_JOB_ID)")


_OUTSIDE = ("--slurm runs inside a Slurm allocation, and SLURM_JOB_ID is not set; run it under salloc or in a batch "
            "script (e.g. `salloc -N 2 --ntasks-per-node 1 tfl launch JOB --slurm`), or submit with --cluster FILE "
            "holding a 'slurm' block")


def allocation_cluster(environ: Mapping[str, str], evaluator: bool) -> AllocationSpec:
    """The Slurm description of the allocation this process runs in (one-line UsageError outside one)."""
    job_id = environ.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        raise UsageError(_OUTSIDE if not job_id else f"SLURM_JOB_ID={job_id!r} is not a job id; {_OUTSIDE}")
    layout = environ.get("SLURM_TASKS_PER_NODE", "")
    try:
        counts = parse_tasks_per_node(layout)
    except SlurmLayoutError:
        raise UsageError(f"SLURM_TASKS_PER_NODE={layout!r} is not Slurm's tasks-per-node form; run inside an allocation "
                         "made with --nodes and --ntasks-per-node") from None
    if len(set(counts)) != 1:
        raise UsageError(f"the allocation has {layout} tasks per node; --slurm needs the same number on every node "
                         "(allocate with --ntasks-per-node, e.g. `salloc -N 2 --ntasks-per-node 1`)")
    data = {"slurm": {"nodes": len(counts), "tasks_per_node": counts[0], "evaluator": evaluator}, "job_id": job_id}
    try:
        return AllocationSpec.model_validate(data)
    except ValidationError as exc:
        raise UsageError(f"the allocation (SLURM_TASKS_PER_NODE={layout}): {describe_error(exc)}") from None
