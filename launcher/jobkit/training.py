"""`fit`: model.fit plus the kit's callbacks, chief-only writes and the done marker."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from launcher.contract import ModelDirLayout
from launcher.jobkit.addressed import AddressedInput
from launcher.jobkit.backup import StepBackup
from launcher.jobkit.callbacks import EpochCheckpoint, ProgressCallback, ReplayTimer, StepClock
from launcher.jobkit.consistency import PositionCheck, RestoredStateCheck
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.execution import check_steps_per_execution
from launcher.jobkit.input_identity import check_same_input
from launcher.jobkit.layout import chief_only_writes, finished_run, read_done_marker, write_json_atomically
from launcher.jobkit.models import require_tf_keras
from launcher.jobkit.position import NOTHING, input_stream, saved_state, say_where_the_input_starts
from launcher.jobkit.preemption import PreemptionCheckpoint
from launcher.jobkit.progress import ProgressWriter, progress_record
from launcher.jobkit.quiet import kit_hook_timing_quiet
from launcher.jobkit.stepping import AutoStepsPerExecution, chief_decides, install_train_function, uses_stock_step

HEARTBEAT_INTERVAL_S = 5.0  # the chief's record in the model dir, which the evaluator follows


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
    if not uses_stock_step(model):
        if model.distribute_strategy.num_replicas_in_sync > 1:
            print("jobkit: custom train_step; per-step progress values may be "
                  "num_replicas_in_sync times too large under a distribution strategy", flush=True)
        return
    model.distribute_reduction_method = "first"


def fit(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    context: TaskContext,
    model_dir: Path | str,
    epochs: int,
    global_batch_size: int,
    steps_per_epoch: int | None = None,
    backup_every_steps: int | None = None,
    steps_per_execution: int | None = None,
    callbacks: Sequence[keras.callbacks.Callback] = (),
    replay: bool = True,
) -> keras.callbacks.History:
    """Train with checkpoints/, tensorboard/ and backup/ under `model_dir`.

    `backup_every_steps=None` backs up at epoch ends; an int backs up every N steps
    so a restarted group loses at most N steps (keras resumes mid-epoch).
    `steps_per_execution=None` lets the kit choose from the measured step time (unless
    the model was compiled with a value above 1); progress is recorded once per call.
    The chief writes `training_done.json` when training ends, which releases the
    evaluator, and which a restarted attempt of the same run takes as "already trained".
    `dataset` is best an `AddressedInput` (a resume starts it at its step); a plain
    tf.data pipeline reaches that step by a replay, or, with `replay=False`, starts at the
    beginning of its stream (not exact: see docs/input.md).
    """
    if backup_every_steps is not None and backup_every_steps < 1:
        raise JobKitError(f"backup_every_steps is {backup_every_steps}; expected a positive "
                          "number of steps, or None to back up at the end of each epoch")
    check_steps_per_execution(steps_per_execution)
    require_tf_keras(model, "fit")
    if context.is_evaluator:  # it would train a model of its own, alone, and evaluate nothing
        raise JobKitError(f"jobkit.fit was called in the evaluator task ({context.label}), which does not train; give "
                          "the job a branch `if context.is_evaluator: jobkit.run_evaluator(...)` before fit "
                          "(jobs/mnist.py has one), or launch it without --evaluator")
    model_dir = Path(model_dir)  # a job may well pass a string
    real = ModelDirLayout(model_dir)
    done = finished_run(real, context)
    if done is not None:
        return _already_trained(model, real, done, context)
    use_true_per_step_logs(model)
    if context.is_chief and read_done_marker(real) is not None:
        real.done_file.unlink(missing_ok=True)  # another run's: it would release the evaluator early
    # The input starts where the backup keras is about to restore leaves off (position.py).
    state = saved_state(real.backup)
    if isinstance(dataset, AddressedInput):
        if dataset.batch.size != global_batch_size:
            raise JobKitError(f"the input's global batch is {dataset.batch.size} examples but fit got "
                              f"global_batch_size={global_batch_size}; pass the same number to both")
        dataset.prepare(real.root, context.is_chief)
        check_same_input(real.root, dataset.identity(), resuming=state != NOTHING, is_chief=context.is_chief)
    stream = input_stream(dataset, steps_per_epoch, state, model.distribute_strategy, replay=replay)
    say_where_the_input_starts(stream, dataset)
    with chief_only_writes(model_dir, context) as layout:
        clock = StepClock(replayed=stream.replayed and stream.start > 0)
        checkpoints = EpochCheckpoint(str(layout.checkpoints), max_to_keep=None if context.has_evaluator else 5)
        on_trained = (lambda: _write_done_marker(layout, context, checkpoints.latest, epochs, model)) \
            if context.is_chief else None
        # Backup before the others: it restores the training state in on_train_begin. It
        # gets the real dir on every task (all restore from the chief's) and redirects
        # non-chief writes itself. The clock first of all, to time the train function alone.
        # Right after the restore, every training task must go on from the same state.
        backup = StepBackup(str(real.backup), backup_every_steps, on_trained)
        kit: list[keras.callbacks.Callback] = [clock, backup]
        if (stream.exact or stream.replayed) and stream.steps_per_epoch:  # placed at the backup's step
            kit.append(PositionCheck(state, stream.steps_per_epoch))
        kit += [RestoredStateCheck(context, backup_dir=str(real.backup)), checkpoints]
        if stream.replayed:
            kit.append(ReplayTimer(stream.start))
        if context.is_chief:
            kit.append(keras.callbacks.TensorBoard(log_dir=str(layout.tensorboard), update_freq="epoch", profile_batch=0))
        kit += _steps_per_execution(model, steps_per_execution, clock, context, backup_every_steps)
        writers = [ProgressWriter(context.progress_file, log_path=context.progress_log)]
        if context.is_chief:
            writers.append(ProgressWriter(real.training_progress, min_interval_s=HEARTBEAT_INTERVAL_S))
        progress = ProgressCallback(context, writers, global_batch_size, clock,
                                    replaying=stream.start if stream.replayed else 0)
        # Last of the kit's: on a notice it saves after the others have seen the call.
        kit += [progress, PreemptionCheckpoint(context, backup, model_dir, progress)]
        try:
            with kit_hook_timing_quiet(callbacks):
                history: keras.callbacks.History = model.fit(
                    stream.dataset, epochs=epochs, steps_per_epoch=stream.steps_per_epoch, callbacks=[*kit, *callbacks],
                    verbose=0)
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as err:
            raise _named_input_error(dataset, model, err) from err
    return history


def _named_input_error(dataset: Any, model: keras.Model, err: Exception) -> Exception:
    """An input error of a TFRecordInput, with the file and record it came from (else `err` itself)."""
    find = getattr(dataset, "find_unparsable", None)
    if find is None:
        return err
    trained = int(model.optimizer.iterations.numpy())  # the failed step's examples come from here on
    found: JobKitError | None = find(trained * dataset.batch.size, limit=64 * dataset.batch.size)
    if found is None:
        return err
    print(f"jobkit: {found}", flush=True)
    return found


def _steps_per_execution(model: keras.Model, fixed: int | None, clock: StepClock, context: TaskContext,
                         backup_every_steps: int | None) -> list[keras.callbacks.Callback]:
    """Set steps_per_execution, or return the callback that will choose it."""
    compiled = int(model.steps_per_execution.numpy())
    auto = fixed is None and compiled == 1 and not model.autotune_steps_per_execution
    if fixed is not None and backup_every_steps is not None and backup_every_steps % fixed:
        print(f"jobkit: {fixed} steps per call do not divide the backup interval ({backup_every_steps} steps): "
              "backups happen at the end of the call that passes it, up to "
              f"{fixed - 1} steps late", flush=True)
    if not model.autotune_steps_per_execution:
        model.steps_per_execution.assign(fixed or compiled)
        how = install_train_function(model)
    else:
        how = "keras' own tuning"
    print(f"jobkit: steps per call of the train function: "
          f"{'chosen after measuring' if auto else int(model.steps_per_execution.numpy())} ({how})", flush=True)
    if not auto:
        return []
    agree = chief_decides(model.distribute_strategy, context.is_chief)
    return [AutoStepsPerExecution(clock, backup_every_steps=backup_every_steps, agree=agree)]


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
    layout.preempted_file.unlink(missing_ok=True)  # the run is no longer stopped at a preemption
    print(f"jobkit: training done; wrote {layout.done_file}", flush=True)


def _already_trained(model: keras.Model, layout: ModelDirLayout, done: dict[str, Any],
                     context: TaskContext) -> keras.callbacks.History:
    """An earlier attempt of this run finished training (it failed afterwards): load its
    final weights instead of training again, and report the run as done."""
    final = done.get("final_checkpoint")
    print(f"jobkit: attempt {done.get('attempt')} of run {context.run_id} already finished training "
          f"({final}, global step {done.get('global_step')}); not training again", flush=True)
    if final:
        tf.train.Checkpoint(model=model).restore(str(layout.checkpoints / final)).expect_partial()
    epochs = int(done.get("epochs") or 0)
    record = progress_record(task=context.label, attempt=context.attempt, phase="done", epoch=epochs, epochs=epochs,
                             step=0, steps_per_epoch=None, global_step=int(done.get("global_step") or 0), logs={},
                             examples_per_sec=0.0)
    ProgressWriter(context.progress_file, log_path=context.progress_log).write(record, force=True)
    history = keras.callbacks.History()
    history.history, history.epoch, history.params = {}, [], {"epochs": epochs, "steps": None}
    history.set_model(model)
    return history
