"""Backups a restarted group resumes from, counted in steps whatever the steps per call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tf_keras as keras


class StepBackup(keras.callbacks.BackupAndRestore):  # type: ignore[misc]  # tf_keras is untyped
    """keras' BackupAndRestore, with two changes.

    - `every_steps` counts training steps. keras counts calls of the train function, so
      with several steps per call it would back up every N calls; and it records the
      call's first step as the last one done, so a restart would run the rest of that
      call's steps again. Here the recorded step is the call's last, and keras resumes
      at the step after it. (The kit makes the steps per call divide `every_steps`.)
    - `on_trained` runs at the end of training *before* keras deletes the backup, so a
      marker written there (the done marker) leaves no moment at which neither the
      backup nor the marker says how far training got.
    """

    def __init__(self, backup_dir: str, every_steps: int | None,
                 on_trained: Callable[[], None] | None = None) -> None:
        super().__init__(backup_dir=backup_dir, save_freq=every_steps or "epoch")
        self._every_steps = every_steps
        self._on_trained = on_trained
        self._steps_since_backup = 0
        self._call_began = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)  # restores the backup, if there is one
        steps = self.params.get("steps")
        if not steps:
            return
        # Resume at step granularity whatever the backup interval: a preemption saves
        # mid-epoch, and keras only honours the saved step when its save_freq is an int.
        self._training_state._save_freq = self._every_steps or int(steps)
        state = self._training_state
        if int(state._ckpt_saved_epoch.numpy()) >= 0 and int(state._ckpt_saved_batch.numpy()) < 0:
            state._ckpt_saved_batch.assign(int(steps) - 1)  # an epoch-end backup of an older kit

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        steps = self.params.get("steps")
        if self._every_steps is None and steps:
            self._training_state._ckpt_saved_batch.assign(int(steps) - 1)  # the epoch's last step
        super().on_epoch_end(epoch, logs)

    def save_now(self, batch: int) -> None:
        """Back up now, after step `batch` (0-based, in the current epoch): the agreed
        checkpoint of a preemption. Every training task calls it at the same step."""
        self._steps_since_backup = 0
        self._training_state._ckpt_saved_batch.assign(int(batch))
        self._backup(epoch=self._current_epoch, batch=int(batch))

    @property
    def backup_path(self) -> str | None:
        """The latest backup's checkpoint path (on the chief: the real one)."""
        return self._training_state.read_checkpoint_manager.latest_checkpoint  # type: ignore[no-any-return]

    def _implements_train_batch_hooks(self) -> bool:
        return self._every_steps is not None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._call_began = int(batch)  # plain Python: keras assigns a variable here on every call

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._every_steps is None:
            return
        self._steps_since_backup += int(batch) - self._call_began + 1
        if self._steps_since_backup >= self._every_steps:
            self._steps_since_backup = 0
            self._training_state._ckpt_saved_batch.assign(int(batch))
            self._backup(epoch=self._current_epoch, batch=int(batch))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._on_trained is not None:
            self._on_trained()
        super().on_train_end(logs)
