"""Plan, then execute: the frozen, printable ``LaunchPlan`` and its ``TaskLaunch`` per task (``plan.build``
makes them through the description kind's planner).

A plan says what would run where (host, argv, environment, log path for every task). ``tfl launch
--dry-run`` prints it; engines only consume it. The task environment is data here and
meets ``os.environ`` only when an engine spawns the process.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from launcher import contract
from launcher.describe import kinds
from launcher.describe.hosts import RemoteDirs, SSHTarget, on_host
from launcher.plan.tfconfig import shared_cluster, tf_config_json_of
from launcher.tasks import TaskId


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
    kit: str | None = None  # a local task under another python than tfl's: the job kit's copy, first on its PYTHONPATH

    @property
    def name(self) -> str:
        return str(self.task)

    @property
    def python(self) -> str:
        return self.argv[0]

    def to_dict(self, cluster: dict[str, list[str]] | None = None) -> dict[str, Any]:
        """``cluster``: the plan's TF_CONFIG cluster, recorded once: a task whose TF_CONFIG is
        drawn from it keeps only ``"tf_config": "plan"`` (its own part is its ``task``)."""
        env, shared = dict(self.env), False
        if cluster is not None and env.get(contract.TF_CONFIG) == tf_config_json_of(cluster, self.task):
            del env[contract.TF_CONFIG]
            shared = True
        return {
            "task": self.name, "host": self.host, "port": self.port,
            "argv": list(self.argv), "env": env, "cwd": self.cwd, **({"tf_config": "plan"} if shared else {}),
            "log_path": self.log_path, "progress_path": self.progress_path,
            "ssh": self.ssh.to_dict() if self.ssh else None, "sync": [list(s) for s in self.sync],
            "dirs": self.dirs.to_dict() if self.dirs else None, **({"kit": self.kit} if self.kit else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], cluster: dict[str, list[str]] | None = None) -> TaskLaunch:
        """A recorded task; its TF_CONFIG rebuilt from the plan's ``cluster`` where it was recorded so."""
        task, env = TaskId.parse(data["task"]), dict(data["env"])
        if data.get("tf_config") == "plan" and cluster is not None:
            env[contract.TF_CONFIG] = tf_config_json_of(cluster, task)
        return cls(
            task=task, host=data["host"], port=data["port"],
            argv=tuple(data["argv"]), env=env, cwd=data["cwd"],
            log_path=data["log_path"], progress_path=data["progress_path"],
            ssh=SSHTarget.from_dict(data["ssh"]) if data.get("ssh") else None,
            sync=tuple((a, b) for a, b in data.get("sync", [])),
            dirs=RemoteDirs.from_dict(data["dirs"]) if data.get("dirs") else None, kit=data.get("kit"),
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


class UnitPlan(Protocol):
    """An engine's own part of a plan, for engines that start the tasks as one unit (Slurm's
    batch script). Its ``kind`` is its description kind's name, and the backend's."""

    @property
    def kind(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class LaunchPlan:
    run_id: str
    run_dir: str
    job: str
    job_args: tuple[str, ...]
    tasks: tuple[TaskLaunch, ...]
    unit: UnitPlan | None = None  # what starts the tasks as one unit (a `slurm` description: the batch script)
    network: str = "host"  # where the task ports can be reached from: auto | private | host (launcher.plan.network)

    @property
    def training_tasks(self) -> tuple[TaskLaunch, ...]:
        return tuple(t for t in self.tasks if t.task.is_training)

    def to_dict(self) -> dict[str, Any]:
        """The plan as recorded. TF_CONFIG's cluster is kept once (``tf_cluster``), not in every
        task's environment: a record grows with the tasks, not with their square."""
        configs = [t.env[contract.TF_CONFIG] for t in self.tasks if contract.TF_CONFIG in t.env]
        cluster = shared_cluster(configs) if configs else None
        return {
            "run_id": self.run_id, "run_dir": self.run_dir, "job": self.job,
            "job_args": list(self.job_args), "tasks": [t.to_dict(cluster) for t in self.tasks], "network": self.network,
            **({"tf_cluster": cluster} if cluster else {}),
            **({"unit": {"kind": self.unit.kind, **self.unit.to_dict()}} if self.unit else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchPlan:
        """A recorded plan: this tfl's, or an older one's (every task's TF_CONFIG whole in its env)."""
        cluster = data.get("tf_cluster")
        return cls(
            run_id=data["run_id"], run_dir=data["run_dir"], job=data["job"],
            job_args=tuple(data["job_args"]), tasks=tuple(TaskLaunch.from_dict(t, cluster) for t in data["tasks"]),
            unit=_unit(data), network=data.get("network", "host"),  # recorded before the modes: host
        )

    def on_hosts(self, caches: dict[str, str]) -> LaunchPlan:
        """The plan with each remote host's ``{tfl-cache}`` as that host resolved it (``caches``)."""
        tasks = tuple(t.on_host(caches[t.host]) if t.host in caches else t for t in self.tasks)
        return dataclasses.replace(self, tasks=tasks)


def _unit(data: dict[str, Any]) -> UnitPlan | None:
    if data.get("unit"):
        return kinds.load_unit(data["unit"])  # type: ignore[no-any-return]
    if data.get("slurm"):  # recorded before plans named their unit's kind (record version 2)
        return kinds.load_unit({"kind": "slurm", **data["slurm"]})  # type: ignore[no-any-return]
    return None
