"""What a task on an SSH host looks like in the plan. Pure: no SSH, no I/O.

``build_plan`` hands every task whose backend is "ssh" to ``remote_task``, which puts in
what only a remote task needs: the host's SSH settings (paths and names, never key
contents), the remote working dir and run dir, and the files to ship there.

Paths on a host: the working dir ``W`` is ``hosts.<h>.workdir``, else ``/tmp/tfl/<run_id>``
when code is shipped (no ``~``, nothing for a shell to expand), else this machine's cwd
(``--no-sync``: the code is already there, at the same paths). The job's run dir there is
``W/tfl-runs/<run_id>`` (TFL_RUN_DIR: progress file, default model dir); the agent mirrors
the progress file back to the task's local ``progress_path``. Shipping copies
the job script into ``W`` and the *contents* of each ``--sync DIR`` into ``W``; a job that
lies inside a synced dir keeps its relative path there.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.spec import ClusterSpec, SSHSettings

if TYPE_CHECKING:
    from launcher.plan import TaskLaunch

DEFAULT_REMOTE_ROOT = "/tmp/tfl"


@dataclass(frozen=True)
class RemoteOptions:
    """The ``tfl launch`` options that shape remote tasks."""

    ship_code: bool = False  # copy the job (and sync_dirs) to each host; False: --no-sync
    sync_dirs: tuple[str, ...] = ()  # absolute local directories
    accept_new_host_keys: bool = False


@dataclass(frozen=True)
class SSHTarget:
    """How to reach one host: what the plan records under ``TaskLaunch.ssh``."""

    host: str
    port: int = 22
    user: str | None = None
    identity_file: str | None = None
    connect_timeout: float = 10.0
    known_hosts: str | None = None
    accept_new_host_keys: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SSHTarget:
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls) if f.name in data})

    @property
    def known_hosts_file(self) -> str:
        return os.path.expanduser(self.known_hosts or "~/.ssh/known_hosts")

    @property
    def address(self) -> str:
        """The host as known_hosts and ssh-keyscan name it."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def __str__(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.host}:{self.port}"


def ssh_target(spec: ClusterSpec, host: str, accept_new_host_keys: bool = False) -> SSHTarget:
    """The top-level ``ssh`` settings with ``hosts.<host>.ssh`` laid over them."""
    merged = spec.ssh.model_dump()
    override = spec.host(host).ssh
    if override is not None:
        merged.update(override.model_dump(exclude_unset=True))
    settings = SSHSettings.model_validate(merged)
    return SSHTarget(host=host, port=settings.port, user=settings.user, identity_file=settings.identity_file,
                     connect_timeout=settings.connect_timeout, known_hosts=settings.known_hosts,
                     accept_new_host_keys=accept_new_host_keys)


def remote_task(launch: TaskLaunch, spec: ClusterSpec, job: str, job_args: tuple[str, ...], *, run_id: str,
                cwd: str, options: RemoteOptions) -> TaskLaunch:
    """``launch`` as built for a local process, rewritten for its SSH host."""
    settings = spec.host(launch.host)
    workdir = settings.workdir or (f"{DEFAULT_REMOTE_ROOT}/{run_id}" if options.ship_code else cwd)
    run_dir = f"{workdir}/tfl-runs/{run_id}"
    # The agent mirrors this remote file into launch.progress_path, which stays local.
    progress = f"{run_dir}/progress/{os.path.basename(launch.progress_path)}"
    remote_job, sync = shipping(job, workdir, options)
    env = {**launch.env, "TFL_RUN_DIR": run_dir, "TFL_PROGRESS_FILE": progress}
    argv = (launch.argv[0], "-u", remote_job, *job_args)
    return dataclasses.replace(
        launch, argv=argv, env=env, cwd=workdir,
        ssh=ssh_target(spec, launch.host, options.accept_new_host_keys).to_dict(), sync=sync)


def shipping(job: str, workdir: str, options: RemoteOptions) -> tuple[str, tuple[tuple[str, str], ...]]:
    """The job's path on the host and the (local, remote) copies that put it there."""
    if not options.ship_code:
        return job, ()
    copies = [(d, workdir) for d in options.sync_dirs]
    inside = [d for d in options.sync_dirs if job.startswith(d.rstrip("/") + "/")]
    if inside:
        return f"{workdir}/{os.path.relpath(job, inside[0])}", tuple(copies)
    remote_job = f"{workdir}/{os.path.basename(job)}"
    return remote_job, ((job, remote_job), *copies)
