"""The planner of a ``cluster`` description: each task on the host and port the file names,
as a local process or over SSH (``launcher.describe.kinds`` hands such a description here).

Pure: every ``TaskLaunch`` is built once, with its host's settings (``hosts.host_plan``),
its devices, its environment and its paths.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from launcher import contract
from launcher.describe.hosts import HostPlan, RemoteOptions, host_plan, shipping
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.tfconfig import tasks_of, tf_config_json
from launcher.tasks import TaskId

if TYPE_CHECKING:
    from launcher.describe.spec import ClusterSpec
    from launcher.plan.run_options import SupervisorConfig


def build_cluster_plan(
    spec: ClusterSpec, job: str, job_args: tuple[str, ...], *, run_id: str, run_dir: str, python: str, cwd: str,
    remote: RemoteOptions, virtual_devices: int | None, config: SupervisorConfig,
) -> LaunchPlan:
    """What runs where (``config`` is the supervisor's to apply: nothing of it goes in the plan)."""
    hosts: dict[str, HostPlan] = {}
    tasks = []
    for task in spec.cluster.tasks():
        address = spec.cluster.address(task)
        if address.host not in hosts:
            hosts[address.host] = host_plan(spec, address.host, run_id=run_id, run_dir=run_dir, python=python,
                                            cwd=cwd, options=remote)
        tasks.append(task_launch(spec, task, hosts[address.host], address.port, job, job_args, run_id=run_id,
                                 run_dir=run_dir, remote=remote, virtual_devices=virtual_devices))
    return LaunchPlan(run_id=run_id, run_dir=run_dir, job=job, job_args=job_args, tasks=tuple(tasks))


def task_launch(spec: ClusterSpec, task: TaskId, host: HostPlan, port: int, job: str, job_args: tuple[str, ...], *,
                run_id: str, run_dir: str, remote: RemoteOptions, virtual_devices: int | None) -> TaskLaunch:
    """One task, built once: its host's settings, devices, environment and paths."""
    progress_name = f"{contract.PROGRESS_SUBDIR}/{task.slug}.json"
    job_there, sync = shipping(job, host.workdir, remote) if host.ssh else (job, ())
    env = {
        **spec.env,
        **spec.host(host.host).env,
        **spec.placement.env(task),
        contract.TF_CONFIG: tf_config_json(spec.cluster, task),
        **contract.run_variables(run_id, host.run_dir, virtual_devices, evaluator=bool(spec.cluster.evaluator)),
        **contract.task_variables(task.type, task.index, host.run_dir),
    }
    if spec.storage is not None:
        env[contract.MODEL_DIR] = contract.shared_model_dir(spec.storage.path, run_id)
    kit = host.dirs.kit if host.dirs is not None else host.kit
    if kit is not None:  # the shipped (or copied) job kit before anything else the task could import
        env["PYTHONPATH"] = ":".join(p for p in (kit, env.get("PYTHONPATH")) if p)
    return TaskLaunch(
        task=task, host=host.host, port=port, argv=(host.python, "-u", job_there, *job_args), env=env,
        cwd=host.workdir, log_path=f"{run_dir}/{contract.LOGS_SUBDIR}/{task.slug}.log",
        progress_path=f"{run_dir}/{progress_name}", ssh=host.ssh, sync=sync, dirs=host.dirs, kit=host.kit,
    )


def describe_cluster(spec: ClusterSpec, runs_dir: str, python: str, cwd: str) -> tuple[list[str], int]:
    """``tfl validate``: each task and its address as written, and the task count."""
    tasks = tasks_of(spec.cluster)
    return [f"{task}\t{getattr(spec.cluster, task.type)[task.index]}" for task in tasks], len(tasks)
