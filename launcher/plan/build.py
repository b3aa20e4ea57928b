"""Plan, then execute: ``build_plan`` turns a description into a ``LaunchPlan`` by its kind's planner
(``launcher.describe.kinds``), pure: given the spec, the job and the run's identity it returns what would run
where. ``render_plan`` is ``tfl launch --dry-run``'s text, ``describe`` is ``tfl validate``'s."""

from __future__ import annotations

import json
import shlex
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from launcher import contract
from launcher.describe import kinds
from launcher.describe.hosts import HOST_CACHE, RemoteOptions
from launcher.plan.launch_plan import LaunchPlan

if TYPE_CHECKING:
    from launcher.plan.run_options import SupervisorConfig


def build_plan(
    spec: Any, job: str, job_args: tuple[str, ...], *, run_id: str, run_dir: str, python: str,
    cwd: str, remote: RemoteOptions = RemoteOptions(), virtual_devices: int | None = None,
    config: SupervisorConfig | None = None,
) -> LaunchPlan:
    """What runs where, by the planner of the description's kind (``launcher.describe.kinds``).

    ``job`` is an absolute path; ``python``/``cwd`` are the local defaults; ``remote`` how code
    reaches other hosts; ``virtual_devices`` (``--virtual-devices N``): the job kit splits each
    task's device into N; ``config``: the run's policy, for planners that write it down (a batch
    script that restarts its own group).
    """
    from launcher.plan.run_options import SupervisorConfig

    plan: LaunchPlan = kinds.planner(spec)(
        spec, job, job_args, run_id=run_id, run_dir=run_dir, python=python, cwd=cwd, remote=remote,
        virtual_devices=virtual_devices, config=config or SupervisorConfig())
    return plan


def render_plan(plan: LaunchPlan) -> str:
    """Human-readable plan for ``--dry-run``: every task's host, command, env and log (an engine
    with a unit of its own renders its plans itself)."""
    render = kinds.render_unit(plan.unit) if plan.unit is not None else None
    if render is not None:
        text: str = render(plan)
        return text
    lines = [f"run {plan.run_id}", f"  dir: {plan.run_dir}", f"  job: {plan.job} {shlex.join(plan.job_args)}".rstrip()]
    if any(HOST_CACHE in t.env.get(contract.RUN_DIR, "") for t in plan.tasks):
        lines.append(f"  {HOST_CACHE}: each remote host's $XDG_CACHE_HOME/tfl or ~/.cache/tfl (asked when the run starts)")
    for t in plan.tasks:
        lines += ["", f"{t.name}  on {t.host}:{t.port}  ({'over ssh' if t.ssh else 'this machine'})", f"  command: {shlex.join(t.argv)}",
                  f"  cwd: {t.cwd}", f"  log: {t.log_path}"]
        if t.ssh is not None:
            lines += [f"  ssh: {t.ssh.describe()}", *(f"  ship: {a} -> {b}" for a, b in t.sync)]
        if t.dirs is not None:
            lines += [f"  ship: the job kit -> {t.dirs.kit}",
                      f"  removed at the end: {', '.join(t.dirs.remove) or 'nothing (--keep-remote)'}"]
        lines.append("  env:")
        for key, value in sorted(t.env.items()):
            if key == "TF_CONFIG":
                pretty = json.dumps(json.loads(value), indent=2).replace("\n", "\n      ")
                lines.append(f"    TF_CONFIG=\n      {pretty}")
            else:
                lines.append(f"    {key}={value}")
    return "\n".join(lines)


def job_name(job: str) -> str:
    return PurePath(job).stem


def describe(spec: Any, runs_dir: str, python: str, cwd: str) -> tuple[list[str], int]:
    """``tfl validate``: the description's tasks as its kind shows them, and the task count."""
    described: tuple[list[str], int] = kinds.describer(spec)(spec, runs_dir, python, cwd)
    return described
