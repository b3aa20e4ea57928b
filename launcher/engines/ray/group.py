"""A run's placement group (one bundle per task) and its actors (one per bundle).

``pg.ready()`` is waited for with the unit's timeout: a request the cluster cannot hold (more
tasks than nodes under STRICT_SPREAD, a resource no node has) is one clear error naming the
shortfall, never a hang. Actors have ``max_restarts=0``: tfl's supervisor owns the restart
policy; a dead actor is replaced by ``ensure_actors`` when the group starts again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from launcher.engines.ray.connect import cluster_answers
from launcher.engines.ray.plan import NAMESPACE, NodeAddress, RayUnit
from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan
from launcher.tasks import TaskId

CALL_TIMEOUT = 60.0  # seconds for one call to an actor (a round trip, or an actor's start on its node)


def shortfall(ray: ModuleType, unit: RayUnit, tasks: int) -> str:
    """Why the cluster as it is now cannot hold ``tasks`` bundles, or '' when it seems it can."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    fit = [n for n in nodes if all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in unit.bundle.items())]
    missing = [k for k in unit.bundle if not any(n.get("Resources", {}).get(k, 0.0) > 0 for n in nodes)]
    if missing:
        return f"no node of the cluster has any {missing[0]} (fix ray.resources_per_task)"
    if not fit:
        return f"no node has {unit.bundle} free in total (lower ray.resources_per_task)"
    if unit.placement == "STRICT_SPREAD" and len(fit) < tasks:
        return (f"STRICT_SPREAD puts each of the {tasks} tasks on its own node and only {len(fit)} of the cluster's "
                f"{len(nodes)} nodes can hold a task's bundle (add nodes, use fewer tasks, or \"placement\": \"SPREAD\")")
    return ""


@dataclass
class RayGroup:
    """The live placement group and actors of one run, in this (the launcher's) process."""

    ray: ModuleType
    plan: LaunchPlan
    pg: Any = None
    actors: dict[TaskId, Any] = field(default_factory=dict)

    @property
    def unit(self) -> RayUnit:
        assert isinstance(self.plan.unit, RayUnit)
        return self.plan.unit

    def create(self) -> None:
        """The placement group, ready; else a one-line LaunchError (and nothing left behind)."""
        from ray.util.placement_group import placement_group, remove_placement_group

        unit, tasks = self.unit, len(self.plan.tasks)
        self.pg = placement_group([dict(unit.bundle) for _ in range(tasks)], strategy=unit.placement,
                                  name=unit.group_name(self.plan.run_id))
        try:
            self.ray.get(self.pg.ready(), timeout=unit.ready_timeout)
        except self.ray.exceptions.GetTimeoutError:
            remove_placement_group(self.pg)
            self.pg = None
            why = shortfall(self.ray, unit, tasks) or "the cluster is busy or still scaling up (raise ray.ready_timeout)"
            raise LaunchError(f"ray: the placement group of {tasks} bundles of {unit.bundle} ({unit.placement}) was not "
                              f"ready within {unit.ready_timeout:g} s: {why}") from None

    def ensure_actors(self, tasks: list[TaskId]) -> None:
        """An alive actor on each task's bundle: the ones that died (their node with them) are
        made again, once the placement group has its bundles back (Ray reschedules them)."""
        dead = [t for t in tasks if t not in self.actors or not self._responds(self.actors[t])]
        if not dead:
            return
        unit = self.unit
        try:
            self._wait_placed(time.monotonic() + unit.ready_timeout)
        except self.ray.exceptions.GetTimeoutError:
            raise LaunchError(f"ray: {', '.join(map(str, dead))} lost their bundles and Ray could not place them again within "
                              f"{unit.ready_timeout:g} s: {shortfall(self.ray, unit, len(self.plan.tasks)) or 'no node free'}") from None
        for task in dead:
            old = self.actors.pop(task, None)
            if old is not None:
                try:
                    self.ray.kill(old)  # an unreachable one too: its name is free for the new one once Ray has it dead
                except self.ray.exceptions.RayError:
                    pass
            self.actors[task] = self._named_actor(task, time.monotonic() + unit.ready_timeout)

    def _wait_placed(self, deadline: float) -> None:
        """The group's bundles all placed again. ``pg.ready()`` is a task on the group: one that
        lands on a lost node's bundle just before Ray declares the node dead fails; ask again."""
        while True:
            try:
                self.ray.get(self.pg.ready(), timeout=max(1.0, deadline - time.monotonic()))
                return
            except self.ray.exceptions.GetTimeoutError:
                raise
            except self.ray.exceptions.RayError:
                if time.monotonic() > deadline:
                    raise self.ray.exceptions.GetTimeoutError() from None
                time.sleep(1.0)

    def _named_actor(self, task: TaskId, deadline: float) -> Any:
        """The task's new actor, under its name, once Ray has let go of the dead one's."""
        while True:
            try:
                return self._actor(task)
            except self.ray.exceptions.ActorAlreadyExistsError:
                if time.monotonic() > deadline:
                    raise LaunchError(f"ray: {task}'s dead actor still holds its name after {self.unit.ready_timeout:g} s "
                                      "(raise ray.ready_timeout)") from None
                time.sleep(0.5)

    def _responds(self, actor: Any) -> bool:
        try:
            self.ray.get(actor.alive.remote(), timeout=CALL_TIMEOUT)
            return True
        except self.ray.exceptions.RayError:
            return False

    def _actor(self, task: TaskId) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from launcher.engines.ray.node.runner import TaskRunner

        unit, index = self.unit, [t.task for t in self.plan.tasks].index(task)
        bundle = dict(unit.bundle)
        options = {"num_cpus": bundle.pop("CPU", 0.0), "num_gpus": bundle.pop("GPU", 0.0), "resources": bundle,
                   "max_restarts": 0, "max_task_retries": 0, "name": unit.actor_name(self.plan.run_id, task),
                   "namespace": NAMESPACE,
                   "scheduling_strategy": PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=index)}
        return self.ray.remote(TaskRunner).options(**options).remote(self.plan.run_id, task.slug)

    def reserve(self, tasks: list[TaskId]) -> dict[TaskId, NodeAddress]:
        """Each task's actor binds a port on its node and holds it: node id, address, port."""
        refs = {t: self.actors[t].reserve.remote() for t in tasks}
        try:
            got = {t: self.ray.get(ref, timeout=CALL_TIMEOUT + self.unit.ready_timeout) for t, ref in refs.items()}
        except self.ray.exceptions.RayError as exc:
            raise LaunchError(f"ray: a task's actor could not start on its node: {_first_line(exc)}") from None
        return {t: NodeAddress(node_id=a["node_id"], host=a["host"], port=int(a["port"])) for t, a in got.items()}

    def remove(self) -> None:
        """Stop every actor's task (the runner's ``close``), kill the actors, remove the group. Idempotent."""
        from ray.util.placement_group import remove_placement_group

        closing = [a.close.remote() for a in self.actors.values()]
        try:
            self.ray.wait(closing, num_returns=len(closing), timeout=CALL_TIMEOUT)
        except self.ray.exceptions.RayError:
            pass
        for actor in self.actors.values():
            try:
                self.ray.kill(actor)
            except self.ray.exceptions.RayError:
                pass
        self.actors.clear()
        if self.pg is not None:
            if cluster_answers(self.ray, self.unit.address):  # else the group went with the cluster
                remove_placement_group(self.pg)
            self.pg = None


def _first_line(exc: BaseException) -> str:
    """The first line of a Ray error, and its last (the cause, under a creation task's traceback)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0] if len(lines) == 1 else f"{lines[0][:300]} ... {lines[-1][:300]}"
