"""The base type every stage shares: a task's id (``worker:1``).

Nothing from the launcher but the (stdlib-only) contract is imported here, so every other
module can import these without a cycle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from launcher.contract import TASK_TYPES, TRAINING_TYPES

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})  # this machine, as a cluster file may name it


def is_local_host(host: str) -> bool:
    """This machine: hostnames ignore case, so `LOCALHOST` is `localhost` (not a host to reach by SSH)."""
    return host.lower() in LOCAL_HOSTS


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

    @property
    def slug(self) -> str:
        """``worker-1``: the task's name in file names."""
        return f"{self.type}-{self.index}"


def task_ids(counts: Mapping[str, int]) -> list[TaskId]:
    """Every task, chief first, evaluator last (the order tasks are started in)."""
    return [TaskId(t, i) for t in TASK_TYPES for i in range(counts.get(t, 0))]
