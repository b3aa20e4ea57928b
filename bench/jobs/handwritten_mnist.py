"""The bench's yardstick: jobs/mnist.py's training written by hand with plain tf_keras, no job kit.

    TF_USE_LEGACY_KERAS=1 python bench/jobs/handwritten_mnist.py --data DIR --model-dir DIR [--epochs 3]

The same model, data, input pipeline (uint8 arrays, cast per batch), seed and DATA
sharding as jobs/mnist.py, and the same work around training, each as a careful person
would write it: a checkpoint every epoch (tf.train.CheckpointManager, like the kit's),
TensorBoard epoch summaries, BackupAndRestore every epoch, `steps_per_execution` (16 by
default, the best of 1-20 measured for issue 14), MultiWorkerMirroredStrategy when
TF_CONFIG names several training tasks (non-chief tasks write to a temp dir, as
TensorFlow's tutorial does). It prints `epoch e/E loss=... accuracy=...` after each
epoch's writes, as the kit does, so the bench times both the same way.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
import tf_keras as keras


def load_idx(directory: Path, name: str) -> np.ndarray:
    with gzip.open(directory / f"{name}.gz") as handle:
        data = handle.read()
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(data[3])]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def scale(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.cast(images, tf.float32) / 255.0, tf.cast(labels, tf.int64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, required=True, help="a directory with the four idx .gz files")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per replica")
    parser.add_argument("--steps-per-execution", type=int, default=16)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    keras.utils.set_random_seed(args.seed)

    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    tasks = sum(len(config.get("cluster", {}).get(kind, [])) for kind in ("chief", "worker"))
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if tasks > 1 else tf.distribute.get_strategy()
    task = config.get("task", {"type": "chief", "index": 0})
    is_chief = task["type"] == "chief" or (task["type"] == "worker" and task["index"] == 0
                                           and not config.get("cluster", {}).get("chief"))
    model_dir = args.model_dir if is_chief else Path(tempfile.mkdtemp(prefix="handwritten-"))

    x_train = load_idx(args.data, "train-images-idx3-ubyte").reshape(-1, 784)
    y_train = load_idx(args.data, "train-labels-idx1-ubyte")
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    steps_per_epoch = len(x_train) // global_batch
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
             .shuffle(len(x_train), seed=args.seed).repeat()
             .batch(global_batch, drop_remainder=True)
             .map(scale, num_parallel_calls=tf.data.AUTOTUNE)
             .prefetch(tf.data.AUTOTUNE)
             .with_options(options))

    with strategy.scope():
        model = keras.Sequential([
            keras.Input(shape=(784,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10),
        ])
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=args.steps_per_execution)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), str(model_dir / "checkpoints"),
                                         max_to_keep=5, checkpoint_name="ckpt")
    callbacks = [
        keras.callbacks.BackupAndRestore(str(args.model_dir / "backup")),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: manager.save(checkpoint_number=epoch + 1)),
        keras.callbacks.TensorBoard(str(model_dir / "tensorboard"), update_freq="epoch", profile_batch=0),
        keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: print(
            f"epoch {epoch + 1}/{args.epochs} loss={logs['loss']:.6f} accuracy={logs['accuracy']:.6f}", flush=True)),
    ]
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
