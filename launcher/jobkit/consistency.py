"""After a restore, every training task goes on from the same place, or none does.

Each training task restores the chief's backup on its own (tf_keras' BackupAndRestore, in
``on_train_begin``). When they do not all find the same one (each host kept its own copy of
a model dir that was meant to be shared, or found none), the chief goes on from epoch 4, a
worker from epoch 0, and the group dies later inside a collective with an error that names
no task ("Collective instance 128 expected type 1 and data_type 9 ..."). So right after the
restore, before the first step, the training tasks gather what each restored (one
all-gather under the strategy) and all stop with one error naming every task, its host and
what it restored, unless they agree.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

from launcher.contract import TRAINING_TYPES
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.position import resume_point

NOTHING = (-1, -1)  # BackupAndRestore's "no backup restored"


class RestoredStateCheck(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Put it right after the BackupAndRestore callback: checks what that one restored."""

    def __init__(self, context: TaskContext, backup_dir: str) -> None:
        super().__init__()
        self._context, self._backup_dir = context, backup_dir

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self._context.is_multi_worker:
            return
        state = getattr(self.model, "_training_state", None)  # BackupAndRestore's, while training
        restored = NOTHING if state is None else (int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy()))
        check_restored(self.model.distribute_strategy, self._context, restored, self._backup_dir)


def training_tasks(context: TaskContext) -> list[tuple[str, str]]:
    """(task, host) of every training task, in TF_CONFIG's order."""
    return [(f"{kind}:{i}", address.rsplit(":", 1)[0].strip("[]"))
            for kind in TRAINING_TYPES for i, address in enumerate(context.cluster.get(kind, ()))]


def check_restored(strategy: tf.distribute.Strategy, context: TaskContext, restored: tuple[int, int],
                   backup_dir: str) -> None:
    """All-gather (task, epoch, batch) from every training task; raise unless all restored the same."""
    tasks = training_tasks(context)
    me = [name for name, _ in tasks].index(f"{context.task_type}:{context.task_index}")
    row = tf.constant([[me, *restored]], dtype=tf.int64)
    values = strategy.experimental_distribute_values_from_function(lambda _: row)
    everyone = {int(r[0]): (int(r[1]), int(r[2])) for r in strategy.gather(values, axis=0).numpy()}
    if len(set(everyone.values())) == 1:
        if restored != NOTHING:
            print(f"jobkit: every training task restored {_describe(restored)}", flush=True)
        return
    said = ", ".join(f"{tasks[i][0]} on {tasks[i][1]} {_describe(state)}" for i, state in sorted(everyone.items()))
    message = (f"training tasks restored different states: {said}; they must all read one backup in {backup_dir}: "
               "give the cluster file shared storage (\"storage\": {\"path\": ...}) or pass a --model-dir every host sees")
    print(f"jobkit: {message}", flush=True)
    raise JobKitError(message)


def _describe(state: tuple[int, int]) -> str:
    epoch, batch = state
    if epoch < 0:
        return "nothing (it would start afresh)"
    return f"the backup of epoch {epoch + 1}" + (f" step {batch + 1}" if batch >= 0 else "")


class PositionCheck(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Right after keras' restore: the state it restored is the one the stream was placed for."""

    def __init__(self, expected: tuple[int, int], steps_per_epoch: int) -> None:
        super().__init__()
        self._expected = resume_point(expected, steps_per_epoch)
        self._steps_per_epoch = steps_per_epoch

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        state = self.model._training_state  # BackupAndRestore's, while training
        restored = resume_point((int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy())),
                                self._steps_per_epoch)
        if restored != self._expected:
            raise JobKitError(f"the backup changed while training started: the input was placed at epoch "
                              f"{self._expected[0] + 1} step {self._expected[1]} but keras restored epoch "
                              f"{restored[0] + 1} step {restored[1]}; is another run writing to this model dir?")
