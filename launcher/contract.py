"""What the launcher and the job kit agree on, written once. Standard library only.

Both sides import this module: the launcher (``plan``, ``placement``, the backends,
``tfl status``) when it writes a task's environment or reads its progress, and the job
kit (``launcher.jobkit``) inside the task. It travels with the kit to hosts that lack
tfl, so it must import nothing but the standard library.

- the task types (TF_CONFIG's ``task.type``);
- the ``TFL_*`` environment variables the launcher sets for each task;
- the progress record a task writes to ``TFL_PROGRESS_FILE``;
- the layout of a model directory (checkpoints, TensorBoard, backups, done marker).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

# --- task types --------------------------------------------------------------------------
CHIEF: Final = "chief"
WORKER: Final = "worker"
EVALUATOR: Final = "evaluator"
TRAINING_TYPES: Final = (CHIEF, WORKER)
TASK_TYPES: Final = (CHIEF, WORKER, EVALUATOR)  # also the order tasks are started in

# --- the environment of a task -----------------------------------------------------------
TF_CONFIG: Final = "TF_CONFIG"
# Keras 3 fails under MultiWorkerMirroredStrategy (keras-team/keras#20585): tf_keras is
# selected by this variable, read by TensorFlow when it is first imported.
LEGACY_KERAS: Final = "TF_USE_LEGACY_KERAS"
# The words the kit's refusal of a Keras 3 model says, which the run summary answers with the fix.
KERAS3_REFUSED: Final = "got a Keras 3 model"
RUN_ID: Final = "TFL_RUN_ID"  # also the marker `tfl stop` finds a run's processes by
TASK: Final = "TFL_TASK"  # "worker:1"
ATTEMPT: Final = "TFL_ATTEMPT"  # 0 for the first start of the group, +1 per restart
RUN_DIR: Final = "TFL_RUN_DIR"  # the run's directory as the task sees it (default model dir below it)
MODEL_DIR: Final = "TFL_MODEL_DIR"  # shared storage for the run's model dir, when the cluster file names it
PROGRESS_FILE: Final = "TFL_PROGRESS_FILE"  # where the task writes its progress record
PROGRESS_LOG: Final = "TFL_PROGRESS_LOG"  # tests: every progress record, one JSON line each
VIRTUAL_DEVICES: Final = "TFL_VIRTUAL_DEVICES"  # --virtual-devices N
GPU_MEMORY_LIMIT_MB: Final = "TFL_GPU_MEMORY_LIMIT_MB"  # per GPU the task sees
EVALUATOR_IN_RUN: Final = "TFL_EVALUATOR"  # "1": the run has an evaluator, which training tasks' TF_CONFIG leaves out
COLLECTIVE: Final = "TFL_COLLECTIVE"  # "ring" when training tasks share a GPU (NCCL refuses that)
# An elastic run that keeps its global batch (``tfl launch --min-tasks N --global-batch G``):
# the job batches by G whatever the number of replicas (``jobkit.global_batch_size``).
GLOBAL_BATCH: Final = "TFL_GLOBAL_BATCH"
HOME: Final = "TFL_HOME"  # the launcher's run store (not a task variable)
RESERVED_PREFIX: Final = "TFL_"  # a cluster file's env may not set these, nor TF_CONFIG
UNBUFFERED: Final = "PYTHONUNBUFFERED"  # "1": a task's output reaches its log line by line
# Set by tfl's Slurm batch script for every step, read by its task driver (launcher.engines.slurm.node.task).
SLURM_NODES: Final = "TFL_SLURM_NODES"  # the job's nodes in Slurm's order: "n1=10.0.0.1,n2=10.0.0.2"
SLURM_LAYOUT: Final = "TFL_SLURM_TRAINING_LAYOUT"  # training tasks per node, in Slurm's form: "2(x3),1"

# --- preemption --------------------------------------------------------------------------
# A training task that got a preemption notice (SIGTERM, or one tfl forwards), agreed on a
# step with the others, saved the full training state there and left, exits with this code.
# In 128-255 because Kubernetes' ExitCode restart policy retries only those; 128+42 is not
# a signal anyone sends, so it is never mistaken for "killed by a signal" (143 = SIGTERM).
PREEMPTED_EXIT_CODE: Final = 170
# A task's last progress record may say so too: phase PREEMPTED_PHASE, ``global_step`` the
# agreed step. The launcher reads it (the progress file is on its machine whatever ran the
# task), else the model dir's PreemptedRecord where it can read that dir.
PREEMPTED_PHASE: Final = "preempted"
# A training task that got the notice before it trained anything this attempt (start-up, or a first
# call still replaying its input) also leaves with PREEMPTED_EXIT_CODE, but saved nothing: its last
# progress record then has this phase (and its ``attempt``), so the launcher does not claim a checkpoint.
LEFT_UNSAVED_PHASE: Final = "left-unsaved"
# A resumed tf.data pipeline reads (and drops) every batch before the resume step inside the first
# step, for minutes late in a run: the kit says so first with this phase, ``global_step`` the resume step.
REPLAY_PHASE: Final = "replay"
# The notice itself: what a launcher, Slurm (--signal) or Kubernetes sends a training task.
PREEMPTION_SIGNAL: Final = "SIGTERM"
# The teardown after a failure elsewhere (a peer died or stalled): not a notice, as no agreement
# can include a dead peer, so nothing is saved. A signal whose default action ends the task at
# once, which the kit and TensorFlow leave alone (a job without the kit stops just the same);
# then SIGKILL after the grace, as for the notice. Slurm's --kill-on-bad-exit can only send SIGTERM:
# the kit then tells a teardown from a notice by a peer that is gone (jobkit/notice.py).
TEARDOWN_SIGNAL: Final = "SIGUSR2"
# Barrier the training tasks meet at after the agreed checkpoint, before leaving (chief last).
PREEMPTED_BARRIER: Final = "tfl-jobkit-preempted"


@dataclass(frozen=True)
class PreemptedRecord:
    """``preempted.json`` in the model dir: the chief writes it once the agreed checkpoint
    is on disk, just before every training task exits ``PREEMPTED_EXIT_CODE``. It is
    removed when training ends (with the done marker), so it is there only while the run
    is stopped at that checkpoint. The next attempt resumes at ``global_step + 1``."""

    run_id: str | None = None
    attempt: int = 0  # the attempt that was preempted
    global_step: int = 0  # steps trained, all epochs: the checkpoint is after this many
    epoch: int = 0  # 1-based: the epoch it stopped in
    step: int = 0  # steps done in that epoch
    steps_per_epoch: int | None = None
    notice_from: str | None = None  # "worker:0": the task whose notice was agreed on (first)
    backup: str = ""  # the checkpoint's path
    time: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> PreemptedRecord | None:
        """The record, or None for anything else."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        except TypeError:
            return None


# --- the progress record -----------------------------------------------------------------
PHASES: Final = ("train", "eval", "done", PREEMPTED_PHASE, LEFT_UNSAVED_PHASE, REPLAY_PHASE)


@dataclass(frozen=True)
class ProgressRecord:
    """The JSON object a task keeps in ``TFL_PROGRESS_FILE`` (written by the kit, read by
    ``tfl status``, the stall watchdog and the SSH agent's mirror)."""

    # Defaults only so that a reader takes a partial record; the kit writes every field.
    task: str = ""  # "worker:1"
    attempt: int = 0
    phase: str = "train"  # one of PHASES
    epoch: int = 0  # 1-based: the epoch being trained, or the last one finished
    epochs: int = 0
    step: int = 0  # steps done in this epoch
    steps_per_epoch: int | None = None  # None when the dataset's length is unknown
    global_step: int = 0
    loss: float | None = None  # the true running loss of the epoch so far
    metrics: dict[str, float] = field(default_factory=dict)
    examples_per_sec: float = 0.0
    time: float = 0.0  # time.time() when it was written

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> ProgressRecord | None:
        """The record, or None for anything else (a file from another version, half-written…)."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
        except TypeError:
            return None

    @property
    def fraction(self) -> float | None:
        """How much of the whole training is done, 0..1, or None when unknown."""
        if self.phase == "done":
            return 1.0
        if not self.epochs or not self.epoch:
            return None
        # The evaluator's epoch is the one whose checkpoint it evaluated: a finished one.
        within = 1.0 if self.phase == "eval" else self.step / self.steps_per_epoch if self.steps_per_epoch else 0.0
        return float(min(1.0, (self.epoch - 1 + within) / self.epochs))


# --- the model directory -----------------------------------------------------------------
@dataclass(frozen=True)
class ModelDirLayout:
    """The fixed layout the chief writes, the evaluator follows and the launcher shows."""

    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def backup(self) -> Path:
        return self.root / "backup"

    @property
    def eval(self) -> Path:
        # Next to training's summaries (tensorboard/train), so one `tensorboard --logdir`
        # shows both.
        return self.tensorboard / "eval"

    @property
    def done_file(self) -> Path:
        return self.root / "training_done.json"

    @property
    def preempted_file(self) -> Path:
        """A ``PreemptedRecord``: where the last preemption saved (see PREEMPTED_EXIT_CODE)."""
        return self.root / "preempted.json"

    @property
    def training_progress(self) -> Path:
        """The chief's progress record, rewritten every few seconds while it trains:
        what the evaluator follows to tell a long epoch from a dead chief."""
        return self.root / "training_progress.json"


MODEL_SUBDIR: Final = "model"  # the default model dir: <TFL_RUN_DIR>/model
PROGRESS_SUBDIR: Final = "progress"  # <run dir>/progress/<type>-<index>.json
LOGS_SUBDIR: Final = "logs"  # <run dir>/logs/<type>-<index>.log


def shared_model_dir(storage: str, run_id: str) -> str:
    """A run's model dir in the cluster's shared storage (a directory or a URL such as gs://…)."""
    return f"{storage.rstrip('/')}/{run_id}/{MODEL_SUBDIR}"


def task_slug(task_type: str, index: int) -> str:
    """``worker-1``: a task's name in file names (a colon is awkward in paths)."""
    return f"{task_type}-{index}"


# --- a task's environment, as every backend builds it ------------------------------------
def run_variables(run_id: str, run_dir: str, virtual_devices: int | None = None, *,
                  evaluator: bool = False) -> dict[str, str]:
    """What tfl sets for every task of a run, whatever runs it (local, SSH, Slurm).
    ``evaluator``: the run has one, so the chief keeps every checkpoint for it."""
    return {
        **({} if virtual_devices is None else {VIRTUAL_DEVICES: str(virtual_devices)}),
        **({EVALUATOR_IN_RUN: "1"} if evaluator else {}),
        # tf_keras, not Keras 3: Keras 3 fails under MultiWorkerMirroredStrategy (keras-team/keras#20585).
        LEGACY_KERAS: "1",
        UNBUFFERED: "1",
        RUN_ID: run_id,
        RUN_DIR: run_dir,
    }


def task_variables(task_type: str, index: int, run_dir: str, attempt: int = 0) -> dict[str, str]:
    """What tfl sets for one task besides ``run_variables``: its name, progress file and attempt.
    ``run_dir`` is the run dir as the task sees it."""
    return {
        TASK: f"{task_type}:{index}",
        PROGRESS_FILE: f"{run_dir}/{PROGRESS_SUBDIR}/{task_slug(task_type, index)}.json",
        ATTEMPT: str(attempt),
    }

