"""The Slurm part of a plan, and the files a Slurm run keeps in its run dir. Stdlib only:
plans and records are read (``tfl status``, the detached launcher, the task driver)
without pydantic.

The run dir lies on storage every node shares (the batch script's tasks write their logs
and progress there, and the launcher reads them). Its ``slurm/`` folder::

    job.sbatch         the batch script (what ``--dry-run`` shows)
    batch-<job>.out    the batch script's own output (``sbatch --output``); batch.out inside an allocation
    events             what the batch script did, one line each (``EVENT_*`` below)
    training-<a>.err   srun's stderr for the training step of attempt a: its ``srun: error: NODE:
                       task N: ...`` lines say which task ended the step, on which node
    evaluator.err      srun's stderr for the evaluator's step
    tasks/<slug>.json  written by each task's driver before it execs the job: node, address, port, pid

The events are the batch script's account of its steps, so the launcher knows which attempt
ran and how it ended without asking slurmctld::

    training 0 start · training 0 exit 143 · training 1 start · ... · evaluator stopping ·
    evaluator exit 0 · end 0
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

SLURM_SUBDIR = "slurm"
EVENTS_FILE = "events"
TRAINING_ERR = "training-{attempt}.err"
EVALUATOR_ERR = "evaluator.err"
TRAINING_ROLE, EVALUATOR_ROLE = "training", "evaluator"  # the task driver's roles: one step each
EVENT_TRAINING = TRAINING_ROLE  # "training A start", "training A exit STATUS"
EVENT_EVALUATOR_EXIT = "evaluator exit"  # "evaluator exit STATUS": its step ended
EVENT_EVALUATOR_STOPPING = "evaluator stopping"  # training had ended and the evaluator's time was up
EVENT_END = "end"  # "end STATUS": the script's own exit status, written just before it exits


def step_name(role: str, run_id: str) -> str:
    """A step's name (``srun --job-name``): its role and the run, so that two runs in one
    allocation never take each other's steps for their own."""
    return f"{role}.{run_id}"


@dataclass(frozen=True)
class RunFiles:
    """Where a Slurm run's files lie, given its run dir (as the nodes and this machine see it)."""

    run_dir: str

    @property
    def root(self) -> str:
        return f"{self.run_dir}/{SLURM_SUBDIR}"

    @property
    def script(self) -> str:
        return f"{self.root}/job.sbatch"

    @property
    def events(self) -> str:
        return f"{self.root}/{EVENTS_FILE}"

    @property
    def batch_output_pattern(self) -> str:
        """``sbatch --output``: Slurm puts the job id in place of ``%j``."""
        return f"{self.root}/batch-%j.out"

    def batch_output(self, job_id: str | None) -> str:
        return f"{self.root}/batch-{job_id}.out" if job_id else f"{self.root}/batch.out"

    def training_err(self, attempt: int | str) -> str:
        return f"{self.root}/{TRAINING_ERR.format(attempt=attempt)}"

    @property
    def evaluator_err(self) -> str:
        return f"{self.root}/{EVALUATOR_ERR}"

    def task_info(self, slug: str) -> str:
        return f"{self.root}/tasks/{slug}.json"


@dataclass(frozen=True)
class SlurmJobPlan:
    """How a plan's tasks reach Slurm: one batch script, submitted or run inside an allocation
    (a ``slurm`` plan's ``LaunchPlan.unit``)."""

    kind: ClassVar[str] = "slurm"  # the description kind, and the backend, of plans with this unit

    script: str  # the whole batch script; the first start writes it to RunFiles.script
    sbatch: tuple[str, ...]  # the sbatch command before the script's path; () inside an allocation
    job_name: str  # the job's name (submitted) and the prefix of its steps' names
    allocation: str | None = None  # the job id of the allocation tfl runs inside (--slurm); None: submitted
    test_only: tuple[str, ...] = ()  # the sbatch command that checks the job without submitting it
    steps: tuple[tuple[str, str], ...] = ()  # (role, srun line): what --dry-run shows besides the script
    max_restarts: int = 0  # how often the script starts the training group again (its policy, as written in it)

    def to_dict(self) -> dict[str, Any]:
        return {"script": self.script, "sbatch": list(self.sbatch), "job_name": self.job_name,
                "allocation": self.allocation, "test_only": list(self.test_only), "steps": [list(s) for s in self.steps],
                "max_restarts": self.max_restarts}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlurmJobPlan:
        return cls(script=data["script"], sbatch=tuple(data["sbatch"]), job_name=data["job_name"],
                   allocation=data.get("allocation"), test_only=tuple(data.get("test_only", ())),
                   steps=tuple((role, line) for role, line in data.get("steps", ())),
                   max_restarts=int(data.get("max_restarts", 0)))


@dataclass(frozen=True)
class StepEvents:
    """The events file, read: what the batch script started and how each step ended."""

    started: tuple[int, ...] = ()  # training attempts started, in order
    exits: dict[int, int] = field(default_factory=dict)  # training attempt -> srun's status
    evaluator_exit: int | None = None
    evaluator_stopping: bool = False
    end: int | None = None  # the script's exit status, once it is about to exit

    @property
    def last_attempt(self) -> int | None:
        return self.started[-1] if self.started else None


def parse_events(text: str) -> StepEvents:
    """The events file's text -> StepEvents; a line being written (no newline yet) is left for later."""
    started: list[int] = []
    exits: dict[int, int] = {}
    evaluator_exit: int | None = None
    stopping, end = False, None
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        words = line.split()
        if len(words) == 3 and words[0] == EVENT_TRAINING and words[1].isdigit() and words[2] == "start":
            started.append(int(words[1]))
        elif len(words) == 4 and words[0] == EVENT_TRAINING and words[1].isdigit() and words[2] == "exit":
            exits[int(words[1])] = _status(words[3])
        elif line.startswith(EVENT_EVALUATOR_EXIT + " ") and len(words) == 3:
            evaluator_exit = _status(words[2])
        elif line.strip() == EVENT_EVALUATOR_STOPPING:
            stopping = True
        elif len(words) == 2 and words[0] == EVENT_END:
            end = _status(words[1])
    return StepEvents(tuple(started), exits, evaluator_exit, stopping, end)


def _status(word: str) -> int:
    return int(word) if word.isdigit() else 1


def read_events(files: RunFiles) -> StepEvents:
    try:
        return parse_events(Path(files.events).read_text(errors="replace"))
    except OSError:
        return StepEvents()


@dataclass(frozen=True)
class TaskInfo:
    """Where one task runs, as its driver found it (``RunFiles.task_info``)."""

    task: str
    node: str
    addr: str
    port: int
    pid: int
    attempt: int
    step: str  # e.g. 42.0
    time: float


def write_task_info(files: RunFiles, slug: str, info: TaskInfo) -> None:
    """Atomically (temp file + rename), 0600: the launcher may read it at any moment."""
    path = Path(files.task_info(slug))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(info), f)
    os.replace(temp, path)


def read_task_info(files: RunFiles, slug: str) -> TaskInfo | None:
    try:
        data = json.loads(Path(files.task_info(slug)).read_text())
        return TaskInfo(**data)
    except (OSError, ValueError, TypeError):
        return None
