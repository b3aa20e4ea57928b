"""Plan, then execute: a cluster spec becomes a frozen, printable ``LaunchPlan``.

``build_plan`` is pure: given the spec, the job and the run's identity it returns what
would run where (host, argv, environment, log path for every task). ``tfl launch
--dry-run`` prints it; backends only consume it. The task environment is data here and
meets ``os.environ`` only when a backend spawns the process.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import TYPE_CHECKING, Any

from launcher import contract
from launcher.hosts import HOST_CACHE, HostPlan, RemoteDirs, RemoteOptions, SSHTarget, host_plan, on_host, shipping
from launcher.slurm.batch import SlurmJobPlan
from launcher.tasks import TaskId
from launcher.tfconfig import tf_config_json

if TYPE_CHECKING:  # a plan is read (status, the detached launcher) without pydantic
    from launcher.slurm.settings import SlurmClusterSpec
    from launcher.spec import ClusterSpec
    from launcher.supervisor import SupervisorConfig


@dataclass(frozen=True)
class TaskLaunch:
    """One task of the plan: everything a backend needs to start it."""

    task: TaskId
    host: str
    port: int
    argv: tuple[str, ...]
    env: dict[str, str] = field(hash=False)
    cwd: str | None
    log_path: str  # on this machine: every backend delivers the task's output here
    progress_path: str  # on this machine (a remote task's agent mirrors its progress file here)
    ssh: SSHTarget | None = None  # how to reach the task's host; None: this machine
    sync: tuple[tuple[str, str], ...] = ()  # (local, remote) copies that put the code on the host
    dirs: RemoteDirs | None = None  # the run's dirs on a remote host (the job kit's among them)

    @property
    def name(self) -> str:
        return str(self.task)

    @property
    def python(self) -> str:
        return self.argv[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.name, "host": self.host, "port": self.port,
            "argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd,
            "log_path": self.log_path, "progress_path": self.progress_path,
            "ssh": self.ssh.to_dict() if self.ssh else None, "sync": [list(s) for s in self.sync],
            "dirs": self.dirs.to_dict() if self.dirs else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskLaunch:
        return cls(
            task=TaskId.parse(data["task"]), host=data["host"], port=data["port"],
            argv=tuple(data["argv"]), env=dict(data["env"]), cwd=data["cwd"],
            log_path=data["log_path"], progress_path=data["progress_path"],
            ssh=SSHTarget.from_dict(data["ssh"]) if data.get("ssh") else None,
            sync=tuple((a, b) for a, b in data.get("sync", [])),
            dirs=RemoteDirs.from_dict(data["dirs"]) if data.get("dirs") else None,
        )

    def on_host(self, cache: str) -> TaskLaunch:
        """This task with ``{tfl-cache}`` replaced by its host's real dir (not in the job's arguments)."""
        if self.dirs is None:
            return self
        own = len(self.argv) - len(self.job_args)
        return dataclasses.replace(
            self, argv=tuple(on_host(a, cache) for a in self.argv[:own]) + self.job_args,
            env={k: on_host(v, cache) for k, v in self.env.items()}, cwd=on_host(self.cwd, cache) if self.cwd else None,
            sync=tuple((a, on_host(b, cache)) for a, b in self.sync), dirs=self.dirs.on_host(cache))

    @property
    def job_args(self) -> tuple[str, ...]:
        return self.argv[3:]  # python -u JOB ARGS...


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    run_dir: str
    job: str
    job_args: tuple[str, ...]
    tasks: tuple[TaskLaunch, ...]
    slurm: SlurmJobPlan | None = None  # the batch script that starts the tasks (a `slurm` description)
    unit: Any = None  # an engine's own part with a ``kind`` and ``to_dict`` (a `ray` description: RayUnit)

    @property
    def training_tasks(self) -> tuple[TaskLaunch, ...]:
        return tuple(t for t in self.tasks if t.task.is_training)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "run_dir": self.run_dir, "job": self.job,
            "job_args": list(self.job_args), "tasks": [t.to_dict() for t in self.tasks],
            **({"slurm": self.slurm.to_dict()} if self.slurm else {}),
            **({"unit": self.unit.to_dict()} if self.unit is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchPlan:
        return cls(
            run_id=data["run_id"], run_dir=data["run_dir"], job=data["job"],
            job_args=tuple(data["job_args"]), tasks=tuple(TaskLaunch.from_dict(t) for t in data["tasks"]),
            slurm=SlurmJobPlan.from_dict(data["slurm"]) if data.get("slurm") else None,
            unit=_load_unit(data["unit"]) if data.get("unit") else None,
        )

    def on_hosts(self, caches: dict[str, str]) -> LaunchPlan:
        """The plan with each remote host's ``{tfl-cache}`` as that host resolved it (``caches``)."""
        tasks = tuple(t.on_host(caches[t.host]) if t.host in caches else t for t in self.tasks)
        return dataclasses.replace(self, tasks=tasks)


def _load_unit(data: dict[str, Any]) -> Any:
    """A recorded plan's engine part, by its kind (stdlib: a plan is read without pydantic)."""
    if data.get("kind") == "ray":
        from launcher.ray.plan import RayUnit

        return RayUnit.from_dict(data)
    raise ValueError(f"unknown plan unit kind {data.get('kind')!r}")


def build_plan(
    spec: ClusterSpec | SlurmClusterSpec, job: str, job_args: tuple[str, ...], *, run_id: str, run_dir: str, python: str,
    cwd: str, remote: RemoteOptions = RemoteOptions(), virtual_devices: int | None = None,
    config: SupervisorConfig | None = None,
) -> LaunchPlan:
    """What runs where. ``job`` is an absolute path; ``python``/``cwd`` are the local defaults.

    ``virtual_devices`` (``--virtual-devices N``): the job kit splits each task's device into N.
    A ``slurm`` description becomes a plan with a batch script (``launcher.slurm.plan``), which
    carries the run's restart policy (``config``).
    """
    from launcher.spec import ClusterSpec  # loaded already (spec is one); reading a plan needs no pydantic

    if is_ray_description_spec(spec):  # a `ray` description: Ray places the tasks
        from launcher.ray.plan import build_ray_plan

        return build_ray_plan(spec, job, job_args, run_id=run_id, run_dir=run_dir,  # type: ignore[arg-type]
                              virtual_devices=virtual_devices)
    if not isinstance(spec, ClusterSpec):  # a `slurm` description: Slurm places the tasks
        from launcher.slurm.plan import build_slurm_plan
        from launcher.supervisor import SupervisorConfig

        return build_slurm_plan(spec, job, job_args, run_id=run_id, run_dir=run_dir, python=python, cwd=cwd,
                                virtual_devices=virtual_devices, config=config or SupervisorConfig())
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
        **contract.run_variables(run_id, host.run_dir, virtual_devices),
        **contract.task_variables(task.type, task.index, host.run_dir),
    }
    if spec.storage is not None:
        env[contract.MODEL_DIR] = contract.shared_model_dir(spec.storage.path, run_id)
    if host.dirs is not None:  # the shipped job kit before anything else the task could import
        env["PYTHONPATH"] = ":".join(p for p in (host.dirs.kit, env.get("PYTHONPATH")) if p)
    return TaskLaunch(
        task=task, host=host.host, port=port, argv=(host.python, "-u", job_there, *job_args), env=env,
        cwd=host.workdir, log_path=f"{run_dir}/{contract.LOGS_SUBDIR}/{task.slug}.log",
        progress_path=f"{run_dir}/{progress_name}", ssh=host.ssh, sync=sync, dirs=host.dirs,
    )


def render_plan(plan: LaunchPlan) -> str:
    """Human-readable plan for ``--dry-run``: every task's host, command, env and log."""
    if plan.unit is not None and plan.unit.kind == "ray":
        from launcher.ray.plan import render_ray_plan

        return render_ray_plan(plan)
    if plan.slurm is not None:
        from launcher.slurm.plan import render_slurm_plan

        return render_slurm_plan(plan)
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


def is_ray_description_spec(spec: object) -> bool:
    """Whether a parsed description is a `ray` one (by its block; no import of its models)."""
    return type(spec).__name__ == "RayClusterSpec"


def job_name(job: str) -> str:
    return PurePath(job).stem


def describe(spec: ClusterSpec | SlurmClusterSpec, runs_dir: str, python: str, cwd: str) -> tuple[list[str], int]:
    """``tfl validate``: each task and its address as written; for a ``slurm`` description, the
    plan of a run of a placeholder JOB: its tasks, srun lines and batch script. Also the task count."""
    from launcher.spec import ClusterSpec
    from launcher.tfconfig import tasks_of

    if not isinstance(spec, ClusterSpec):
        plan = build_plan(spec, "JOB", (), run_id="RUN", run_dir=f"{runs_dir}/RUN", python=python, cwd=cwd)
        return render_plan(plan).splitlines(), len(plan.tasks)
    tasks = tasks_of(spec.cluster)
    return [f"{task}\t{getattr(spec.cluster, task.type)[task.index]}" for task in tasks], len(tasks)
