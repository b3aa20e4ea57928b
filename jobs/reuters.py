"""Reuters newswire topics: seed 000's 1-D CNN, trained by one process, MirroredStrategy or a MWMS group.

    python jobs/reuters.py --epochs 3                      # by hand: one process
    tfl launch jobs/reuters.py --local 2 -- --epochs 3     # the launcher sets TF_CONFIG
    tfl launch jobs/reuters.py --local 1 --virtual-devices 4   # 4 replicas on one machine

Embedding(words, 7) -> Conv1D 64x5 ReLU -> MaxPool 2 -> Conv1D 32x3 ReLU -> MaxPool 2
-> Flatten -> Dense 46 softmax; Nadam; sparse categorical cross-entropy; accuracy and
top-5 accuracy; stories padded (and cut) to 300 words.
"""

from __future__ import annotations

import argparse

from launcher import jobkit


def parse_args() -> argparse.Namespace:
    parser = jobkit.job_arguments(__doc__.splitlines()[0], batch_size=32, data_help="a reuters.npz file as keras ships it")
    parser.add_argument("--num-words", type=int, default=10000, help="vocabulary: the most frequent N words")
    parser.add_argument("--maxlen", type=int, default=300, help="stories are padded or cut to this many words")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # before TensorFlow is imported: --help and a wrong option answer at once

jobkit.select_tf_keras()  # before tensorflow is imported: Keras 3 breaks under MultiWorkerMirroredStrategy

import numpy as np
import tensorflow as tf
import tf_keras as keras

from launcher.jobkit.reuters import NUM_CLASSES


def build_model(num_words: int, maxlen: int,
                learning_rate: float | keras.optimizers.schedules.LearningRateSchedule) -> keras.Model:
    model = keras.Sequential([
        keras.Input(shape=(maxlen,), dtype="int32"),
        keras.layers.Embedding(num_words, 7),
        keras.layers.Conv1D(64, 5, activation="relu"),
        keras.layers.MaxPooling1D(2),
        keras.layers.Conv1D(32, 3, activation="relu"),
        keras.layers.MaxPooling1D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(NUM_CLASSES, activation="softmax"),
    ])
    model.compile(
        optimizer=keras.optimizers.Nadam(learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=5, name="top5_accuracy")],
    )
    return model


def to_dataset(stories: np.ndarray, labels: np.ndarray, maxlen: int) -> tf.data.Dataset:
    # Padded and cut at the front, keras' default: the end of a story is kept.
    padded = keras.utils.pad_sequences(stories, maxlen=maxlen).astype("int32")
    return tf.data.Dataset.from_tensor_slices((padded, labels.astype("int64")))


def main(args: argparse.Namespace) -> None:
    keras.utils.set_random_seed(args.seed)
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context, virtual_devices=args.virtual_devices)
    model_dir = args.model_dir or jobkit.default_model_dir(context, "reuters")
    print(f"jobkit: model dir {model_dir}", flush=True)
    (x_train, y_train), (x_test, y_test) = jobkit.load_reuters(args.data, num_words=args.num_words)

    if context.is_evaluator:
        model = build_model(args.num_words, args.maxlen, args.learning_rate)
        test = to_dataset(x_test, y_test, args.maxlen).batch(256)
        jobkit.run_evaluator(model, test, context=context, model_dir=model_dir, epochs=args.epochs,
                             idle_timeout_s=args.eval_idle_timeout or None)
        return

    global_batch = jobkit.global_batch_size(args.batch_size, strategy)
    steps_per_epoch = args.steps_per_epoch or max(1, len(x_train) // global_batch)
    # Same seed on every worker: DATA sharding needs identical shuffles everywhere.
    train = (to_dataset(x_train, y_train, args.maxlen)
             .shuffle(len(x_train), seed=args.seed)
             .repeat()
             .batch(global_batch, drop_remainder=True))
    learning_rate = jobkit.learning_rate(args.learning_rate, strategy, scaling=args.lr_scaling,
                                         warmup_epochs=args.warmup_epochs, steps_per_epoch=steps_per_epoch)
    with strategy.scope():
        model = build_model(args.num_words, args.maxlen, learning_rate)
    jobkit.fit(
        model, jobkit.shard_by_data(train), context=context, model_dir=model_dir,
        epochs=args.epochs, steps_per_epoch=steps_per_epoch, global_batch_size=global_batch,
        backup_every_steps=args.backup_every_steps, steps_per_execution=args.steps_per_execution,
    )
    jobkit.finish(strategy)  # all training tasks leave together, without TensorFlow's slow teardown


if __name__ == "__main__":
    main(ARGS)
