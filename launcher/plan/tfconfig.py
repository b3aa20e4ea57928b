"""TF_CONFIG for each task of a cluster. Pure functions, no I/O."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from launcher.contract import TASK_TYPES, TRAINING_TYPES
from launcher.tasks import TaskId

if TYPE_CHECKING:
    from launcher.describe.spec import Topology

__all__ = ["TaskId", "shared_cluster", "tasks_of", "tf_config", "tf_config_json", "tf_config_json_of", "tf_config_of"]


def tasks_of(topology: Topology) -> list[TaskId]:
    """Every task, chief first, evaluator last (the order tasks are started in)."""
    return topology.tasks()


def tf_config(topology: Topology, task: TaskId) -> dict[str, Any]:
    """The TF_CONFIG of one task.

    Training tasks see only the training cluster: the evaluator takes no part in
    MultiWorkerMirroredStrategy's collectives and must not be waited for. The evaluator
    sees the whole cluster, itself included, as TensorFlow's sidecar evaluation expects.
    """
    return tf_config_of({t: list(getattr(topology, t)) for t in TASK_TYPES}, task)


def tf_config_of(addresses: dict[str, list[str]], task: TaskId) -> dict[str, Any]:
    """``tf_config`` from each task type's addresses (a resized cluster's: ``launcher.plan.resize``)."""
    kinds = TASK_TYPES if task.type == "evaluator" else TRAINING_TYPES
    cluster = {t: list(addresses[t]) for t in kinds if addresses.get(t)}
    return {"cluster": cluster, "task": {"type": task.type, "index": task.index}}


def tf_config_json(topology: Topology, task: TaskId) -> str:
    return json.dumps(tf_config(topology, task), separators=(",", ":"))


def tf_config_json_of(addresses: dict[str, list[str]], task: TaskId) -> str:
    return json.dumps(tf_config_of(addresses, task), separators=(",", ":"))


def shared_cluster(configs: Iterable[str]) -> dict[str, list[str]]:
    """One cluster that the TF_CONFIGs given (JSON) are drawn from: each task type's addresses
    as the first of them that names the type gives them (a plan's record keeps this once)."""
    cluster: dict[str, list[str]] = {}
    for text in configs:
        try:
            found = json.loads(text).get("cluster", {})
        except (ValueError, AttributeError):
            continue
        for kind, addresses in found.items() if isinstance(found, dict) else ():
            if kind in TASK_TYPES and isinstance(addresses, list):
                cluster.setdefault(kind, [str(a) for a in addresses])
    return {kind: cluster[kind] for kind in TASK_TYPES if kind in cluster}
