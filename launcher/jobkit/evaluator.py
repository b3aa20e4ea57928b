"""The evaluator task: follow the chief's checkpoints until training is done."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tensorflow as tf
import tf_keras as keras

from launcher.contract import ModelDirLayout
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.layout import make_private_dirs, read_done_marker, read_json_object
from launcher.jobkit.models import require_tf_keras
from launcher.jobkit.progress import ProgressWriter, format_eval_line, progress_record

_EPOCH_IN_NAME = re.compile(r"-(\d+)$")
DEFAULT_IDLE_TIMEOUT_S = 600.0


class EvaluatorTimeout(JobKitError):
    """No new checkpoint, no sign of training and no done marker for too long: training is likely gone."""


def list_checkpoints(directory: Path) -> list[str]:
    """Checkpoint prefixes the chief has published, oldest first ([] before the first)."""
    state = tf.train.get_checkpoint_state(str(directory))
    return list(state.all_model_checkpoint_paths) if state else []


def checkpoint_epoch(path: str) -> int | None:
    match = _EPOCH_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else None


def run_evaluator(
    model: keras.Model,
    dataset: tf.data.Dataset,
    *,
    context: TaskContext,
    model_dir: Path | str,
    epochs: int = 0,
    poll_s: float = 2.0,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Evaluate each new checkpoint; return how many were evaluated.

    Returns once this run's `training_done.json` exists and its final checkpoint was
    evaluated. While it waits it follows the chief's progress record in the model dir
    (rewritten every few seconds while the chief trains), so a long epoch is not taken
    for a dead chief; it raises EvaluatorTimeout only after `idle_timeout_s` with no
    new checkpoint and no sign of training (None: never). `model` must be compiled
    (its metrics are what gets reported).
    """
    require_tf_keras(model, "run_evaluator")
    layout = ModelDirLayout(Path(model_dir))  # a job may well pass a string
    earlier = _evaluated_before(context)  # read before this attempt's first record replaces it
    writer = ProgressWriter(context.progress_file, log_path=context.progress_log)
    # The evaluator often starts before the chief: TensorFlow's summary writer would make the model
    # dir (and <storage>/<run id> above it) with mkdir's 0755, where the chief makes them 0700.
    make_private_dirs(layout.root)
    summaries = tf.summary.create_file_writer(str(layout.eval))
    evaluated: set[str] = set()
    last_record = _eval_record(context, None, epochs, {})
    watch = _TrainingWatch(layout, context, clock)
    print(f"jobkit: evaluator following {layout.checkpoints}; summaries in {layout.eval}", flush=True)
    while True:
        # Read the marker before listing: the chief publishes its last checkpoint
        # before the marker, so a marker seen now implies the listing includes it.
        done = watch.done_marker()
        pending = [p for p in list_checkpoints(layout.checkpoints)
                   if Path(p).name not in evaluated and (checkpoint_epoch(p) or 0) > earlier]
        for path in pending:
            results = _evaluate(model, dataset, path, summaries)
            if results is not None:
                evaluated.add(Path(path).name)
                last_record = _eval_record(context, checkpoint_epoch(path), epochs, results)
                writer.write(last_record, force=True)
            watch.news()
        if done is not None:
            _check_final(done, evaluated, layout, earlier)
            writer.write({**last_record, "phase": "done", "time": time.time()}, force=True)
            return len(evaluated)
        watch.check(idle_timeout_s)
        if not pending:
            sleep(poll_s)


class _TrainingWatch:
    """What the evaluator knows of training: this run's done marker, and when it last saw
    a sign of life (a new checkpoint, or a change in the chief's progress record)."""

    def __init__(self, layout: ModelDirLayout, context: TaskContext, clock: Callable[[], float]) -> None:
        self._layout, self._context, self._clock = layout, context, clock
        self._last_news = clock()
        self._last_heartbeat: object = read_json_object(layout.training_progress)
        self._ignored: set[object] = set()

    def news(self) -> None:
        self._last_news = self._clock()

    def done_marker(self) -> dict[str, Any] | None:
        marker = read_done_marker(self._layout)
        if marker is None or self._context.run_id is None or marker.get("run_id") == self._context.run_id:
            return marker
        if marker.get("run_id") not in self._ignored:  # another run's, left in a reused model dir
            self._ignored.add(marker.get("run_id"))
            print(f"jobkit: evaluator ignores {self._layout.done_file.name} of run {marker.get('run_id')} "
                  f"(this is run {self._context.run_id})", flush=True)
        return None

    def check(self, idle_timeout_s: float | None) -> None:
        heartbeat = read_json_object(self._layout.training_progress)
        if heartbeat is not None and heartbeat != self._last_heartbeat:
            self._last_heartbeat = heartbeat
            self.news()
        if idle_timeout_s is not None and self._clock() - self._last_news > idle_timeout_s:
            raise EvaluatorTimeout(
                f"evaluator: no new checkpoint in {self._layout.checkpoints}, no change in "
                f"{self._layout.training_progress.name} and no {self._layout.done_file.name} for "
                f"{idle_timeout_s:.0f} s; is the chief running? (the limit is the job's --eval-idle-timeout)")


def _evaluated_before(context: TaskContext) -> int:
    """The last epoch an earlier attempt of this evaluator evaluated (its progress record), else 0:
    a resumed run's evaluator goes on after it instead of evaluating every checkpoint again."""
    record = read_json_object(context.progress_file) if context.progress_file is not None else None
    if record is None or record.get("phase") not in ("eval", "done") or not isinstance(record.get("epoch"), int):
        return 0
    if not isinstance(record.get("attempt"), int) or record["attempt"] >= context.attempt or record["epoch"] < 1:
        return 0
    print(f"jobkit: evaluator: attempt {record['attempt']} evaluated the checkpoints up to epoch {record['epoch']}; "
          "going on after them", flush=True)
    return int(record["epoch"])


def _check_final(done: dict[str, Any], evaluated: set[str], layout: ModelDirLayout, earlier: int = 0) -> None:
    final = done.get("final_checkpoint")
    if final is not None and final not in evaluated and (checkpoint_epoch(final) or 0) > earlier:
        raise JobKitError(f"evaluator: {layout.done_file} names final checkpoint {final}, "
                          f"but it is not in {layout.checkpoints}; it could not be evaluated")


def _evaluate(
    model: keras.Model, dataset: tf.data.Dataset, path: str, summaries: Any
) -> dict[str, float] | None:
    """Results of one checkpoint (printed and written to eval/), None if it vanished."""
    try:
        tf.train.Checkpoint(model=model).restore(path).expect_partial()
    except (tf.errors.NotFoundError, ValueError) as err:
        # The chief's CheckpointManager deletes old ones; a slow evaluator can miss some.
        print(f"jobkit: evaluator skipped {Path(path).name}: {err}", flush=True)
        return None
    results = model.evaluate(dataset, verbose=0, return_dict=True)
    epoch = checkpoint_epoch(path)
    print(format_eval_line(Path(path).name, epoch, results), flush=True)
    with summaries.as_default():
        # Named and stepped like the TensorBoard callback's epoch scalars (0-based
        # epoch), so eval and training curves overlay in one TensorBoard chart.
        for name, value in results.items():
            tf.summary.scalar(f"epoch_{name}", value, step=(epoch or 1) - 1)
    summaries.flush()
    return {name: float(value) for name, value in results.items()}


def _eval_record(
    context: TaskContext, epoch: int | None, epochs: int, results: dict[str, float]
) -> dict[str, Any]:
    # Step counters and throughput describe training; the evaluator reports zeros.
    return progress_record(
        task=context.label, attempt=context.attempt, phase="eval", epoch=epoch or 0,
        epochs=epochs, step=0, steps_per_epoch=None, global_step=0, logs=results,
        examples_per_sec=0.0,
    )
