"""Keras callbacks the kit adds to every fit: step timing, progress/epoch lines, epoch checkpoints.

All of them take keras' logs as tensors (`_supports_tf_logs`): a callback without it makes
keras turn every call's logs into numpy, which waits for the device on every call. The
progress callback reads a value only when it writes a record (every half second).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import tensorflow as tf
import tf_keras as keras

from launcher.jobkit.context import TaskContext
from launcher.jobkit.progress import Phase, ProgressWriter, format_epoch_line, progress_record

CHECKPOINT_PREFIX = "ckpt"


class StepClock(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Times the train function's calls and nothing else; first in the callback list.

    Its `on_train_batch_begin` runs just before keras calls the train function and its
    `on_train_batch_end` just after, so the other callbacks (backups, progress) and the
    epoch-end writes (checkpoint, TensorBoard, backup) are left out. With several steps
    per call, `batch` at the end is the call's last step: a call ran end - begin + 1 steps.
    With `replayed`, the first call reads and drops every batch before the resume step (a
    tf.data replay: minutes): it is left out of the rate, which would read about 1 example/s.
    """

    def __init__(self, replayed: bool = False) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._replayed = replayed
        self.epoch_seconds = 0.0
        self.epoch_steps = 0
        self._rate = (0.0, 0)  # (seconds, steps) of this epoch's calls, a replay's first call left out
        self.total_seconds = 0.0  # since this fit began (this attempt)
        self.total_steps = 0
        self.calls = 0
        self.last_call = (0.0, 0)  # (seconds, steps) of the latest call
        self._began_at = 0.0
        self._began_step = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.epoch_seconds, self.epoch_steps, self._rate = 0.0, 0, (0.0, 0)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._began_step = int(batch)
        self._began_at = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        seconds = time.perf_counter() - self._began_at
        steps = int(batch) - self._began_step + 1
        self.epoch_seconds += seconds
        self.epoch_steps += steps
        if not (self._replayed and self.calls == 0):
            self._rate = (self._rate[0] + seconds, self._rate[1] + steps)
        self.total_seconds += seconds
        self.total_steps += steps
        self.calls += 1
        self.last_call = (seconds, steps)

    def examples_per_sec(self, global_batch_size: int) -> float:
        """This epoch's rate so far, over the train function's time only."""
        seconds, steps = self._rate
        return steps * global_batch_size / seconds if seconds > 0 else 0.0


class ProgressCallback(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Writes progress after the train function's calls (throttled by the writers) and
    prints one line per epoch.

    With several steps per call, keras runs callbacks once per call, so a record is the
    state after that call's last step: `step` counts the steps done in the epoch, and the
    loss and metrics are the epoch's running values up to that step. Per-call logs are
    only true under a distribution strategy when they are taken from one replica (see
    `training.use_true_per_step_logs`); epoch-end logs are always reduced properly by keras.
    `examples_per_sec` is timed by the `StepClock`: checkpoint and backup time is not in it.
    `replaying`: the batches a tf.data replay reads before the first step; a record with phase
    "replay" says so first (`tfl status` would show no progress for the whole replay).
    """

    def __init__(self, context: TaskContext, writers: Sequence[ProgressWriter], global_batch_size: int,
                 clock: StepClock, replaying: int = 0) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._context = context
        self._writers = tuple(writers)
        self._global_batch_size = global_batch_size
        self._clock = clock
        self._epoch = 0
        self._replaying = replaying

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        if self._replaying:  # the first epoch's first call replays: the restored position, before it
            steps = self.params.get("steps")
            self._write(self._record("replay", self._replaying % steps if steps else 0, {}, self._replaying), force=True)
            self._replaying = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if any(writer.due() for writer in self._writers):
            self._write(self._record("train", int(batch) + 1, logs or {}))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        logs = logs or {}
        print(format_epoch_line(epoch + 1, self._epochs, logs), flush=True)
        self._write(self._record("train", self._steps_done, logs), force=True)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._write(self._record("done", self._steps_done, logs or {}), force=True)

    def preempted(self, step: int) -> None:
        """The task's last record: it saved the agreed checkpoint after `step` of this epoch."""
        self._write(self._record("preempted", step, {}), force=True)

    @property
    def _epochs(self) -> int:
        return int(self.params.get("epochs") or 0)

    @property
    def _steps_done(self) -> int:
        return int(self.params.get("steps") or self._clock.epoch_steps)

    def _write(self, record: dict[str, Any], force: bool = False) -> None:
        for writer in self._writers:
            writer.write(record, force=force)

    def _record(self, phase: Phase, step: int, logs: dict[str, Any], global_step: int | None = None) -> dict[str, Any]:
        return progress_record(
            task=self._context.label, attempt=self._context.attempt, phase=phase,
            epoch=self._epoch + 1, epochs=self._epochs, step=step,
            steps_per_epoch=self.params.get("steps"),
            global_step=int(self.model.optimizer.iterations.numpy()) if global_step is None else global_step,
            logs=logs, examples_per_sec=self._clock.examples_per_sec(self._global_batch_size),
        )


class EpochCheckpoint(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Saves the model's weights as `ckpt-{epoch}` (1-based) after every epoch.

    A tf.train.CheckpointManager keeps the `checkpoint` state file up to date, which
    is what the evaluator (and `tf.train.checkpoints_iterator`) follow. Every task
    saves, because under MultiWorkerMirroredStrategy saving may need collectives;
    only the chief's directory is real. `max_to_keep=None` keeps them all (the kit
    does that when an evaluator must see every one).
    """

    def __init__(self, directory: str, max_to_keep: int | None = 5) -> None:
        super().__init__()
        self._supports_tf_logs = True
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


class ReplayTimer(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Says how long the replay of a plain tf.data pipeline took: from train begin to the first step's end."""

    def __init__(self, batches: int, clock: Any = time.monotonic) -> None:
        super().__init__()
        self._batches, self._clock = batches, clock
        self._began: float | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._began = self._clock()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._began is None:
            return
        took, self._began = self._clock() - self._began, None
        print(f"jobkit: replayed {self._batches} batches to reach the resume step; the first step came {took:.1f} s "
              "after training began (the replay, plus one step; fit(..., replay=False) skips the replay and gives up "
              "exactness)", flush=True)
