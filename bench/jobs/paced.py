"""A tiny Keras model at a set pace, whose chief logs every step it trains.

    tfl launch bench/jobs/paced.py --cluster FILE -- --epochs 2 --steps-per-epoch 100 \
        --step-sleep 0.1 --backup-every-steps 10 --steps-per-execution 1

Synthetic data (a fixed seed, no download). Every training task sleeps ``--step-sleep`` s
after each step, so that a run lasts long enough to cut or join a host while it trains.
The chief appends one JSON line per step to ``steps.jsonl`` in the model dir:
``{"attempt": TFL_ATTEMPT, "step": global step after it, "time": unix time}``: which
steps each attempt trained (tests/test_elastic_tf.py, bench/elastic_steps.py). Give
``--steps-per-execution 1``, or a line covers a whole call of the train function. The step
a preemption notice was agreed on has no line: the kit saves and leaves at its end before a
job's own callbacks see it (``preempted.json`` names it).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from launcher import jobkit

jobkit.select_tf_keras()  # before tensorflow is imported: Keras 3 breaks under MultiWorkerMirroredStrategy

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402


class StepLog(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    def __init__(self, path: Path | None, attempt: int, pace: float) -> None:
        super().__init__()
        self._path, self._attempt, self._pace = path, attempt, pace

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._pace:
            time.sleep(self._pace)
        if self._path is not None:
            step = int(self.model.optimizer.iterations.numpy())
            with self._path.open("a") as log:
                log.write(json.dumps({"attempt": self._attempt, "step": step, "time": time.time()}) + "\n")


def main() -> None:
    parser = jobkit.job_arguments(__doc__.splitlines()[0], batch_size=16, data_help="unused (synthetic data)")
    parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds every task sleeps after each step")
    args: argparse.Namespace = parser.parse_args()
    keras.utils.set_random_seed(args.seed)
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context, virtual_devices=args.virtual_devices)
    model_dir = args.model_dir or jobkit.default_model_dir(context, "paced")
    rng = np.random.default_rng(args.seed)
    x = rng.normal(size=(4096, 16)).astype("float32")
    y = (x @ rng.normal(size=16) > 0).astype("int64")
    global_batch = jobkit.global_batch_size(args.batch_size, strategy)
    train = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=args.seed).repeat()
             .batch(global_batch, drop_remainder=True))
    with strategy.scope():
        model = keras.Sequential([keras.Input(shape=(16,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.Adam(args.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    log = Path(model_dir) / "steps.jsonl" if context.is_chief else None
    jobkit.fit(model, jobkit.shard_by_data(train), context=context, model_dir=Path(model_dir), epochs=args.epochs,
               steps_per_epoch=args.steps_per_epoch or 100, global_batch_size=global_batch,
               backup_every_steps=args.backup_every_steps, steps_per_execution=args.steps_per_execution,
               callbacks=[StepLog(log, context.attempt, args.step_sleep)])
    jobkit.finish(strategy)  # all training tasks leave together, the chief last


if __name__ == "__main__":
    main()
