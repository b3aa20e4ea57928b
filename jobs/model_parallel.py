"""Seed 001's model parallelism: one MNIST model whose layers run on different devices.

    tfl launch jobs/model_parallel.py --local 1 --virtual-devices 4
    python jobs/model_parallel.py --virtual-devices 4     # by hand

No data parallelism: one task, one replica; layer i is placed on logical device
i mod N, so activations travel from device to device within each step. With
`--virtual-devices N` one physical device (a GPU, or here the CPU) stands in for N.
"""

from __future__ import annotations

import argparse
import sys

from launcher import jobkit

jobkit.select_tf_keras()  # before tensorflow is imported: Keras 3 breaks under MultiWorkerMirroredStrategy

import numpy as np
import tensorflow as tf
import tf_keras as keras


def parse_args() -> argparse.Namespace:
    parser = jobkit.job_arguments(__doc__.splitlines()[0], batch_size=64, data_help="an mnist.npz file", backups=False)
    parser.add_argument("--hidden-layers", type=int, default=3, help="Dense 256 ReLU layers before the output")
    return parser.parse_args()


class LayerPerDevice(keras.Model):  # type: ignore[misc]  # tf_keras is untyped
    """Dense layers, layer i on devices[i % len(devices)]: its weights live there and it runs there."""

    def __init__(self, devices: tuple[str, ...], hidden_layers: int) -> None:
        super().__init__(name="layer_per_device")
        self.devices = devices
        self.stack = [keras.layers.Dense(256, activation="relu", name=f"hidden_{i}") for i in range(hidden_layers)]
        self.stack.append(keras.layers.Dense(10, name="logits"))

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        x = inputs
        for i, layer in enumerate(self.stack):
            with tf.device(self.devices[i % len(self.devices)]):
                x = layer(x)
        return x


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
    flat = images.reshape(len(images), 784).astype("float32") / 255.0
    return tf.data.Dataset.from_tensor_slices((flat, labels.astype("int64")))


def main() -> None:
    args = parse_args()
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
        test = to_dataset(x_test, y_test).batch(256)
        jobkit.run_evaluator(model, test, context=context, model_dir=model_dir, epochs=args.epochs)
        return

    steps_per_epoch = args.steps_per_epoch or max(1, len(x_train) // args.batch_size)
    train = (to_dataset(x_train, y_train)
             .shuffle(len(x_train), seed=args.seed)
             .repeat()
             .batch(args.batch_size, drop_remainder=True))
    jobkit.fit(model, train, context=context, model_dir=model_dir, epochs=args.epochs,
               steps_per_epoch=steps_per_epoch, global_batch_size=args.batch_size)


if __name__ == "__main__":
    main()
