"""TF_CONFIG for each task of a cluster. Pure functions, no I/O."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from launcher.spec import TASK_TYPES, TRAINING_TYPES, Topology


@dataclass(frozen=True, order=True)
class TaskId:
    type: str
    index: int

    def __str__(self) -> str:
        return f"{self.type}:{self.index}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        kind, _, index = text.partition(":")
        if kind not in TASK_TYPES or not index.isdigit():
            raise ValueError(f"'{text}' is not a task; write type:index, e.g. chief:0 or worker:1")
        return cls(kind, int(index))

    @property
    def is_training(self) -> bool:
        return self.type in TRAINING_TYPES


def tasks_of(topology: Topology) -> list[TaskId]:
    """Every task, chief first, evaluator last (the order tasks are started in)."""
    return [TaskId(t, i) for t in TASK_TYPES for i in range(len(getattr(topology, t)))]


def tf_config(topology: Topology, task: TaskId) -> dict[str, Any]:
    """The TF_CONFIG of one task.

    Training tasks see only the training cluster: the evaluator takes no part in
    MultiWorkerMirroredStrategy's collectives and must not be waited for. The evaluator
    sees the whole cluster, itself included, as TensorFlow's sidecar evaluation expects.
    """
    kinds = TASK_TYPES if task.type == "evaluator" else TRAINING_TYPES
    cluster = {t: list(getattr(topology, t)) for t in kinds if getattr(topology, t)}
    return {"cluster": cluster, "task": {"type": task.type, "index": task.index}}


def tf_config_json(topology: Topology, task: TaskId) -> str:
    return json.dumps(tf_config(topology, task), separators=(",", ":"))
