"""Fashion-MNIST from TFRecord shards (PNG per example): decode, augment, batch; resumes at its step.

    python jobs/prepare_fashion_records.py --out /shared/fashion-records --shards 8
    python jobs/fashion_records.py --records /shared/fashion-records --epochs 3
    tfl launch jobs/fashion_records.py --local 2 -- --records /shared/fashion-records

The input is `jobkit.TFRecordInput`: each pass reads the shards in an order drawn from
(seed, pass) and shuffles records within windows; per example the PNG is decoded, and
augmented (a random flip and a shift of up to 2 pixels) by stateless ops seeded from the
example's position in the stream. A resume seeks to its (file, record) and reads nothing
before it but part of one window (docs/input.md). Every host must see the same shards
(shared storage, or identical copies).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from launcher import jobkit


def parse_args() -> argparse.Namespace:
    parser = jobkit.job_arguments(__doc__.splitlines()[0], batch_size=64,
                                  data_help="Fashion-MNIST for the evaluator's test split (as jobs/mnist.py)")
    parser.add_argument("--records", type=Path, required=True, help="the directory of *.tfrecord shards")
    parser.add_argument("--window", type=int, default=1024, help="records shuffled together within a pass")
    parser.add_argument("--no-augment", action="store_true")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # before TensorFlow is imported: --help and a wrong option answer at once

jobkit.select_tf_keras()  # before tensorflow is imported: Keras 3 breaks under MultiWorkerMirroredStrategy

import tensorflow as tf
import tf_keras as keras

FEATURES = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}


def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    example = tf.io.parse_single_example(record, FEATURES)
    image = tf.io.decode_png(example["image"], channels=1)
    return tf.ensure_shape(image, (28, 28, 1)), example["label"]


def augment(example: tuple[tf.Tensor, tf.Tensor], seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    image, label = example
    flip_seed, shift_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    padded = tf.pad(image, [[2, 2], [2, 2], [0, 0]])
    return tf.image.stateless_random_crop(padded, (28, 28, 1), shift_seed), label


def scale(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    flat = tf.reshape(images, (-1, 784))
    return tf.cast(flat, keras.backend.floatx()) / 255.0, labels


def build_model(learning_rate: float | keras.optimizers.schedules.LearningRateSchedule) -> keras.Model:
    model = keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def main(args: argparse.Namespace) -> None:
    keras.utils.set_random_seed(args.seed)
    keras.backend.set_floatx(args.dtype)
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context, virtual_devices=args.virtual_devices)
    model_dir = args.model_dir or jobkit.default_model_dir(context, "fashion_records")
    print(f"jobkit: model dir {model_dir}", flush=True)

    if context.is_evaluator:
        _, (x_test, y_test) = jobkit.load_mnist(args.data, dataset="fashion_mnist")
        test = tf.data.Dataset.from_tensor_slices((x_test[..., None], y_test.astype("int64"))).batch(256).map(scale)
        jobkit.run_evaluator(build_model(args.learning_rate), test, context=context, model_dir=model_dir,
                             epochs=args.epochs, idle_timeout_s=args.eval_idle_timeout or None)
        return

    global_batch = jobkit.global_batch_size(args.batch_size, strategy)
    train = jobkit.TFRecordInput(args.records, model_dir=model_dir, parse=parse, global_batch=global_batch,
                                 seed=args.seed, augment=None if args.no_augment else augment, batch_fn=scale,
                                 window=args.window)
    steps_per_epoch = args.steps_per_epoch or train.steps_per_epoch
    learning_rate = jobkit.learning_rate(args.learning_rate, strategy, scaling=args.lr_scaling,
                                         warmup_epochs=args.warmup_epochs, steps_per_epoch=steps_per_epoch)
    with strategy.scope():
        model = build_model(learning_rate)
    jobkit.fit(model, train, context=context, model_dir=model_dir, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
               global_batch_size=global_batch, backup_every_steps=args.backup_every_steps,
               steps_per_execution=args.steps_per_execution)
    jobkit.finish(strategy)


if __name__ == "__main__":
    try:
        main(ARGS)
    except jobkit.JobKitError as err:  # bad input: one line, no traceback
        sys.exit(f"fashion_records: {err}")
