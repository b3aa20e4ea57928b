"""Backends run a plan's tasks somewhere; they never decide policy (see ``base``).

``BACKENDS`` maps a backend's name (recorded with each run) to its class, imported lazily
so that `tfl status` of a local run never pays for fabric. ``name_for`` is the one place
that decides which backend serves a plan.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Callable

from launcher.engines.base import Backend, Cleanup, GroupBackend, TaskLive, TaskProcess
from launcher.errors import UsageError

if TYPE_CHECKING:
    from launcher.plan.launch_plan import LaunchPlan

__all__ = ["BACKENDS", "Backend", "Cleanup", "GroupBackend", "TaskLive", "TaskProcess", "get", "name_for", "name_for_plan"]

# name -> "module:Class"
BACKENDS: dict[str, str] = {
    "local": "launcher.engines.local:LocalBackend",
    "ssh": "launcher.engines.ssh.backend:SSHBackend",
    "slurm": "launcher.engines.slurm.backend:SlurmBackend",
    "ray": "launcher.engines.ray.backend:RayBackend",
}


def name_for(hosts: Iterable[tuple[str, bool]]) -> str:
    """The backend for a run's hosts, given as (host, reached over SSH): one run, one backend.
    Hosts with an SSH target run over SSH, the others as local processes."""
    hosts = list(hosts)
    remote = {is_remote for _, is_remote in hosts}
    if len(remote) > 1:
        local = sorted({h for h, is_remote in hosts if not is_remote})
        raise UsageError(f"hosts {', '.join(local)} run locally while others are reached over SSH; one run uses one "
                         f"backend: give hosts.<host>.ssh settings to {', '.join(local)} too, or run every task locally")
    return "ssh" if remote == {True} else "local"


def name_for_plan(plan: LaunchPlan) -> str:
    """A plan with a unit of its own runs on that unit's engine (a batch script: Slurm); any
    other by its hosts (``name_for``)."""
    if plan.unit is not None:
        return plan.unit.kind
    return name_for((t.host, t.ssh is not None) for t in plan.tasks)


def get(name: str, notify: Callable[[], None] = lambda: None) -> Backend:
    """A backend by the name a run recorded; ``notify`` is called whenever a task may have exited."""
    if name not in BACKENDS:
        raise UsageError(f"this run was recorded by a backend this tfl does not have ('{name}'); "
                         f"use the tfl that launched it (known: {', '.join(sorted(BACKENDS))})")
    module, _, cls = BACKENDS[name].partition(":")
    factory = getattr(importlib.import_module(module), cls)
    backend: Backend = factory(notify=notify)
    return backend
