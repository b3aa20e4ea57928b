"""Status, stop and clean-up of a recorded Ray run, from any terminal, from the record alone.

The record's plan holds the Ray unit: the cluster's address, the placement group's name and
each task's actor name (in tfl's namespace). ``tfl status`` asks each actor; ``tfl stop``
has each actor stop its task (SIGTERM, the grace, SIGKILL: the runner's ``close``), kills
the actors and removes the placement group; both are idempotent (an actor or group already
gone is fine), and neither connects for a run its record says has ended.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from launcher.engines.base import Cleanup, Stopped, TaskLive
from launcher.engines.ray.connect import connect, disconnect
from launcher.engines.ray.plan import NAMESPACE, RayUnit
from launcher.errors import LaunchError
from launcher.records.states import TaskState
from launcher.records.store import RunRecord
from launcher.tasks import TaskId

CALL_TIMEOUT = 30.0
# Why a stop that cannot reach the cluster has nothing left to do there.
GONE = "nothing of the run runs there: its actors were its launcher's, and Ray ends an actor with its owner"


def _unit(record: RunRecord) -> RayUnit:
    data = record.plan.get("unit")
    if not isinstance(data, dict) or data.get("kind") != "ray":
        raise LaunchError(f"run {record.run_id}: its record has no Ray unit; it was not run by this tfl's ray backend")
    return RayUnit.from_dict(data)


def _actor(ray: ModuleType, unit: RayUnit, run_id: str, task: str) -> Any:
    try:
        return ray.get_actor(unit.actor_name(run_id, TaskId.parse(task)), namespace=NAMESPACE)
    except ValueError:  # no such actor (any more)
        return None


def inspect(record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
    if record.state.is_terminal:
        return {t.task: TaskLive(alive=False) for t in record.tasks}
    if not ask:  # the list view: what the record says, without a connection per run
        return {t.task: TaskLive(alive=t.state == TaskState.RUNNING) for t in record.tasks}
    unit = _unit(record)
    try:
        ray = connect(unit.address)
    except LaunchError:
        return {t.task: TaskLive(alive=False, state="unreachable" if t.state == TaskState.RUNNING else None)
                for t in record.tasks}
    try:
        live = {}
        for task in record.tasks:
            actor = _actor(ray, unit, record.run_id, task.task)
            info = _call(ray, actor, "info")
            running = task.state == TaskState.RUNNING
            if info is None:
                live[task.task] = TaskLive(alive=False, state="gone" if running else None)
            else:
                live[task.task] = TaskLive(alive=bool(info["alive"]), host=info["host"],
                                           state="gone" if running and not info["alive"] else None)
        return live
    finally:
        disconnect()


def _call(ray: ModuleType, actor: Any, method: str, *args: Any) -> Any:
    if actor is None:
        return None
    try:
        return ray.get(getattr(actor, method).remote(*args), timeout=CALL_TIMEOUT)
    except ray.exceptions.RayError:
        return None


def stop(record: RunRecord, grace: float) -> Stopped:
    """Stop every task's actor and remove the run's placement group; how many actors were found.
    A cluster that cannot be reached is named, not raised: the actors are the launcher's (not
    detached), and Ray ends an actor with its owner, so the launcher's end ended them there."""
    if record.state.is_terminal and not any(t.state == TaskState.RUNNING for t in record.tasks):
        return Stopped()
    unit = _unit(record)
    try:  # nothing to start or fix for a stop: what was there ended with the launcher
        ray = connect(unit.address, fix=GONE)
    except LaunchError as exc:
        return Stopped(0, [f"the Ray cluster at {unit.address}: {exc}"])
    try:
        actors = [a for t in record.tasks if (a := _actor(ray, unit, record.run_id, t.task)) is not None]
        closing = [a.close.remote(grace) for a in actors]
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=grace + CALL_TIMEOUT)
        for actor in actors:
            try:
                ray.kill(actor)
            except ray.exceptions.RayError:
                pass
        _remove_group(ray, unit, record.run_id)
        return Stopped(len(actors))
    finally:
        disconnect()


def _remove_group(ray: ModuleType, unit: RayUnit, run_id: str) -> None:
    from ray.util import get_placement_group
    from ray.util.placement_group import remove_placement_group

    try:
        pg = get_placement_group(unit.group_name(run_id))
    except ValueError:
        return  # removed already
    remove_placement_group(pg)


def clean(record: RunRecord) -> Cleanup:
    """Each task's dir on its node went with its actor (the runner's ``close``); nothing else
    of the run lies on the nodes but what the job wrote to the shared storage (kept)."""
    return Cleanup()
