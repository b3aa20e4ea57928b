"""Where a MultiWorkerMirroredStrategy step of jobs/mnist.py's MLP spends its time (bench §8).

    TF_CONFIG=... TF_USE_LEGACY_KERAS=1 python bench/jobs/mwms_profile.py    # on every worker

Prints one JSON line (from every worker; the bench reads the chief's):
- the all-reduces in the training graph: keras' own train function (one step per call)
  against the kit's (several steps per call, metrics read once per call), inside the
  per-step loop and once per call;
- the time of one all-reduce of the gradients' size (all of them in one pack, as
  CommunicationOptions' default bytes_per_pack=0 makes it) and of one metric variable,
  each the median of a loop of them inside one tf.function.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

from launcher import jobkit

jobkit.select_tf_keras()

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from launcher.jobkit.stepping import install_train_function  # noqa: E402

COLLECTIVES = ("CollectiveReduceV2", "CollectiveReduceV3", "CollectiveReduce", "CollectiveGatherV2", "NcclAllReduce")


def model() -> keras.Model:
    net = keras.Sequential([keras.Input(shape=(784,)), keras.layers.Dense(256, activation="relu"),
                            keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])
    net.compile(optimizer=keras.optimizers.Adam(1e-3), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=["accuracy"])
    return net


def count(graph: Any, in_loop: bool = False) -> dict[str, int]:
    """All-reduces in `graph` and the functions it calls; those in a while loop's body apart."""
    found = {"per_step": 0, "per_call": 0}
    for op in graph.get_operations():
        if op.type in COLLECTIVES:
            found["per_step" if in_loop else "per_call"] += 1
    for name, function in graph._functions.items():
        inner = count(function.graph, in_loop or "while_body" in name or "body" in name.lower()) if hasattr(function, "graph") else {}
        for key, value in inner.items():
            found[key] += value
    return found


def all_reduce_seconds(strategy: tf.distribute.Strategy, size: int, repeats: int = 100) -> float:
    """Seconds per all-reduce of `size` floats: a chain of them (each needs the last) in one call."""
    def reduce_once(value: Any) -> Any:
        return tf.distribute.get_replica_context().all_reduce("sum", value * 0.5)

    @tf.function  # type: ignore[misc]
    def chain() -> Any:
        value = tf.ones([size])
        for _ in tf.range(repeats):
            value = strategy.run(reduce_once, args=(value,))
        return value

    chain()  # trace and warm up
    samples = []
    for _ in range(5):
        started = time.perf_counter()
        chain()
        samples.append((time.perf_counter() - started) / repeats)
    return statistics.median(samples)


def main() -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    data = tf.data.Dataset.from_tensors((tf.zeros((64, 784)), tf.zeros((64,), tf.int64))).repeat()
    with strategy.scope():
        stock, kit = model(), model()
    iterator = iter(strategy.experimental_distribute_dataset(data))
    stock_graph = stock.make_train_function().get_concrete_function(iterator).graph
    kit.steps_per_execution.assign(16)
    install_train_function(kit)
    kit_graph = kit.train_function.get_concrete_function(iterator).graph
    gradient_floats = sum(int(tf.size(w)) for w in stock.trainable_weights)
    print(json.dumps({
        "gradient_floats": gradient_floats,
        "stock_all_reduces": count(stock_graph), "kit_all_reduces": count(kit_graph),
        "gradient_all_reduce_s": all_reduce_seconds(strategy, gradient_floats),
        "scalar_all_reduce_s": all_reduce_seconds(strategy, 1),
    }), flush=True)
    jobkit.finish(strategy)


if __name__ == "__main__":
    main()
