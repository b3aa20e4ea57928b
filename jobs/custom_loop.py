"""A custom training loop (TensorFlow's multi_worker_with_ctl pattern) that survives preemption.

    tfl launch jobs/custom_loop.py --local 2 -- --steps 200

Without keras' fit, one call does what `jobkit.fit` does for free:
`jobkit.preemption_handler(strategy, checkpoint, directory)` restores the latest
checkpoint there and, on a notice (SIGTERM) to any training task, makes every task save
at one agreed step and exit 170 (tfl restarts the group). The loop runs each step through
`handler.run` and starts the input where the checkpoint left it (`jobkit.ArrayInput`'s
`distribute(strategy, step)`: nothing before it is read), so a resumed run trains on exactly
the batches an uninterrupted one would.
The data: a seeded synthetic regression (y = x·w + noise), so the job needs no download.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher import jobkit


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="training steps in all")
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--model-dir", type=Path, default=None, help="default: $TFL_RUN_DIR/model, else a new temp dir")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # before TensorFlow is imported: --help and a wrong option answer at once

jobkit.select_tf_keras()  # before tensorflow is imported

import numpy as np
import tensorflow as tf
import tf_keras as keras

FEATURES, EXAMPLES = 8, 4096


def synthetic_data(seed: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(EXAMPLES, FEATURES))
    y = x @ rng.normal(size=(FEATURES, 1)) + 0.1 * rng.normal(size=(EXAMPLES, 1))
    return x.astype(dtype), y.astype(dtype)


def main(args: argparse.Namespace) -> None:
    keras.utils.set_random_seed(args.seed)
    keras.backend.set_floatx(args.dtype)
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context)
    model_dir = args.model_dir or jobkit.default_model_dir(context, "custom_loop")
    global_batch = jobkit.global_batch_size(args.batch_size, strategy)
    # Addressed by position (before the strategy's scope): a resume starts the input at its step.
    data = jobkit.ArrayInput(synthetic_data(args.seed, args.dtype), global_batch=global_batch, seed=args.seed)

    with strategy.scope():
        model = keras.Sequential([keras.Input(shape=(FEATURES,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.Adam(0.01)
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    # Restores the latest checkpoint in the directory (the step with it) and arms the notice.
    handler = jobkit.preemption_handler(strategy, checkpoint, str(model_dir / "preemption"))

    # The stream goes on at the step the checkpoint left it: the kit splits each global batch over the replicas.
    iterator = iter(data.distribute(strategy, int(step.numpy())))

    @tf.function
    def train_step(iterator: tf.distribute.DistributedIterator) -> tf.Tensor:
        def step_fn(inputs: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
            x, y = inputs
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(tf.square(model(x, training=True) - y)[:, 0],
                                                  global_batch_size=global_batch)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                          model.trainable_variables, strict=True))
            return loss

        losses = strategy.run(step_fn, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    if step.numpy():
        print(f"custom loop: resuming after step {int(step.numpy())}", flush=True)
    while step.numpy() < args.steps:
        loss = handler.run(train_step, iterator)
        step.assign_add(1)
        print(f"step {int(step.numpy())} loss={float(loss):.12f}", flush=True)
    digest = sum(float(np.sum(np.abs(v.numpy()))) for v in model.weights)
    print(f"custom loop: done, weights digest {digest:.15e}", flush=True)
    jobkit.finish(strategy)


if __name__ == "__main__":
    main(ARGS)
