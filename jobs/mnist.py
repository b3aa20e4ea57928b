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

from launcher import jobkit

jobkit.select_tf_keras()  # before tensorflow is imported: Keras 3 breaks under MultiWorkerMirroredStrategy

import numpy as np
import tensorflow as tf
import tf_keras as keras


def parse_args() -> argparse.Namespace:
    parser = jobkit.job_arguments(__doc__.splitlines()[0], batch_size=64,
                                  data_help="an .npz (x_train, y_train, x_test, y_test) or a directory of the four idx files")
    parser.add_argument("--dataset", choices=("mnist", "fashion_mnist"), default="mnist")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="float64: for comparing runs whose sums run in another order (N workers against 1 "
                             "process); in float32 those round differently, and training magnifies it")
    return parser.parse_args()


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
    # Kept as uint8: the dataset holds the arrays as constants, and the shuffle buffer a
    # copy; float32 would be four times the memory. `scale` casts each batch instead.
    return tf.data.Dataset.from_tensor_slices((images.reshape(len(images), 784), labels))


def scale(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.cast(images, keras.backend.floatx()) / 255.0, tf.cast(labels, tf.int64)


def main() -> None:
    args = parse_args()
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
    # Same seed on every worker: DATA sharding needs identical shuffles everywhere.
    train = (to_dataset(x_train, y_train)
             .shuffle(len(x_train), seed=args.seed)
             .repeat()
             .batch(global_batch, drop_remainder=True)
             .map(scale, num_parallel_calls=tf.data.AUTOTUNE)
             .prefetch(tf.data.AUTOTUNE))
    learning_rate = jobkit.learning_rate(args.learning_rate, strategy, scaling=args.lr_scaling,
                                         warmup_epochs=args.warmup_epochs, steps_per_epoch=steps_per_epoch)
    with strategy.scope():
        model = build_model(learning_rate)
    jobkit.fit(
        model, jobkit.shard_by_data(train), context=context, model_dir=model_dir,
        epochs=args.epochs, steps_per_epoch=steps_per_epoch, global_batch_size=global_batch,
        backup_every_steps=args.backup_every_steps, steps_per_execution=args.steps_per_execution,
    )
    jobkit.finish(strategy)  # all training tasks leave together, the chief last, without TensorFlow's slow teardown


if __name__ == "__main__":
    main()
