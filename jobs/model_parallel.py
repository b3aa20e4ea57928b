"""Seed 001's model parallelism: one MNIST model whose layers run on different devices.

    tfl launch jobs/model_parallel.py --local 1 --virtual-devices 4
    python jobs/model_parallel.py --virtual-devices 4     # by hand

No data parallelism: one task, one replica; layer i is placed on logical device
i mod N, so activations travel from device to device within each step. Its weights,
its forward ops, its backward ops (the gradients: about two thirds of the work) and its
optimizer updates all run on that device: the training step computes the gradients
layer by layer, each under its layer's device, where one GradientTape over the whole
model would put the backward pass on the default device. With `--virtual-devices N`
one physical device (a GPU, or here the CPU) stands in for N.
"""

from __future__ import annotations

import argparse
import sys

from launcher import jobkit


def parse_args() -> argparse.Namespace:
    parser = jobkit.job_arguments(__doc__.splitlines()[0], batch_size=64, data_help="an mnist.npz file", backups=False)
    parser.add_argument("--hidden-layers", type=int, default=3, help="Dense 256 ReLU layers before the output")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # before TensorFlow is imported: --help and a wrong option answer at once

jobkit.select_tf_keras()  # before tensorflow is imported: Keras 3 breaks under MultiWorkerMirroredStrategy

import numpy as np
import tensorflow as tf
import tf_keras as keras


class LayerPerDevice(keras.Model):  # type: ignore[misc]  # tf_keras is untyped
    """Dense layers, layer i on devices[i % len(devices)]: its weights live there and it runs there."""

    def __init__(self, devices: tuple[str, ...], hidden_layers: int) -> None:
        super().__init__(name="layer_per_device")
        self.devices = devices
        self.stack = [keras.layers.Dense(256, activation="relu", name=f"hidden_{i}") for i in range(hidden_layers)]
        self.stack.append(keras.layers.Dense(10, name="logits"))

    def device_of(self, index: int) -> str:
        return self.devices[index % len(self.devices)]

    def call(self, inputs: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        x = inputs
        for i, layer in enumerate(self.stack):
            with tf.device(self.device_of(i)):
                x = layer(x, training=training)
        return x

    def train_step(self, data: tuple[tf.Tensor, ...]) -> dict[str, tf.Tensor]:
        """keras' train step, with the backward pass split by layer: one tape per layer,
        replayed from the loss down, each under the layer's device. (Regularisation
        losses would need their own gradients; this model has none.)"""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        tapes, inputs, outputs = [], [], []
        h = x
        for i, layer in enumerate(self.stack):
            with tf.device(self.device_of(i)), tf.GradientTape() as tape:
                tape.watch(h)
                out = layer(h, training=True)
            tapes.append(tape)
            inputs.append(h)
            outputs.append(out)
            h = out
        last = self.device_of(len(self.stack) - 1)
        with tf.device(last), tf.GradientTape() as loss_tape:
            loss_tape.watch(h)
            loss = self.compute_loss(x, y, h, sample_weight)
            upstream = loss_tape.gradient(loss, h)
        gradients: list[tuple[tf.Tensor, tf.Variable]] = []
        for i in reversed(range(len(self.stack))):
            weights = self.stack[i].trainable_variables
            with tf.device(self.device_of(i)):
                sources = weights if i == 0 else [*weights, inputs[i]]
                grads = tapes[i].gradient(outputs[i], sources, output_gradients=upstream)
            gradients.extend(zip(grads[:len(weights)], weights, strict=True))
            upstream = None if i == 0 else grads[-1]
        self.optimizer.apply_gradients(gradients)  # each update runs where its variable lives
        return self.compute_metrics(x, y, h, sample_weight)


def build_model(devices: tuple[str, ...], hidden_layers: int, learning_rate: float) -> keras.Model:
    model = LayerPerDevice(devices, hidden_layers)
    model(tf.zeros((1, 784)))  # build now, so every layer's weights are created on its device
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def short_device(name: str) -> str:
    spec = tf.DeviceSpec.from_string(name)
    return f"{spec.device_type}:{spec.device_index}"


def to_dataset(images: np.ndarray, labels: np.ndarray) -> tf.data.Dataset:
    # uint8 in the dataset (a quarter of float32's memory); `scale` casts each batch.
    return tf.data.Dataset.from_tensor_slices((images.reshape(len(images), 784), labels))


def scale(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return tf.cast(images, tf.float32) / 255.0, tf.cast(labels, tf.int64)


def main(args: argparse.Namespace) -> None:
    keras.utils.set_random_seed(args.seed)
    context = jobkit.task_context()
    if context.is_multi_worker:
        sys.exit(f"model_parallel: {context.num_training_tasks} training tasks; this job splits one model over "
                 "one task's devices: launch it as one task (tfl launch ... --local 1 --virtual-devices N)")
    devices = jobkit.local_devices(context, virtual_devices=args.virtual_devices)
    model = build_model(devices.names, args.hidden_layers, args.learning_rate)
    placement = ", ".join(f"{layer.name}->{short_device(layer.kernel.device)}" for layer in model.stack)
    print(f"model_parallel: {len(model.stack)} layers on {devices.describe()}: {placement}", flush=True)
    if devices.count == 1:
        print("model_parallel: one device, so no model parallelism; ask for more with --virtual-devices N", flush=True)
    model_dir = args.model_dir or jobkit.default_model_dir(context, "model_parallel")
    print(f"jobkit: model dir {model_dir}", flush=True)
    (x_train, y_train), (x_test, y_test) = jobkit.load_mnist(args.data)

    if context.is_evaluator:
        test = to_dataset(x_test, y_test).batch(256).map(scale)
        jobkit.run_evaluator(model, test, context=context, model_dir=model_dir, epochs=args.epochs,
                             idle_timeout_s=args.eval_idle_timeout or None)
        return

    steps_per_epoch = args.steps_per_epoch or max(1, len(x_train) // args.batch_size)
    train = jobkit.ArrayInput((x_train.reshape(len(x_train), 784), y_train), global_batch=args.batch_size,
                              seed=args.seed, batch_fn=scale)  # addressed by position: a resume replays nothing
    jobkit.fit(model, train, context=context, model_dir=model_dir, epochs=args.epochs,
               steps_per_epoch=steps_per_epoch, global_batch_size=args.batch_size,
               steps_per_execution=args.steps_per_execution)


if __name__ == "__main__":
    main(ARGS)
