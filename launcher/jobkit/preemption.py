"""A preemption notice (SIGTERM) ends training at one agreed step, saved, with exit code 170.

TensorFlow has the protocol: `tf.distribute.experimental.PreemptionCheckpointHandler`.
The task that gets the notice claims it in the coordination service's key-value store and
names the step to stop at (the end of the next call of the train function); every
training task acknowledges, trains up to that step, saves, and leaves. tf_keras uses it
only on GCP (`BackupAndRestore(save_before_preemption=True)` asks the GCE metadata server
and silently does nothing elsewhere), so the kit drives the handler itself:

- `PreemptionCheckpoint`, a callback of `jobkit.fit`, calls the handler once per call of
  the train function (whatever the steps per call: every task calls the same number of
  times), and the save is the kit's own backup (`StepBackup.save_now`): weights,
  optimizer, epoch and step; the input position follows from them (see `position.py`);
- the handler is built without its platform probe (a 5 s HTTP request to
  metadata.google.internal that, on a GCP CPU VM, also switches the handler off);
- after the save the chief writes `preempted.json` (contract.PreemptedRecord), the
  training tasks meet at a barrier and leave, the chief last, with PREEMPTED_EXIT_CODE.

Outside training, a notice has nothing to agree on: before `fit` (start-up) and after it
(the done marker is on disk) the task leaves at once with PREEMPTED_EXIT_CODE; the next
attempt resumes from the last backup, or finds the done marker and does not train.
The evaluator is not a training task: the kit leaves its SIGTERM alone.

`preemption_handler` is the one call a custom training loop needs (see docs/preemption.md).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import tensorflow as tf
import tf_keras as keras

from launcher.contract import PREEMPTED_BARRIER, PREEMPTED_EXIT_CODE, ModelDirLayout, PreemptedRecord
from launcher.jobkit import notice
from launcher.jobkit.backup import StepBackup
from launcher.jobkit.callbacks import ProgressCallback
from launcher.jobkit.context import TaskContext, task_context
from launcher.jobkit.layout import write_json_atomically
from launcher.jobkit.notice import exit_on_notice, leave_now

BARRIER_TIMEOUT_S = 30.0  # after the save; a task that never comes is dead, and the save is done
_HANDLERS: list[Any] = []  # kept alive: a collected handler tells every task to stop watching


def preemption_handler(
    strategy: tf.distribute.Strategy,
    checkpoint: tf.train.Checkpoint | tf.train.CheckpointManager,
    checkpoint_dir: str | None = None,
    *,
    save: Callable[[], None] | None = None,
    exit: Callable[[], Any] | None = None,  # noqa: A002 - TerminationConfig's exit_fn
    context: TaskContext | None = None,
) -> Any:
    """A `tf.distribute.experimental.PreemptionCheckpointHandler` for tfl's training tasks.

    Same arguments as TensorFlow's (`checkpoint_dir` goes with a `tf.train.Checkpoint`;
    it restores the latest checkpoint there when it is made), plus `save` (replaces the
    handler's own save) and `exit` (default: the training tasks meet at a barrier and
    leave, the chief last, with PREEMPTED_EXIT_CODE). The notice is SIGTERM, as the kit
    sees it (`notice.py`); no grace-period countdown: every task saves at the end of the
    next call and goes. A custom loop calls `handler.run(train_step, ...)` for each step
    and starts its input where the restored checkpoint left it (`jobs/custom_loop.py`).
    """
    context = context or task_context(os.environ)
    exit_on_notice(context, "before training began")  # takes SIGTERM back if anything took it since
    config = tf.distribute.experimental.TerminationConfig(
        termination_watcher_fn=notice.received, exit_fn=exit or (lambda: leave_preempted(context)),
        grace_period=0, save_fn=save)
    resolver = strategy.cluster_resolver if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) else None
    with _no_cloud_probe():
        handler = _KitHandler(resolver, checkpoint, checkpoint_dir, termination_config=config)
    _HANDLERS.append(handler)
    notice.training_begins()
    return handler


class _KitHandler(tf.distribute.experimental.PreemptionCheckpointHandler):  # type: ignore[misc]
    """TensorFlow's handler, telling the notice guard when a step ends and when the save begins."""

    @property
    def total_run_calls(self) -> int:
        """TensorFlow's save reads this deprecated property: 3 lines of deprecation warning, twice, in
        every task's output at every preemption, about a call the job never made. The same count, quietly."""
        return int(self._run_counter)

    def run(self, distributed_train_function: Any, *args: Any, **kwargs: Any) -> Any:
        result = super().run(distributed_train_function, *args, **kwargs)
        notice.step_done()
        return result

    def save_checkpoint_if_preempted(self, *args: Any, **kwargs: Any) -> None:
        notice.step_done()
        super().save_checkpoint_if_preempted(*args, **kwargs)

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        notice.saving()
        super()._save_checkpoint(*args, **kwargs)


def leave_preempted(context: TaskContext) -> NoReturn:
    """After the agreed save: the training tasks meet at a barrier and leave, the chief last,
    with PREEMPTED_EXIT_CODE (alone, or if a peer never comes, at once)."""
    if context.is_multi_worker:
        from tensorflow.python.eager import context as tf_context  # the coordination service

        # Imported here: importing the submodule `finish` early would shadow `jobkit.finish`,
        # the function the package exposes under the same name.
        from launcher.jobkit.finish import leave_together

        leave_together(context, tf_context.context(), barrier_timeout_s=BARRIER_TIMEOUT_S,
                       errors=(tf.errors.OpError, AttributeError), barrier=PREEMPTED_BARRIER,
                       leave=lambda: leave_now(PREEMPTED_EXIT_CODE))
    leave_now(PREEMPTED_EXIT_CODE)


class PreemptionCheckpoint(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """The agreed checkpoint on a notice, inside `jobkit.fit`; after `StepBackup` in the list."""

    def __init__(self, context: TaskContext, backup: StepBackup, model_dir: Path, progress: ProgressCallback) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._context, self._backup, self._layout = context, backup, ModelDirLayout(model_dir)
        self._progress = progress
        self._handler: Any = None
        self._epoch = 0
        self._batch = -1
        self._saved_path: str | None = None
        self._leave_at_epoch_end = False

    def _implements_train_batch_hooks(self) -> bool:
        return True  # asked before on_train_begin, which decides whether there is a handler

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.params.get("steps"):
            print("jobkit: the epoch length is unknown, so a preemption notice cannot be agreed on a step; "
                  f"a notice exits {PREEMPTED_EXIT_CODE} at once and the restart resumes from the last backup",
                  flush=True)
            exit_on_notice(self._context, "during training (epoch length unknown)")
            return
        # A manager that is never written (the save is the backup's): the handler restores
        # it at creation and counts its calls from the count saved there, the same (none)
        # on every task, so that every task counts from zero.
        unused = tf.train.CheckpointManager(tf.train.Checkpoint(), str(self._layout.backup / "unused"), max_to_keep=1)
        self._handler = preemption_handler(self.model.distribute_strategy, unused, save=self._save, exit=self._exit,
                                           context=self._context)

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._handler is not None:
            self._batch = int(batch)
            self._handler.save_checkpoint_if_preempted()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        notice.epoch_done()  # last of the kit's: the epoch's checkpoint and backup are written
        if self._leave_at_epoch_end:
            self._saved_path = self._backup.backup_path  # the epoch's end backed up the same state again
            self._leave()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        exit_on_notice(self._context, "after training ended (the done marker is written)", trained=True)

    def _save(self) -> None:
        started = time.monotonic()
        self._backup.save_now(self._batch)
        self._saved_path = self._backup.backup_path
        print(f"jobkit: preemption: saved the agreed checkpoint at epoch {self._epoch + 1} step {self._batch + 1} "
              f"(global step {self._global_step()}) in {time.monotonic() - started:.2f} s", flush=True)

    def _global_step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _exit(self) -> None:
        if self._batch + 1 == self.params.get("steps"):
            # The agreed step ends the epoch: its end (line, checkpoint, summaries) first, or it is
            # never written: the resume starts the next epoch. Every task agreed on this step.
            self._leave_at_epoch_end = True
            return
        self._leave()

    def _leave(self) -> NoReturn:
        self._progress.preempted(self._batch + 1)  # phase "preempted" at the agreed step, on every task
        if self._context.is_chief:
            record = PreemptedRecord(
                run_id=self._context.run_id, attempt=self._context.attempt, global_step=self._global_step(),
                epoch=self._epoch + 1, step=self._batch + 1, steps_per_epoch=self.params.get("steps"),
                notice_from=_notice_from(self._context), backup=self._saved_path or "", time=time.time())
            write_json_atomically(self._layout.preempted_file, record.to_dict())
        print(f"jobkit: preempted; every training task saved at global step {self._global_step()}; "
              f"exiting {PREEMPTED_EXIT_CODE}", flush=True)
        leave_preempted(self._context)


def _notice_from(context: TaskContext) -> str | None:
    """The task whose notice the handler acted on (it names tasks by their id in the cluster)."""
    if not context.is_multi_worker:
        return context.label
    from tensorflow.python.eager import context as tf_context

    try:
        member = int(tf_context.context().get_config_key_value("TERMINATED_WORKER", 1000))
    except (tf.errors.OpError, ValueError):
        return None
    tasks = [f"{kind}:{i}" for kind in ("chief", "worker") for i in range(len(context.cluster.get(kind, ())))]
    return tasks[member] if 0 <= member < len(tasks) else None


@contextlib.contextmanager
def _no_cloud_probe() -> Iterator[None]:
    """Build the handler without `detect_platform`'s request to the GCE metadata server."""
    from tensorflow.python.distribute.failure_handling import failure_handling_util as util

    original = util.detect_platform
    gpu = bool(tf.config.list_logical_devices("GPU"))
    util.detect_platform = lambda: util.PlatformDevice.INTERNAL_GPU if gpu else util.PlatformDevice.INTERNAL_CPU
    try:
        yield
    finally:
        util.detect_platform = original
