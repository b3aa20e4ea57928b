"""Who am I in the cluster? Parsed from TF_CONFIG and the launcher's TFL_* variables.

Pure (no TensorFlow import) so the launcher's tests and the kit's fast tests can use it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher import contract
from launcher.contract import TASK_TYPES as KNOWN_TASK_TYPES
from launcher.contract import TRAINING_TYPES as TRAINING_TASK_TYPES

COLLECTIVES = ("auto", "ring", "nccl")  # tf.distribute.experimental.CommunicationImplementation


class JobKitError(Exception):
    """A job's environment or inputs are unusable; the message says how to fix them."""


@dataclass(frozen=True)
class TaskContext:
    """This process's role, plus where the launcher wants progress reported."""

    task_type: str
    task_index: int
    cluster: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    label: str = "chief:0"
    run_id: str | None = None
    attempt: int = 0
    run_dir: Path | None = None
    model_dir: Path | None = None  # the run's model dir in the cluster's shared storage (TFL_MODEL_DIR)
    progress_file: Path | None = None
    progress_log: Path | None = None
    # Device settings from the launcher (see launcher/placement.py and `--virtual-devices`).
    virtual_devices: int | None = None
    gpu_memory_limit_mb: int | None = None
    collective: str | None = None  # "ring" when tasks share a GPU (NCCL refuses that)
    evaluator_in_run: bool = False  # TFL_EVALUATOR: the training tasks' TF_CONFIG leaves the evaluator out

    @property
    def is_evaluator(self) -> bool:
        return self.task_type == "evaluator"

    @property
    def is_chief(self) -> bool:
        # Same rule as TensorFlow's: worker 0 is chief only when no chief is declared.
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and not self.cluster.get("chief")

    @property
    def has_evaluator(self) -> bool:
        return self.evaluator_in_run or bool(self.cluster.get(contract.EVALUATOR))

    @property
    def num_training_tasks(self) -> int:
        if not self.cluster:
            return 1
        return sum(len(self.cluster.get(kind, ())) for kind in TRAINING_TASK_TYPES)

    @property
    def is_multi_worker(self) -> bool:
        return not self.is_evaluator and self.num_training_tasks > 1


def parse_tf_config(raw: str | None) -> tuple[str, int, dict[str, tuple[str, ...]]]:
    """Return (task type, index, cluster); no TF_CONFIG means a lone chief."""
    if raw is None or not raw.strip():
        return "chief", 0, {}
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as err:
        raise JobKitError(f"TF_CONFIG is not valid JSON ({err}); expected "
                          '{"cluster": {...}, "task": {"type": ..., "index": ...}}') from err
    if not isinstance(config, dict):
        raise JobKitError("TF_CONFIG must be a JSON object with 'cluster' and 'task' keys")
    cluster = _parse_cluster(config.get("cluster"))
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise JobKitError('TF_CONFIG.task is missing; expected {"type": "worker", "index": 0}')
    task_type, index = task["type"], task.get("index", 0)
    if task_type not in KNOWN_TASK_TYPES:
        raise JobKitError(f"TF_CONFIG.task.type is {task_type!r}; expected one of "
                          f"{', '.join(KNOWN_TASK_TYPES)} (parameter servers are not supported)")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise JobKitError(f"TF_CONFIG.task.index is {index!r}; expected an integer >= 0")
    if index >= len(cluster.get(task_type, ())):
        raise JobKitError(f"TF_CONFIG.task is {task_type}:{index} but cluster.{task_type} has "
                          f"{len(cluster.get(task_type, ()))} entries; add the address or fix the index")
    return task_type, index, cluster


def _parse_cluster(cluster: object) -> dict[str, tuple[str, ...]]:
    if not isinstance(cluster, dict):
        raise JobKitError("TF_CONFIG.cluster is missing; expected "
                          '{"chief": ["host:port"], "worker": [...]}')
    parsed: dict[str, tuple[str, ...]] = {}
    for kind, addresses in cluster.items():
        if kind not in KNOWN_TASK_TYPES:
            raise JobKitError(f"TF_CONFIG.cluster.{kind} is not supported; use only "
                              f"{', '.join(KNOWN_TASK_TYPES)}")
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise JobKitError(f"TF_CONFIG.cluster.{kind} must be a list of 'host:port' strings")
        parsed[kind] = tuple(addresses)
    if len(parsed.get("chief", ())) > 1:
        raise JobKitError("TF_CONFIG.cluster.chief has more than one entry; at most one chief "
                          "is allowed (move the others to cluster.worker)")
    if not any(parsed.get(kind) for kind in TRAINING_TASK_TYPES):
        raise JobKitError("TF_CONFIG.cluster has no chief or worker; at least one training task is needed")
    return parsed


def task_context(env: Mapping[str, str]) -> TaskContext:
    """Build the context from an environment mapping (pass os.environ in a job)."""
    task_type, index, cluster = parse_tf_config(env.get(contract.TF_CONFIG))
    attempt_raw = env.get(contract.ATTEMPT, "0") or "0"
    if not attempt_raw.isdigit():
        raise JobKitError(f"{contract.ATTEMPT} is {attempt_raw!r}; expected a non-negative integer")
    return TaskContext(
        task_type=task_type,
        task_index=index,
        cluster=cluster,
        label=env.get(contract.TASK) or f"{task_type}:{index}",
        run_id=env.get(contract.RUN_ID) or None,
        attempt=int(attempt_raw),
        run_dir=_optional_path(env.get(contract.RUN_DIR)),
        model_dir=_optional_path(env.get(contract.MODEL_DIR)),
        progress_file=_optional_path(env.get(contract.PROGRESS_FILE)),
        progress_log=_optional_path(env.get(contract.PROGRESS_LOG)),
        virtual_devices=_optional_count(env, contract.VIRTUAL_DEVICES, "the number of logical devices, e.g. 4"),
        gpu_memory_limit_mb=_optional_count(env, contract.GPU_MEMORY_LIMIT_MB, "a GPU memory limit in MB, e.g. 4096"),
        collective=_collective(env.get(contract.COLLECTIVE, "").strip()),
        evaluator_in_run=env.get(contract.EVALUATOR_IN_RUN) == "1",
    )


def _optional_path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _collective(raw: str) -> str | None:
    if raw and raw not in COLLECTIVES:
        raise JobKitError(f"{contract.COLLECTIVE} is {raw!r}; expected one of {', '.join(COLLECTIVES)}, or leave it unset")
    return raw or None


def _optional_count(env: Mapping[str, str], name: str, expected: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise JobKitError(f"{name} is {raw!r}; expected a positive integer ({expected}), or leave it unset")
    return int(raw)
