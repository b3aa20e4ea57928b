"""Where each host's tasks run and how that host is reached. Pure: no SSH, no I/O.

A host is *remote* when it is not this machine (``localhost``, ``127.0.0.1``, ``::1``) or
when its settings give ``ssh``; its tasks are then reached over SSH with ``SSHTarget``
(names and paths only, never key material). Which backend serves them is decided in
``launcher.backends``, from these facts.

Paths on a remote host: the working dir ``W`` is ``hosts.<h>.workdir``, else
``/tmp/tfl/<run_id>`` when code is shipped (no ``~``, nothing for a shell to expand), else
this machine's cwd (``--no-sync``: the code is already there, at the same paths). The job's
run dir there is ``W/tfl-runs/<run_id>`` (TFL_RUN_DIR: progress file, default model dir);
the agent mirrors the progress file back to the task's local ``progress_path``. Shipping
copies the job script into ``W`` and the *contents* of each ``--sync DIR`` into ``W``; a
job that lies inside a synced dir keeps its relative path there.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.tasks import LOCAL_HOSTS

if TYPE_CHECKING:  # the spec (pydantic) is needed only to build a plan, never to read one
    from launcher.spec import ClusterSpec

DEFAULT_REMOTE_ROOT = "/tmp/tfl"


@dataclass(frozen=True)
class RemoteOptions:
    """The ``tfl launch`` options that shape remote tasks."""

    ship_code: bool = False  # copy the job (and sync_dirs) to each host; False: --no-sync
    sync_dirs: tuple[str, ...] = ()  # absolute local directories
    accept_new_host_keys: bool = False


@dataclass(frozen=True)
class SSHTarget:
    """How to reach one host over SSH."""

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

    def describe(self) -> str:
        """One line for ``--dry-run``: user, host, port, key, known_hosts."""
        key = f", key {self.identity_file}" if self.identity_file else ""
        accept = ", accepting new host keys" if self.accept_new_host_keys else ""
        return f"{self}{key}, known_hosts {self.known_hosts or '~/.ssh/known_hosts'}{accept}"


@dataclass(frozen=True)
class HostPlan:
    """One host: its python, its working dir, the run dir its tasks see, how it is reached."""

    host: str
    python: str
    workdir: str  # the tasks' cwd
    run_dir: str  # TFL_RUN_DIR as the host's tasks see it
    ssh: SSHTarget | None  # None: this machine, no SSH


def is_remote(spec: ClusterSpec, host: str) -> bool:
    return host not in LOCAL_HOSTS or spec.host(host).ssh is not None


def ssh_target(spec: ClusterSpec, host: str, accept_new_host_keys: bool = False) -> SSHTarget:
    """The top-level ``ssh`` settings with ``hosts.<host>.ssh`` laid over them."""
    merged = spec.ssh.model_dump()  # both validated already
    override = spec.host(host).ssh
    if override is not None:
        merged.update(override.model_dump(exclude_unset=True))
    return SSHTarget(host=host, accept_new_host_keys=accept_new_host_keys, **merged)


def host_plan(spec: ClusterSpec, host: str, *, run_id: str | None, run_dir: str, python: str, cwd: str,
              options: RemoteOptions) -> HostPlan:
    """``run_id`` None (``tfl doctor``): no run yet; a remote workdir is then its default root."""
    settings = spec.host(host)
    python = settings.python or python
    if not is_remote(spec, host):
        return HostPlan(host, python, settings.workdir or cwd, run_dir, None)
    default = DEFAULT_REMOTE_ROOT if run_id is None else f"{DEFAULT_REMOTE_ROOT}/{run_id}"
    workdir = settings.workdir or (default if options.ship_code else cwd)
    return HostPlan(host, python, workdir, f"{workdir}/tfl-runs/{run_id}",
                    ssh_target(spec, host, options.accept_new_host_keys))


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
