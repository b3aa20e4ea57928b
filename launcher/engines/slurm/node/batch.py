"""The Slurm part of a plan, and the files a Slurm run keeps in its run dir. Stdlib only:
plans and records are read (``tfl status``, the detached launcher, the task driver)
without pydantic.

The run dir lies on storage every node shares (the batch script's tasks write their logs
and progress there, and the launcher reads them). Its ``slurm/`` folder::

    job.sbatch         the batch script (what ``--dry-run`` shows)
    batch-<job>.out    the batch script's own output (``sbatch --output``); batch.out inside an allocation
    events             what the batch script did, one line each (``EVENT_*`` below)
    first-attempt      the attempt the job starts with: 0, or the next one for ``tfl resume``
                       (whose start moves the last job's events to events-before-<attempt>)
    training-<a>.err   srun's stderr for the training step of attempt a: its ``srun: error: NODE:
                       task N: ...`` lines say which task ended the step, on which node
    evaluator.err      srun's stderr for the evaluator's step
    tasks/<slug>.json  written by each task's driver before it execs the job: node, address, port, pid

The events are the batch script's account of its steps, so the launcher knows which attempt
ran and how it ended without asking slurmctld::

    training 0 start · training 0 exit 143 · training 1 start · ... · evaluator stopping ·
    evaluator exit 0 · end 0

An elastic run (``--min-tasks``) notes, before a failed attempt's exit, the nodes it lost
(``lost A FROM TO BEFORE AFTER``: training tasks FROM -> TO, the nodes before and after, comma
lists, ``-`` for none); the next attempt runs on AFTER when TO is at least ``min_tasks``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

SLURM_SUBDIR = "slurm"
EVENTS_FILE = "events"
FIRST_ATTEMPT_FILE = "first-attempt"
TRAINING_ERR = "training-{attempt}.err"
EVALUATOR_ERR = "evaluator.err"
TASK_DRIVER = "launcher.engines.slurm.node.task"  # the module every step runs (``python -m``)
# Before the stage packages (records of tfl 9bbb15a and older) the driver was launcher.slurm.task: a recorded
# script that names it is read with today's name, so `tfl resume` of such a run starts a driver that exists.
_OLD_TASK_DRIVER = re.compile(r"(?<=-m )launcher\.slurm\.task(?![\w.])")
TRAINING_ROLE, EVALUATOR_ROLE = "training", "evaluator"  # the task driver's roles: one step each
EVENT_TRAINING = TRAINING_ROLE  # "training A start", "training A exit STATUS"
EVENT_EVALUATOR_EXIT = "evaluator exit"  # "evaluator exit STATUS": its step ended
EVENT_EVALUATOR_STOPPING = "evaluator stopping"  # training had ended and the evaluator's time was up
EVENT_REQUEUED = "requeued"  # "requeued N": Slurm requeued the job (SLURM_RESTART_COUNT=N), the attempts go on
EVENT_END = "end"  # "end STATUS": the script's own exit status, written just before it exits
EVENT_LOST = "lost"  # "lost A FROM TO BEFORE AFTER": an elastic run lost nodes in attempt A (see above)


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
    def first_attempt(self) -> str:
        return f"{self.root}/{FIRST_ATTEMPT_FILE}"

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
    max_preemptions: int = 100  # how often it starts a preempted group again, not counted in max_restarts
    requeue: bool = False  # Slurm may requeue the job (a preempted job is then pending again, not ended)
    min_tasks: int | None = None  # an elastic run: after a node failure the script goes on with the nodes left

    def to_dict(self) -> dict[str, Any]:
        return {"script": self.script, "sbatch": list(self.sbatch), "job_name": self.job_name,
                "allocation": self.allocation, "test_only": list(self.test_only), "steps": [list(s) for s in self.steps],
                "max_restarts": self.max_restarts, "max_preemptions": self.max_preemptions, "requeue": self.requeue,
                "min_tasks": self.min_tasks}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SlurmJobPlan:
        return cls(script=_OLD_TASK_DRIVER.sub(TASK_DRIVER, data["script"]), sbatch=tuple(data["sbatch"]), job_name=data["job_name"],
                   allocation=data.get("allocation"), test_only=tuple(data.get("test_only", ())),
                   steps=tuple((role, _OLD_TASK_DRIVER.sub(TASK_DRIVER, line)) for role, line in data.get("steps", ())),
                   max_restarts=int(data.get("max_restarts", 0)), max_preemptions=int(data.get("max_preemptions", 100)),
                   requeue=bool(data.get("requeue", False)), min_tasks=data.get("min_tasks"))


@dataclass(frozen=True)
class LostNodes:
    """An elastic run's ``lost`` event: after ``attempt`` failed, its nodes went from ``before`` to ``after``."""

    attempt: int
    from_tasks: int
    to_tasks: int
    before: tuple[str, ...]
    after: tuple[str, ...]

    @property
    def lost(self) -> tuple[str, ...]:
        return tuple(n for n in self.before if n not in self.after)

    def event(self) -> str:
        return " ".join([EVENT_LOST, str(self.attempt), str(self.from_tasks), str(self.to_tasks),
                         ",".join(self.before) or "-", ",".join(self.after) or "-"])


def _names(word: str) -> tuple[str, ...]:
    return () if word == "-" else tuple(word.split(","))


@dataclass(frozen=True)
class StepEvents:
    """The events file, read: what the batch script started and how each step ended."""

    started: tuple[int, ...] = ()  # training attempts started, in order
    exits: dict[int, int] = field(default_factory=dict)  # training attempt -> srun's status
    evaluator_exit: int | None = None
    evaluator_stopping: bool = False
    end: int | None = None  # the script's exit status, once it is about to exit
    requeued: int = 0  # how often Slurm requeued the job (the last "requeued N")
    lost: dict[int, LostNodes] = field(default_factory=dict)  # failed attempt -> the nodes it lost (elastic)

    @property
    def last_attempt(self) -> int | None:
        return self.started[-1] if self.started else None


def parse_events(text: str) -> StepEvents:
    """The events file's text -> StepEvents; a line being written (no newline yet) is left for later."""
    started: list[int] = []
    exits: dict[int, int] = {}
    evaluator_exit: int | None = None
    stopping, end, requeued = False, None, 0
    lost: dict[int, LostNodes] = {}
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
        elif len(words) == 2 and words[0] == EVENT_REQUEUED and words[1].isdigit():
            requeued = int(words[1])
        elif len(words) == 6 and words[0] == EVENT_LOST and all(w.isdigit() for w in words[1:4]):
            a, f, t = (int(w) for w in words[1:4])
            lost[a] = LostNodes(a, f, t, _names(words[4]), _names(words[5]))
    return StepEvents(tuple(started), exits, evaluator_exit, stopping, end, requeued, lost)


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
