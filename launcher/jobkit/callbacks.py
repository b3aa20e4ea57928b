"""Keras callbacks the kit adds to every fit: progress/epoch lines and epoch checkpoints."""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf
import tf_keras as keras

from launcher.jobkit.context import TaskContext
from launcher.jobkit.progress import Phase, ProgressWriter, format_epoch_line, progress_record

CHECKPOINT_PREFIX = "ckpt"


class ProgressCallback(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Writes progress after batches (throttled by the writer) and prints one line per epoch.

    Per-batch logs are only true under a distribution strategy when the model reduces
    them with "first" (see `training.use_true_per_step_logs`); epoch-end logs are
    always reduced properly by keras.
    """

    def __init__(self, context: TaskContext, writer: ProgressWriter, global_batch_size: int) -> None:
        super().__init__()
        self._context = context
        self._writer = writer
        self._global_batch_size = global_batch_size
        self._epoch = 0
        self._epoch_started = 0.0
        self._steps_this_run = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._epoch_started = time.monotonic()
        self._steps_this_run = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Counted separately from `batch`: after a mid-epoch restore, batch starts above 0.
        self._steps_this_run += 1
        if self._writer.due():
            self._writer.write(self._record("train", batch + 1, logs or {}))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        print(format_epoch_line(epoch + 1, self._epochs, logs), flush=True)
        steps = self.params.get("steps") or self._steps_this_run
        self._writer.write(self._record("train", steps, logs), force=True)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        steps = self.params.get("steps") or self._steps_this_run
        self._writer.write(self._record("done", steps, logs or {}), force=True)

    @property
    def _epochs(self) -> int:
        return int(self.params.get("epochs") or 0)

    def _record(self, phase: Phase, step: int, logs: dict[str, Any]) -> dict[str, Any]:
        elapsed = time.monotonic() - self._epoch_started
        rate = self._steps_this_run * self._global_batch_size / elapsed if elapsed > 0 else 0.0
        return progress_record(
            task=self._context.label, attempt=self._context.attempt, phase=phase,
            epoch=self._epoch + 1, epochs=self._epochs, step=step,
            steps_per_epoch=self.params.get("steps"),
            global_step=int(self.model.optimizer.iterations.numpy()),
            logs=logs, examples_per_sec=rate,
        )


class EpochCheckpoint(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Saves the model's weights as `ckpt-{epoch}` (1-based) after every epoch.

    A tf.train.CheckpointManager keeps the `checkpoint` state file up to date, which
    is what the evaluator (and `tf.train.checkpoints_iterator`) follow. Every task
    saves, because under MultiWorkerMirroredStrategy saving may need collectives;
    only the chief's directory is real.
    """

    def __init__(self, directory: str, max_to_keep: int = 5) -> None:
        super().__init__()
        self._directory = directory
        self._max_to_keep = max_to_keep
        self._manager: tf.train.CheckpointManager | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        checkpoint = tf.train.Checkpoint(model=self.model)
        self._manager = tf.train.CheckpointManager(
            checkpoint, self._directory, max_to_keep=self._max_to_keep,
            checkpoint_name=CHECKPOINT_PREFIX,
        )

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._manager is None:
            raise RuntimeError("EpochCheckpoint.on_epoch_end ran before on_train_begin")
        self._manager.save(checkpoint_number=epoch + 1)

    @property
    def latest(self) -> str | None:
        return None if self._manager is None else self._manager.latest_checkpoint
