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

from launcher.describe import kinds
from launcher.describe.hosts import RemoteDirs, SSHTarget, on_host
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

    @property
    def training_tasks(self) -> tuple[TaskLaunch, ...]:
        return tuple(t for t in self.tasks if t.task.is_training)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id, "run_dir": self.run_dir, "job": self.job,
            "job_args": list(self.job_args), "tasks": [t.to_dict() for t in self.tasks],
            **({"unit": {"kind": self.unit.kind, **self.unit.to_dict()}} if self.unit else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LaunchPlan:
        return cls(
            run_id=data["run_id"], run_dir=data["run_dir"], job=data["job"],
            job_args=tuple(data["job_args"]), tasks=tuple(TaskLaunch.from_dict(t) for t in data["tasks"]),
            unit=_unit(data),
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
