"""Whether a replayed tf.data pipeline gives back the batches the interrupted attempt trained on.

A resume reaches step k of a plain pipeline by `dataset.skip(k)` (position.py): exact only if
the pipeline, built again in a new process, yields the same elements in the same order. It
does not when its randomness (a shuffle, a random op, `sample_from_datasets`) has no seed at
all (no op seed and no global seed: TensorFlow then draws fresh seeds in every process) or
when a parallel stage may hand its elements out of order (`deterministic=False`, on the stage
or in `tf.data.Options`). Both are visible in the dataset's graph: a shuffle's seed inputs are
both 0, a random op's `seed`/`seed2` attributes are both 0, a parallel stage's `deterministic`
attribute is "false" (or "default" under options that say False). What cannot be seen there
(a generator's Python state) is not judged.
"""

from __future__ import annotations

from typing import Any

from launcher.jobkit.stateless import STATEFUL_RANDOM

_SHUFFLE_SEEDS = (2, 3)  # a shuffle's inputs: dataset, buffer_size, seed, seed2, ...
_SEEDED_DATASETS = {  # op -> (what it is, where its seed and seed2 are among its inputs)
    **{op: ("a shuffle", _SHUFFLE_SEEDS)
       for op in ("ShuffleDataset", "ShuffleDatasetV3", "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2")},
    **{op: ("a random draw (Dataset.random, sample_from_datasets)", (0, 1))
       for op in ("RandomDataset", "RandomDatasetV2")},
}


def unrepeatable_parts(graph: Any) -> list[str]:
    """What makes the pipeline of `graph` (a GraphDef) differ from one process to the next, one phrase each."""
    consts = {node.name: node for node in graph.node if node.op == "Const"}
    found: list[str] = []
    for node in graph.node:
        what, seeds = _SEEDED_DATASETS.get(node.op, ("", ()))
        if seeds and all(_const_int(consts, node.input[i]) == 0 for i in seeds):
            found.append(f"{what} without a seed ({node.op})")
    functions = [node for f in graph.library.function for node in f.node_def]
    for node in [*graph.node, *functions]:
        if node.op in STATEFUL_RANDOM and "seed" in node.attr and not node.attr["seed"].i and not node.attr["seed2"].i:
            found.append(f"a random op without a seed ({node.op})")
        if "deterministic" in node.attr and node.attr["deterministic"].s == b"false":
            found.append(f"a parallel stage with deterministic=False ({node.op})")
    if _options_allow_any_order(graph) and any(node.attr["deterministic"].s == b"default" for node in graph.node
                                               if "deterministic" in node.attr):
        found.append("a parallel stage under tf.data.Options(deterministic=False)")
    return sorted(set(found))


def _options_allow_any_order(graph: Any) -> bool:
    from tensorflow.core.framework import dataset_options_pb2

    for node in graph.node:
        if node.op == "OptionsDataset":
            options = dataset_options_pb2.Options()
            options.ParseFromString(node.attr["serialized_options"].s)
            if options.WhichOneof("optional_deterministic") and not options.deterministic:
                return True
    return False


def _const_int(consts: dict[str, Any], name: str) -> int | None:
    node = consts.get(name.split(":")[0])
    if node is None:
        return None
    values = node.attr["value"].tensor.int64_val
    return int(values[0]) if len(values) == 1 else None


def why_a_replay_differs(dataset: Any) -> str | None:
    """Why replaying `dataset` (a tf.data.Dataset) in a new process would not give the same batches, or None."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    try:
        graph.ParseFromString(dataset._as_serialized_graph().numpy())
    except Exception:  # noqa: BLE001 - a pipeline TensorFlow cannot serialize (a py_function): not judged
        return None
    parts = unrepeatable_parts(graph)
    return ", ".join(parts) if parts else None
