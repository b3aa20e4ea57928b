"""`fit`: model.fit plus the kit's callbacks, chief-only writes and the done marker."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from launcher.jobkit.callbacks import EpochCheckpoint, ProgressCallback
from launcher.jobkit.consistency import RestoredStateCheck
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.layout import ModelDirLayout, chief_only_writes, write_json_atomically
from launcher.jobkit.progress import ProgressWriter


def use_true_per_step_logs(model: keras.Model) -> None:
    """Make keras' per-batch logs the true global values under a distribution strategy.

    The stock train_step returns `metric.result()`, which tf_keras already aggregates
    across all replicas (metrics_utils.result_wrapper: merge_call over sync-on-read
    state). Every replica therefore holds the same, true value, but the default
    reduction "auto" resolves to "sum" off TPU (training.reduce_per_replica), so the
    per-batch logs come out num_replicas_in_sync times too large. "first" is the
    reduction meant for already-synchronised values. A custom train_step might return
    unsynchronised per-replica values, so it, and an explicit choice, are left alone.
    Epoch-end logs are recomputed by keras from the metrics and are unaffected.
    """
    if model.distribute_reduction_method != "auto":
        return
    if type(model).train_step is not keras.Model.train_step:
        print("jobkit: custom train_step; per-step progress values may be "
              "num_replicas_in_sync times too large under a distribution strategy", flush=True)
        return
    model.distribute_reduction_method = "first"


def fit(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    context: TaskContext,
    model_dir: Path,
    epochs: int,
    global_batch_size: int,
    steps_per_epoch: int | None = None,
    backup_every_steps: int | None = None,
    callbacks: Sequence[keras.callbacks.Callback] = (),
) -> keras.callbacks.History:
    """Train with checkpoints/, tensorboard/ and backup/ under `model_dir`.

    `backup_every_steps=None` backs up at epoch ends; an int backs up every N steps
    so a restarted group loses at most N steps (keras resumes mid-epoch).
    The chief writes `training_done.json` last, which releases the evaluator.
    """
    if backup_every_steps is not None and backup_every_steps < 1:
        raise JobKitError(f"backup_every_steps is {backup_every_steps}; expected a positive "
                          "number of steps, or None to back up at the end of each epoch")
    use_true_per_step_logs(model)
    if context.is_chief:
        # A marker left by an earlier run in this dir would stop the evaluator early.
        ModelDirLayout(model_dir).done_file.unlink(missing_ok=True)
    with chief_only_writes(model_dir, context) as layout:
        checkpoints = EpochCheckpoint(str(layout.checkpoints))
        # Backup first: it restores the training state in on_train_begin. It gets the
        # real dir on every task (all restore from the chief's); it redirects
        # non-chief writes itself.
        backup = keras.callbacks.BackupAndRestore(
            backup_dir=str(ModelDirLayout(model_dir).backup), save_freq=backup_every_steps or "epoch")
        # Right after the restore: every training task must go on from the same state.
        agreement = RestoredStateCheck(context, backup_dir=str(ModelDirLayout(model_dir).backup))
        kit_callbacks: list[keras.callbacks.Callback] = [backup, agreement, checkpoints]
        if context.is_chief:
            kit_callbacks.append(keras.callbacks.TensorBoard(
                log_dir=str(layout.tensorboard), update_freq="epoch", profile_batch=0))
        writer = ProgressWriter(context.progress_file, log_path=context.progress_log)
        kit_callbacks.append(ProgressCallback(context, writer, global_batch_size))
        history = model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch,
                            callbacks=[*kit_callbacks, *callbacks], verbose=0)
        if context.is_chief:
            _write_done_marker(layout, context, checkpoints.latest, epochs, model)
    return history


def _write_done_marker(
    layout: ModelDirLayout, context: TaskContext, latest: str | None, epochs: int, model: keras.Model
) -> None:
    marker: dict[str, Any] = {
        "final_checkpoint": Path(latest).name if latest else None,
        "epochs": epochs,
        "global_step": int(model.optimizer.iterations.numpy()),
        "run_id": context.run_id,
        "attempt": context.attempt,
        "time": time.time(),
    }
    write_json_atomically(layout.done_file, marker)
    print(f"jobkit: training done; wrote {layout.done_file}", flush=True)
