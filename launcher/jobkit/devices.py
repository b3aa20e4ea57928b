"""Which local devices a task trains on, and which strategy that calls for. Pure: no TensorFlow.

The TensorFlow side (splitting physical devices into logical ones) is in `strategy.py`;
the decisions are here so that they are tested without starting TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from launcher.jobkit.context import JobKitError, TaskContext

# TensorFlow wants a memory limit for each logical GPU when it splits one; this is the
# figure its own guide uses, and small enough for 4 of them on any current GPU.
DEFAULT_VIRTUAL_GPU_MEMORY_MB = 1024
StrategyName = Literal["default", "MirroredStrategy", "MultiWorkerMirroredStrategy"]


@dataclass(frozen=True)
class LocalDevices:
    """The logical devices of one kind that this task's replicas may run on."""

    kind: Literal["GPU", "CPU"]
    count: int
    physical: int = 1

    @property
    def names(self) -> tuple[str, ...]:
        # TensorFlow numbers logical devices of a kind from 0, across all physical ones.
        return tuple(f"/device:{self.kind}:{i}" for i in range(self.count))

    def describe(self) -> str:
        """`1xCPU`, `2xGPU`, `4xCPU(logical,on 1)`: what the strategy line shows."""
        split = f"(logical,on {self.physical})" if self.count != self.physical else ""
        return f"{self.count}x{self.kind}{split}"


@dataclass(frozen=True)
class StrategyChoice:
    name: StrategyName
    note: str | None = None  # printed when the choice leaves devices unused
    collective: str = "auto"  # MultiWorkerMirroredStrategy's all-reduce implementation


def gpu_split(virtual_devices: int | None, memory_limit_mb: int | None) -> list[int] | None:
    """Memory limits (MB) of the logical GPUs made from each physical GPU; None: leave it whole."""
    if virtual_devices is None or virtual_devices == 1:
        return None if memory_limit_mb is None else [memory_limit_mb]
    if memory_limit_mb is None:
        return [DEFAULT_VIRTUAL_GPU_MEMORY_MB] * virtual_devices
    if memory_limit_mb < virtual_devices:
        raise JobKitError(f"TFL_GPU_MEMORY_LIMIT_MB={memory_limit_mb} cannot be split into {virtual_devices} "
                          "virtual GPUs; raise the limit or ask for fewer virtual devices")
    return [memory_limit_mb // virtual_devices] * virtual_devices


def choose_strategy(context: TaskContext, local: LocalDevices) -> StrategyChoice:
    """MultiWorkerMirroredStrategy for several training tasks, MirroredStrategy for one task
    with several local devices, otherwise the default strategy (the evaluator always)."""
    if context.is_evaluator:
        # It trains nothing; in a strategy it would wait for the workers' collectives.
        return StrategyChoice("default")
    if context.is_multi_worker:
        note = None
        if local.kind == "CPU" and local.count > 1:
            # Seen in TF 2.21's CollectiveAllReduceExtended._initialize_local_devices:
            # without GPUs it takes exactly one local device, CPU:0.
            note = (f"MultiWorkerMirroredStrategy runs one replica per worker on CPU; {local.count - 1} of this "
                    f"task's {local.count} logical CPUs stay idle (only GPUs give a worker several replicas)")
        return StrategyChoice("MultiWorkerMirroredStrategy", note, _collective(context, local))
    if local.count > 1:
        return StrategyChoice("MirroredStrategy")
    return StrategyChoice("default")


def _collective(context: TaskContext, local: LocalDevices) -> str:
    """The launcher's choice (ring when tasks share a GPU), else ring for virtual GPUs:
    NCCL takes one rank per physical GPU and cannot reduce over logical ones."""
    if context.collective is not None:
        return context.collective
    return "ring" if local.kind == "GPU" and local.count != local.physical else "auto"
