"""Plan, then execute: a cluster spec becomes a frozen, printable ``LaunchPlan``.

``build_plan`` is pure: given the spec, the job and the run's identity it returns what
would run where (host, argv, environment, log path for every task). ``tfl launch
--dry-run`` prints it; backends only consume it. The task environment is data here and
meets ``os.environ`` only when a backend spawns the process.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from launcher.placement import place_gpus
from launcher.remoteplan import RemoteOptions, remote_task
from launcher.spec import ClusterSpec, parse_address
from launcher.tfconfig import TaskId, tasks_of, tf_config_json


@dataclass(frozen=True)
class TaskLaunch:
    """One task of the plan: everything a backend needs to start it."""

    task: TaskId
    host: str
    port: int
    backend: str  # "local" or "ssh"
    argv: tuple[str, ...]
    env: dict[str, str] = field(hash=False)
    cwd: str | None
    log_path: str
    progress_path: str
    # SSH tasks only (see remoteplan): how to reach the host, and (local, remote) copies to ship.
    ssh: dict[str, Any] | None = field(default=None, hash=False)
    sync: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return str(self.task)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.name, "host": self.host, "port": self.port, "backend": self.backend,
            "argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd,
            "log_path": self.log_path, "progress_path": self.progress_path,
            "ssh": self.ssh, "sync": [list(s) for s in self.sync],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskLaunch:
        return cls(
            task=TaskId.parse(data["task"]), host=data["host"], port=data["port"], backend=data["backend"],
            argv=tuple(data["argv"]), env=dict(data["env"]), cwd=data["cwd"],
            log_path=data["log_path"], progress_path=data["progress_path"],
            ssh=data.get("ssh"), sync=tuple((a, b) for a, b in data.get("sync", [])),
        )


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    run_dir: str
    job: str
    job_args: tuple[str, ...]
    tasks: tuple[TaskLaunch, ...]

    @property
    def training_tasks(self) -> tuple[TaskLaunch, ...]:
        return tuple(t for t in self.tasks if t.task.is_training)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "run_dir": self.run_dir, "job": self.job,
            "job_args": list(self.job_args), "tasks": [t.to_dict() for t in self.tasks],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchPlan:
        return cls(
            run_id=data["run_id"], run_dir=data["run_dir"], job=data["job"],
            job_args=tuple(data["job_args"]), tasks=tuple(TaskLaunch.from_dict(t) for t in data["tasks"]),
        )


def backend_for(spec: ClusterSpec, host: str) -> str:
    """Local hosts run as local processes unless their settings ask for SSH."""
    is_local = parse_address(f"[{host}]:1" if ":" in host else f"{host}:1").is_local
    return "local" if is_local and spec.host(host).ssh is None else "ssh"


def build_plan(
    spec: ClusterSpec, job: str, job_args: tuple[str, ...], *, run_id: str, run_dir: str, python: str, cwd: str,
    remote: RemoteOptions = RemoteOptions(), virtual_devices: int | None = None,
) -> LaunchPlan:
    """What runs where. ``job`` is an absolute path; ``python``/``cwd`` are the local defaults.

    ``virtual_devices`` (``--virtual-devices N``): the job kit splits each task's device into N.
    """
    tasks = []
    placement = place_gpus(spec)  # which GPUs each task sees (validated with the spec)
    virtual = {} if virtual_devices is None else {"TFL_VIRTUAL_DEVICES": str(virtual_devices)}
    for task in tasks_of(spec.cluster):
        address = spec.cluster.addresses(task.type)[task.index]
        settings = spec.host(address.host)
        slug = f"{task.type}-{task.index}"
        env = {
            **spec.env,
            **settings.env,
            **placement.env(task),
            **virtual,
            "TF_CONFIG": tf_config_json(spec.cluster, task),
            # tf_keras, not Keras 3: Keras 3 fails under MultiWorkerMirroredStrategy (keras-team/keras#20585).
            "TF_USE_LEGACY_KERAS": "1",
            "PYTHONUNBUFFERED": "1",
            "TFL_RUN_ID": run_id,
            "TFL_TASK": str(task),
            "TFL_RUN_DIR": run_dir,
            "TFL_PROGRESS_FILE": f"{run_dir}/progress/{slug}.json",
            "TFL_ATTEMPT": "0",
        }
        launch = TaskLaunch(
            task=task, host=address.host, port=address.port, backend=backend_for(spec, address.host),
            argv=(settings.python or python, "-u", job, *job_args), env=env, cwd=settings.workdir or cwd,
            log_path=f"{run_dir}/logs/{slug}.log", progress_path=env["TFL_PROGRESS_FILE"],
        )
        if launch.backend == "ssh":
            launch = remote_task(launch, spec, job, job_args, run_id=run_id, cwd=cwd, options=remote)
        tasks.append(launch)
    return LaunchPlan(run_id=run_id, run_dir=run_dir, job=job, job_args=job_args, tasks=tuple(tasks))


def render_plan(plan: LaunchPlan) -> str:
    """Human-readable plan for ``--dry-run``: every task's host, command, env and log."""
    lines = [f"run {plan.run_id}", f"  dir: {plan.run_dir}", f"  job: {plan.job} {shlex.join(plan.job_args)}".rstrip()]
    for t in plan.tasks:
        lines += ["", f"{t.name}  on {t.host}:{t.port}  ({t.backend})", f"  command: {shlex.join(t.argv)}",
                  f"  cwd: {t.cwd}", f"  log: {t.log_path}"]
        if t.ssh is not None:
            lines += [f"  ssh: {render_ssh(t.ssh)}", *(f"  ship: {a} -> {b}" for a, b in t.sync)]
        lines.append("  env:")
        for key, value in sorted(t.env.items()):
            if key == "TF_CONFIG":
                pretty = json.dumps(json.loads(value), indent=2).replace("\n", "\n      ")
                lines.append(f"    TF_CONFIG=\n      {pretty}")
            else:
                lines.append(f"    {key}={value}")
    return "\n".join(lines)


def render_ssh(ssh: dict[str, Any]) -> str:
    user = f"{ssh['user']}@" if ssh.get("user") else ""
    key = f", key {ssh['identity_file']}" if ssh.get("identity_file") else ""
    accept = ", accepting new host keys" if ssh.get("accept_new_host_keys") else ""
    return f"{user}{ssh['host']}:{ssh['port']}{key}, known_hosts {ssh.get('known_hosts') or '~/.ssh/known_hosts'}{accept}"


def job_name(job: str) -> str:
    return PurePath(job).stem
