"""A Ray run's plan: the tasks Ray will place, and the ``RayUnit`` that says how (pure, stdlib).

Built once, like every plan (``launcher.plan.build.build_plan`` hands a ``ray`` description here).
The tasks are known before the run (chief:0, worker:0.., evaluator:0); their nodes and ports
are not: each task's actor takes a bundle of the run's placement group, binds a port on its
node and reports it. ``Backend.resolve`` then fills in every task's host, port and TF_CONFIG
(``with_addresses``: the same ``launcher.plan.tfconfig`` rule as over SSH). Until then a task's
host is ``ray`` and its paths on the node start with ``NODE_DIR``, which the task runner
replaces with its private dir there.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, ClassVar

from launcher import contract
from launcher.engines.ray.address import address_problem
from launcher.errors import UsageError
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.tfconfig import tf_config_json
from launcher.tasks import TaskId, task_ids

if TYPE_CHECKING:
    from launcher.describe.hosts import RemoteOptions
    from launcher.engines.ray.settings import RayClusterSpec
    from launcher.plan.run_options import SupervisorConfig

RAY_HOST = "ray"  # a task's host until its actor has reported its node
NODE_DIR = "{tfl-node}"  # the task's private dir on its node, as the task runner makes it
UNIT_KIND = "ray"
NAMESPACE = "tfl"  # the Ray namespace of tfl's placement groups and actors


@dataclass(frozen=True)
class RayUnit:
    """The Ray part of a plan: where the cluster is, the placement group's shape, what ships."""

    address: str
    placement: str
    bundle: dict[str, float] = field(hash=False)
    ready_timeout: float
    working_dir: str  # the job script's directory: Ray's runtime_env working_dir
    nodes: dict[str, str] = field(default_factory=dict, hash=False)  # task -> Ray node id, once resolved
    kind: ClassVar[str] = UNIT_KIND  # its description kind (launcher.describe.kinds) and its backend's name

    def group_name(self, run_id: str) -> str:
        return f"tfl-{run_id}"

    def actor_name(self, run_id: str, task: TaskId) -> str:
        return f"tfl-{run_id}-{task.slug}"

    def moved_to(self, address: str) -> RayUnit:
        """The unit on the run's cluster at a new address (``tfl resume --address``: a cluster started again
        on another host or port); a malformed address is one line."""
        problem = address_problem(address)
        if problem:
            raise UsageError(f"--address: {problem}")
        return dataclasses.replace(self, address=address)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RayUnit:
        return cls(address=data["address"], placement=data["placement"], bundle=dict(data["bundle"]),
                   ready_timeout=float(data["ready_timeout"]), working_dir=data["working_dir"],
                   nodes=dict(data.get("nodes", {})))


@dataclass(frozen=True)
class NodeAddress:
    """What a task's actor reported: its node and the port it holds there."""

    node_id: str
    host: str
    port: int


def build_ray_plan(spec: RayClusterSpec, job: str, job_args: tuple[str, ...], *, run_id: str, run_dir: str, python: str,
                   cwd: str, remote: RemoteOptions, virtual_devices: int | None, config: SupervisorConfig) -> LaunchPlan:
    """What would run: every task and the Ray unit (pure). ``python``, ``cwd`` and ``remote`` are
    this machine's and SSH's: the nodes run the job with their own Python from the shipped job dir;
    ``config`` is the supervisor's to apply (nothing of it goes in the plan)."""
    settings = spec.ray
    counts = {contract.CHIEF: int(settings.chief), contract.WORKER: settings.workers, contract.EVALUATOR: int(settings.evaluator)}
    tasks = task_ids(counts)
    if len(tasks) > 1 and spec.storage is None and not _model_dir_given(job_args):
        raise UsageError("a Ray run of several tasks needs storage every node sees (a restarted task or the evaluator reads "
                         "the chief's checkpoints, on whatever node it lands); add \"storage\": {\"path\": \"/mnt/shared/tfl\"} "
                         "to the description, or pass the job a shared --model-dir")
    env = {**spec.env, **contract.run_variables(run_id, NODE_DIR, virtual_devices,
                                                         evaluator=settings.evaluator)}
    if spec.storage is not None:
        env[contract.MODEL_DIR] = contract.shared_model_dir(spec.storage.path, run_id)
    launches = tuple(_task(task, job, job_args, env, run_dir) for task in tasks)
    unit = RayUnit(address=settings.address, placement=settings.placement, bundle=settings.bundle,
                   ready_timeout=settings.ready_timeout, working_dir=str(PurePath(job).parent))
    return LaunchPlan(run_id=run_id, run_dir=run_dir, job=job, job_args=job_args, tasks=launches, unit=unit)


def _model_dir_given(job_args: tuple[str, ...]) -> bool:
    return any(a == "--model-dir" or a.startswith("--model-dir=") for a in job_args)


def _task(task: TaskId, job: str, job_args: tuple[str, ...], env: dict[str, str], run_dir: str) -> TaskLaunch:
    # argv[0] "python": the node's own (the actor's interpreter); the job runs from the shipped working_dir.
    return TaskLaunch(task=task, host=RAY_HOST, port=0, argv=("python", "-u", PurePath(job).name, *job_args),
                      env={**env, **contract.task_variables(task.type, task.index, NODE_DIR)}, cwd=None,
                      log_path=f"{run_dir}/{contract.LOGS_SUBDIR}/{task.slug}.log",
                      progress_path=f"{run_dir}/{contract.PROGRESS_SUBDIR}/{task.slug}.json")


@dataclass(frozen=True)
class Addresses:
    """A topology as ``launcher.plan.tfconfig`` reads it, from the addresses the actors reported."""

    chief: list[str]
    worker: list[str]
    evaluator: list[str]

    @classmethod
    def of(cls, tasks: tuple[TaskLaunch, ...]) -> Addresses:
        by_type: dict[str, list[str]] = {t: [] for t in contract.TASK_TYPES}
        for t in tasks:
            by_type[t.task.type].append(f"[{t.host}]:{t.port}" if ":" in t.host else f"{t.host}:{t.port}")
        return cls(**by_type)


def with_addresses(plan: LaunchPlan, reported: dict[TaskId, NodeAddress]) -> LaunchPlan:
    """The plan with the tasks in ``reported`` on their node and port, and every task's
    TF_CONFIG built from the result (the same rule as over SSH: ``launcher.plan.tfconfig``)."""
    unit = plan.unit
    assert isinstance(unit, RayUnit)
    placed = tuple(dataclasses.replace(t, host=reported[t.task].host, port=reported[t.task].port)
                   if t.task in reported else t for t in plan.tasks)
    topology = Addresses.of(placed)
    tasks = tuple(dataclasses.replace(t, env={**t.env, contract.TF_CONFIG: tf_config_json(topology, t.task)})  # type: ignore[arg-type]
                  for t in placed)
    nodes = {**unit.nodes, **{str(task): a.node_id for task, a in reported.items()}}
    return dataclasses.replace(plan, tasks=tasks, unit=dataclasses.replace(unit, nodes=nodes))


def describe_ray(spec: RayClusterSpec, runs_dir: str, python: str, cwd: str) -> tuple[list[str], int]:
    """``tfl validate``: the plan of a run of a placeholder JOB (its tasks, the placement group)."""
    from launcher.describe.hosts import RemoteOptions
    from launcher.plan.run_options import SupervisorConfig

    plan = build_ray_plan(spec, f"{cwd}/JOB", ("--model-dir", "DIR") if spec.storage is None else (), run_id="RUN",
                          run_dir=f"{runs_dir}/RUN", python=python, cwd=cwd, remote=RemoteOptions(), virtual_devices=None,
                          config=SupervisorConfig())
    return render_ray_plan(plan).splitlines(), len(plan.tasks)


def render_ray_plan(plan: LaunchPlan) -> str:
    """``--dry-run`` (and ``tfl validate``): the cluster, the placement group, each task."""
    unit = plan.unit
    assert isinstance(unit, RayUnit)
    bundle = json.dumps(unit.bundle, separators=(", ", ": "))
    lines = [f"run {plan.run_id}", f"  dir: {plan.run_dir}", f"  job: {shlex.join([plan.job, *plan.job_args])}",
             f"  ray: {unit.address}; placement group {unit.group_name(plan.run_id)}: {len(plan.tasks)} bundles of {bundle}, "
             f"{unit.placement} (refused if not ready within {unit.ready_timeout:g} s)",
             f"  ships: {unit.working_dir} (runtime_env working_dir) and the job kit (py_modules)", "", "tasks:"]
    for t in plan.tasks:
        where = f"{t.host}:{t.port} (node {unit.nodes[t.name][:12]})" if t.name in unit.nodes else "a bundle of its own"
        lines += [f"  {t.name}  on {where}; actor {unit.actor_name(plan.run_id, t.task)}; log {t.log_path}",
                  f"    command: {shlex.join(t.argv)}"]
        lines += [f"    {key}={value}" for key, value in sorted(t.env.items()) if key != contract.TF_CONFIG]
    lines.append("  (each task's TF_CONFIG is built once every actor has reported the port it holds on its node)")
    return "\n".join(lines)
