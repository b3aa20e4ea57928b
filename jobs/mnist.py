"""MNIST MLP (784-256-256-10), trained by one process or a MultiWorkerMirroredStrategy group.

    python jobs/mnist.py --epochs 3                  # by hand: one process
    tfl launch jobs/mnist.py --local 2 -- --epochs 3  # the launcher sets TF_CONFIG
    tfl launch jobs/mnist.py --local 1 --virtual-devices 4   # seed 001: 4 replicas, one CPU
    python jobs/mnist.py --dataset fashion_mnist --epochs 10  # Zalando's clothes instead of digits
    tfl launch jobs/mnist.py --local 4 -- --lr-scaling linear --warmup-epochs 1   # batch grows x4, so does the rate

With an `evaluator` task in TF_CONFIG, that task follows the chief's checkpoints.
"""

from __future__ import annotations

import argparse
import sys

from launcher import jobkit


def parse_args() -> argparse.Namespace:
    parser = jobkit.job_arguments(__doc__.splitlines()[0], batch_size=64,
                                  data_help="an .npz (x_train, y_train, x_test, y_test) or a directory of the four idx files")
    parser.add_argument("--dataset", choices=("mnist", "fashion_mnist"), default="mnist", help="default: mnist")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="float64: for comparing runs whose sums run in another order (N workers against 1 "
                             "process); in float32 those round differently, and training magnifies it (default: float32)")
    parser.add_argument("--input", choices=("addressed", "pipeline"), default="addressed",
                        help="pipeline: a plain tf.data pipeline with a shuffle buffer, which a resume reaches by "
                             "replaying every batch before it (the reference for docs/input.md; default: addressed)")
    parser.add_argument("--no-replay", action="store_true",
                        help="with --input pipeline: resume without the replay (not exact)")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # before TensorFlow is imported: --help and a wrong option answer at once

jobkit.select_tf_keras()  # before tensorflow is imported: Keras 3 breaks under MultiWorkerMirroredStrategy

import numpy as np
import tensorflow as tf
import tf_keras as keras


def build_model(learning_rate: float | keras.optimizers.schedules.LearningRateSchedule) -> keras.Model:
    model = keras.Sequential([
        keras.Input(shape=(784,)),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(256, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def to_dataset(images: np.ndarray, labels: np.ndarray) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((images.reshape(len(images), 784), labels))


def shuffled_pipeline(images: np.ndarray, labels: np.ndarray, global_batch: int, seed: int) -> tf.data.Dataset:
    # Same seed on every worker: DATA sharding needs identical shuffles everywhere.
    return (to_dataset(images, labels).shuffle(len(images), seed=seed).repeat()
            .batch(global_batch, drop_remainder=True)
            .map(scale, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))


def scale(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.cast(images, keras.backend.floatx()) / 255.0, tf.cast(labels, tf.int64)


def main(args: argparse.Namespace) -> None:
    keras.utils.set_random_seed(args.seed)
    keras.backend.set_floatx(args.dtype)
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context, virtual_devices=args.virtual_devices)
    model_dir = args.model_dir or jobkit.default_model_dir(context, "mnist")
    print(f"jobkit: model dir {model_dir}", flush=True)
    (x_train, y_train), (x_test, y_test) = jobkit.load_mnist(args.data, dataset=args.dataset)

    if context.is_evaluator:
        model = build_model(args.learning_rate)
        test = to_dataset(x_test, y_test).batch(256).map(scale)
        jobkit.run_evaluator(model, test, context=context, model_dir=model_dir, epochs=args.epochs,
                             idle_timeout_s=args.eval_idle_timeout or None)
        return

    global_batch = jobkit.global_batch_size(args.batch_size, strategy)
    steps_per_epoch = args.steps_per_epoch or max(1, len(x_train) // global_batch)
    # Each pass a fresh permutation from (seed, pass), addressed by position: a resume starts
    # at its step and reads nothing before it. Kept as uint8; `scale` casts each batch.
    train = jobkit.ArrayInput((x_train.reshape(len(x_train), 784), y_train), global_batch=global_batch,
                              seed=args.seed, batch_fn=scale) if args.input == "addressed" \
        else jobkit.shard_by_data(shuffled_pipeline(x_train, y_train, global_batch, args.seed))
    learning_rate = jobkit.learning_rate(args.learning_rate, strategy, scaling=args.lr_scaling,
                                         warmup_epochs=args.warmup_epochs, steps_per_epoch=steps_per_epoch)
    with strategy.scope():
        model = build_model(learning_rate)
    jobkit.fit(
        model, train, context=context, model_dir=model_dir,
        epochs=args.epochs, steps_per_epoch=steps_per_epoch, global_batch_size=global_batch,
        backup_every_steps=args.backup_every_steps, steps_per_execution=args.steps_per_execution,
        replay=not args.no_replay,
    )
    jobkit.finish(strategy)  # all training tasks leave together, the chief last, without TensorFlow's slow teardown


if __name__ == "__main__":
    try:
        main(ARGS)
    except jobkit.JobKitError as err:  # refused (bad data, a resume on another input): one line, no traceback
        sys.exit(f"mnist: {err}")
