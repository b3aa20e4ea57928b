"""MNIST MLP (784-256-256-10), trained by one process or a MultiWorkerMirroredStrategy group.

    python jobs/mnist.py --epochs 3                  # by hand: one process
    tfl launch jobs/mnist.py --local 2 -- --epochs 3  # the launcher sets TF_CONFIG
    tfl launch jobs/mnist.py --local 1 --virtual-devices 4   # seed 001: 4 replicas, one CPU

With an `evaluator` task in TF_CONFIG, that task follows the chief's checkpoints.
"""

from __future__ import annotations

import argparse

from launcher import jobkit

jobkit.select_tf_keras()  # before tensorflow is imported: Keras 3 breaks under MultiWorkerMirroredStrategy

import numpy as np
import tensorflow as tf
import tf_keras as keras


def parse_args() -> argparse.Namespace:
    parser = jobkit.job_arguments(__doc__.splitlines()[0], batch_size=64, data_help="an mnist.npz file")
    return parser.parse_args()


def build_model(learning_rate: float) -> keras.Model:
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
    flat = images.reshape(len(images), 784).astype("float32") / 255.0
    return tf.data.Dataset.from_tensor_slices((flat, labels.astype("int64")))


def main() -> None:
    args = parse_args()
    keras.utils.set_random_seed(args.seed)
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context, virtual_devices=args.virtual_devices)
    model_dir = args.model_dir or jobkit.default_model_dir(context, "mnist")
    print(f"jobkit: model dir {model_dir}", flush=True)
    (x_train, y_train), (x_test, y_test) = jobkit.load_mnist(args.data)

    if context.is_evaluator:
        model = build_model(args.learning_rate)
        test = to_dataset(x_test, y_test).batch(256)
        jobkit.run_evaluator(model, test, context=context, model_dir=model_dir, epochs=args.epochs)
        return

    global_batch = jobkit.global_batch_size(args.batch_size, strategy)
    steps_per_epoch = args.steps_per_epoch or max(1, len(x_train) // global_batch)
    # Same seed on every worker: DATA sharding needs identical shuffles everywhere.
    train = (to_dataset(x_train, y_train)
             .shuffle(len(x_train), seed=args.seed)
             .repeat()
             .batch(global_batch, drop_remainder=True))
    with strategy.scope():
        model = build_model(args.learning_rate)
    jobkit.fit(
        model, jobkit.shard_by_data(train), context=context, model_dir=model_dir,
        epochs=args.epochs, steps_per_epoch=steps_per_epoch, global_batch_size=global_batch,
        backup_every_steps=args.backup_every_steps,
    )
    jobkit.finish(strategy)  # all training tasks leave together, without TensorFlow's slow teardown


if __name__ == "__main__":
    main()
