"""GPU placement: which of its host's GPUs each task sees. Pure: no I/O, no TensorFlow.

The rules, one host at a time (hosts never share GPUs):

- A host with no ``hosts.<h>.gpus`` and no ``devices`` entry for any of its tasks is left
  alone: its tasks see whatever the machine has. Nothing is hidden on a GPU-less host.
- ``devices.<task>.gpus`` as a list means exactly those indices; as a count, the first
  unused indices of ``hosts.<h>.gpus`` (lists are placed first, then counts, in task order).
- Training tasks without an entry split the GPUs still unused evenly; a remainder stays
  idle. An evaluator without an entry gets none: it would otherwise allocate memory on
  every training GPU of its host.
- Every training task must end up with as many GPUs as the others (checked across hosts):
  MultiWorkerMirroredStrategy assumes every worker has as many replicas as itself.
- A GPU given to two tasks is an error unless ``hosts.<h>.share_gpus``. Then every task on
  a shared GPU gets its memory limit or, without one, memory growth, so that no task takes
  the whole GPU up front (TensorFlow's default). When two *training* tasks share a GPU,
  every training task uses TensorFlow's ring collectives: NCCL refuses two ranks on one
  GPU, and all workers must agree on the implementation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from launcher import contract
from launcher.tasks import TaskId

VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
MEMORY_LIMIT = contract.GPU_MEMORY_LIMIT_MB  # read by the job kit (launcher.jobkit.devices)
ALLOW_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"  # read by TensorFlow itself
COLLECTIVE = contract.COLLECTIVE  # read by the job kit: "ring" for MultiWorkerMirroredStrategy


class GpuHost(Protocol):
    """A host's GPU settings (``spec.HostSettings`` has these)."""

    @property
    def gpus(self) -> int | list[int] | None: ...
    @property
    def share_gpus(self) -> bool: ...
    @property
    def gpu_memory_limit_mb(self) -> int | None: ...
    @property
    def env(self) -> dict[str, str]: ...


class GpuRequest(Protocol):
    """One task's GPU request (``spec.TaskDevices`` has these)."""

    @property
    def gpus(self) -> int | list[int]: ...
    @property
    def gpu_memory_limit_mb(self) -> int | None: ...


@dataclass(frozen=True)
class GpuInputs:
    """What placement needs from a cluster description, and nothing else."""

    tasks: Sequence[tuple[TaskId, str]]  # (task, its host), in task order
    hosts: Mapping[str, GpuHost]  # per-host settings; absent = defaults
    devices: Mapping[str, GpuRequest]  # "worker:1" -> its request
    env: Mapping[str, str]  # the cluster-wide env

    def host(self, name: str) -> GpuHost | None:
        return self.hosts.get(name)


@dataclass(frozen=True)
class GpuAssignment:
    """The GPUs one task sees; an empty tuple means it runs on CPU only."""

    gpus: tuple[int, ...]
    shared: bool = False
    memory_limit_mb: int | None = None

    def env(self) -> dict[str, str]:
        env = {VISIBLE_DEVICES: ",".join(str(g) for g in self.gpus)}
        if self.gpus and self.memory_limit_mb is not None:
            env[MEMORY_LIMIT] = str(self.memory_limit_mb)
        elif self.gpus and self.shared:
            env[ALLOW_GROWTH] = "true"
        return env


@dataclass(frozen=True)
class Placement:
    """The GPUs of every task on a host with GPU settings (other tasks are absent)."""

    tasks: dict[TaskId, GpuAssignment]
    ring_collectives: bool = False

    def env(self, task: TaskId) -> dict[str, str]:
        """What the task's environment gets: nothing for a task on an unmanaged host."""
        env = self.tasks[task].env() if task in self.tasks else {}
        if self.ring_collectives and task.is_training:
            env[COLLECTIVE] = "ring"
        return env


def place_gpus(spec: GpuInputs) -> Placement:
    """Every task's GPUs. Raises ValueError naming the field and the fix when the
    settings contradict each other."""
    tasks = [t for t, _ in spec.tasks]
    names = {str(t) for t in tasks}
    for key in spec.devices:
        if key not in names:
            raise ValueError(f"devices.{key} names no task of the cluster (its tasks: {', '.join(sorted(names))}); "
                             "use one of those or remove it")
    host_of = dict(spec.tasks)
    result: dict[TaskId, GpuAssignment] = {}
    ring = False
    for host in dict.fromkeys(host_of.values()):
        on_host = [t for t in tasks if host_of[t] == host]
        settings = spec.host(host)
        if (settings is None or settings.gpus is None) and not any(str(t) in spec.devices for t in on_host):
            continue
        _check_env_leaves_gpus_to_tfl(spec, host)
        assigned = _assign_host(spec, host, settings, on_host)
        training_users = Counter(g for t, a in assigned.items() if t.is_training for g in a.gpus)
        ring = ring or any(n > 1 for n in training_users.values())
        result.update(assigned)
    _check_same_count_per_worker(result)
    return Placement(result, ring_collectives=ring)


def _check_same_count_per_worker(assigned: dict[TaskId, GpuAssignment]) -> None:
    # MultiWorkerMirroredStrategy sizes its all-reduce as local replicas x workers, taking
    # this task's count for every worker: different counts hang or fail the collectives.
    counts = {str(t): len(a.gpus) for t, a in assigned.items() if t.is_training}
    if len(set(counts.values())) > 1:
        seen = ", ".join(f"{t}: {n}" for t, n in counts.items())
        raise ValueError(f"devices: training tasks would see different numbers of GPUs ({seen}); "
                         "MultiWorkerMirroredStrategy needs the same number on every worker: give each the same count")


def _assign_host(spec: GpuInputs, host: str, settings: GpuHost | None, tasks: list[TaskId]) -> dict[TaskId, GpuAssignment]:
    available = _host_gpus(settings)
    share = settings is not None and settings.share_gpus
    picked: dict[TaskId, tuple[int, ...]] = {}
    usage: Counter[int] = Counter()
    for task in tasks:  # explicit lists first: they are what the user pinned
        wanted = spec.devices[str(task)].gpus if str(task) in spec.devices else None
        if isinstance(wanted, list):
            outside = [g for g in wanted if available is not None and g not in available]
            if outside:
                raise ValueError(f"devices.{task}.gpus: GPU {outside[0]} is not one of hosts.{host}.gpus "
                                 f"{list(available or ())}; use one of those or add it there")
            picked[task] = tuple(wanted)
            usage.update(wanted)
    for task in tasks:
        wanted = spec.devices[str(task)].gpus if str(task) in spec.devices else None
        if isinstance(wanted, int):
            picked[task] = _take_count(task, wanted, host, available, usage, share)
    automatic = [t for t in tasks if t not in picked and t.is_training]
    picked.update(_split(automatic, host, available, usage, share))
    for task in tasks:
        picked.setdefault(task, ())  # an evaluator without an entry: CPU only
    _check_sharing(picked, host, share)
    users = Counter(g for gpus in picked.values() for g in gpus)
    return {
        task: GpuAssignment(
            gpus=picked[task], shared=any(users[g] > 1 for g in picked[task]),
            memory_limit_mb=_memory_limit(spec, task, settings))
        for task in tasks
    }


def _host_gpus(settings: GpuHost | None) -> tuple[int, ...] | None:
    if settings is None or settings.gpus is None:
        return None
    return tuple(range(settings.gpus)) if isinstance(settings.gpus, int) else tuple(settings.gpus)


def _take_count(task: TaskId, count: int, host: str, available: Sequence[int] | None,
                usage: Counter[int], share: bool) -> tuple[int, ...]:
    if count == 0:
        return ()
    if available is None:
        raise ValueError(f"devices.{task}.gpus: a count needs the host's GPUs in hosts.{host}.gpus "
                         f"(e.g. \"gpus\": 2), or list the indices instead (e.g. [0, 1])")
    if count > len(available):
        raise ValueError(f"devices.{task}.gpus: asks for {count} GPUs but hosts.{host}.gpus has "
                         f"{len(available)}; lower the count or add GPUs")
    unused = [g for g in available if usage[g] == 0]
    if len(unused) < count and not share:
        raise ValueError(f"devices.{task}.gpus: asks for {count} GPUs but only {len(unused)} of hosts.{host}.gpus "
                         f"are left; lower the count, add GPUs, or set hosts.{host}.share_gpus: true")
    chosen = tuple(sorted(_least_used(available, usage, count)))
    usage.update(chosen)
    return chosen


def _split(tasks: list[TaskId], host: str, available: Sequence[int] | None, usage: Counter[int],
           share: bool) -> dict[TaskId, tuple[int, ...]]:
    if not tasks:
        return {}
    if not available:  # "gpus": 0, or GPUs pinned for some tasks but not declared: the others get none
        return {t: () for t in tasks}
    unused = [g for g in available if usage[g] == 0]
    each = len(unused) // len(tasks)
    if each >= 1:
        return {t: tuple(unused[i * each:(i + 1) * each]) for i, t in enumerate(tasks)}
    if not share:
        listed = ", ".join(str(t) for t in tasks)
        raise ValueError(f"hosts.{host}.gpus: {len(unused)} unused GPU(s) for {len(tasks)} training tasks ({listed}); "
                         f"add GPUs, list GPUs per task in devices, or set hosts.{host}.share_gpus: true")
    result = {}
    for task in tasks:  # fewer GPUs than tasks, sharing allowed: take turns
        result[task] = _least_used(available, usage, 1)
        usage.update(result[task])
    return result


def _least_used(available: Sequence[int], usage: Counter[int], count: int) -> tuple[int, ...]:
    return tuple(sorted(available, key=lambda g: (usage[g], available.index(g)))[:count])


def _check_sharing(picked: dict[TaskId, tuple[int, ...]], host: str, share: bool) -> None:
    if share:
        return
    owners: dict[int, list[TaskId]] = {}
    for task, gpus in picked.items():
        for gpu in gpus:
            owners.setdefault(gpu, []).append(task)
    for gpu, tasks in sorted(owners.items()):
        if len(tasks) > 1:
            raise ValueError(f"devices: GPU {gpu} on {host} is given to {' and '.join(str(t) for t in tasks)}; "
                             f"give each task its own GPU, or set hosts.{host}.share_gpus: true "
                             "(each task then gets memory growth, or gpu_memory_limit_mb)")


def _memory_limit(spec: GpuInputs, task: TaskId, settings: GpuHost | None) -> int | None:
    entry = spec.devices.get(str(task))
    if entry is not None and entry.gpu_memory_limit_mb is not None:
        return entry.gpu_memory_limit_mb
    return settings.gpu_memory_limit_mb if settings is not None else None


def _check_env_leaves_gpus_to_tfl(spec: GpuInputs, host: str) -> None:
    settings = spec.host(host)
    for where, env in ((f"hosts.{host}.env", settings.env if settings else {}), ("env", spec.env)):
        if VISIBLE_DEVICES in env:
            raise ValueError(f"{where} sets {VISIBLE_DEVICES}, but tfl assigns the GPUs of {host} "
                             f"(hosts.{host}.gpus / devices); remove it from {where}")
