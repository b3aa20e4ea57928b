"""Where each host's tasks run and how that host is reached. Pure: no SSH, no I/O.

A host is *remote* when it is not this machine (``localhost``, ``127.0.0.1``, ``::1``) or
when its settings give ``ssh``; its tasks are then reached over SSH with ``SSHTarget``
(names and paths only, never key material). Which backend serves them is decided in
``launcher.engines.registry``, from these facts.

Paths on a remote host: the run's dir there ``R`` is private to the login user:
``{tfl-cache}/runs/<run_id>/<host>``, where ``{tfl-cache}`` stands for the host's
``$XDG_CACHE_HOME/tfl`` or ``~/.cache/tfl``. Only the host knows where that is: its first
agent says so while tfl prepares it, and the plan's paths are then filled in
(``LaunchPlan.on_hosts``), so that a run's record holds the real ones. tfl makes these dirs
0700 and refuses them when one is a symlink or belongs to someone else (``RemoteDirs``).
``R`` is the tasks' TFL_RUN_DIR (progress file, scratch, the default model dir), ``R/kit``
holds the job kit, first on the tasks' PYTHONPATH, and ``R/code`` the shipped code.

The working dir ``W`` is ``hosts.<h>.workdir`` (checked the same way when code is shipped
into it), else ``R/code`` when code is shipped, else this machine's cwd (``--no-sync``:
the code is already there, at the same paths). Shipping copies the job script into ``W``
and the *contents* of each ``--sync DIR`` into ``W``; a job that lies inside a synced dir
keeps its relative path there. When the run ends, the kit, ``R/code``, the progress files
and scratch are removed (``--keep-remote`` keeps them); a model dir left in ``R`` stays.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.contract import PROGRESS_SUBDIR
from launcher.tasks import is_local_host

if TYPE_CHECKING:  # the spec (pydantic) is needed only to build a plan, never to read one
    from launcher.describe.spec import ClusterSpec

KIT_SUBDIR = "kit"  # the job kit's copy in a run dir (a remote host's, or this machine's for another python)
HOST_CACHE = "{tfl-cache}"  # a remote host's per-user tfl dir, until its agent has said where that is


@dataclass(frozen=True)
class RemoteOptions:
    """The ``tfl launch`` options that shape remote tasks."""

    ship_code: bool = False  # copy the job (and sync_dirs) to each host; False: --no-sync
    sync_dirs: tuple[str, ...] = ()  # absolute local directories
    accept_new_host_keys: bool = False
    keep_remote: bool = False  # leave the shipped code and kit on the hosts after the run


@dataclass(frozen=True)
class RemoteDirs:
    """What tfl makes, checks and removes on one remote host for one run (parents first)."""

    private: tuple[str, ...]  # made 0700; refused when a symlink or someone else's
    checked: tuple[str, ...]  # a configured workdir tfl ships code into: refused the same way
    kit: str  # the job kit's dir, first on the tasks' PYTHONPATH
    remove: tuple[str, ...]  # removed when the run ends (none with --keep-remote)
    rmdir: tuple[str, ...]  # then removed when empty

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RemoteDirs:
        return cls(private=tuple(data["private"]), checked=tuple(data["checked"]), kit=data["kit"],
                   remove=tuple(data["remove"]), rmdir=tuple(data["rmdir"]))

    def on_host(self, cache: str) -> RemoteDirs:
        def each(paths: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(on_host(p, cache) for p in paths)

        return RemoteDirs(each(self.private), each(self.checked), on_host(self.kit, cache), each(self.remove),
                          each(self.rmdir))


def on_host(path: str, cache: str) -> str:
    """``path`` with ``{tfl-cache}`` replaced by the host's real dir."""
    return cache + path[len(HOST_CACHE):] if path.startswith(HOST_CACHE) else path


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
    fence_after: float = 30.0  # the agent's dead-man timer: no word from us for this long, it stops its task
    firewall: bool = False  # the run's nftables table on the host: its task ports reached only from the run's hosts
    jump: str | None = None  # a bastion, "[user@]host[:port]"; "none": straight, whatever the ssh config says
    config: str | None = None  # the OpenSSH client config (None: ~/.ssh/config, then /etc/ssh/ssh_config)

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
        fenced = ", task ports fenced (nftables)" if self.firewall else ""
        jump = f", via bastion {self.jump}" if self.jump and self.jump != "none" else ""
        config = f", ssh config {self.config}" if self.config else ""
        return f"{self}{key}, known_hosts {self.known_hosts or '~/.ssh/known_hosts'}{accept}{fenced}{jump}{config}"


@dataclass(frozen=True)
class HostPlan:
    """One host: its python, its working dir, the run dir its tasks see, how it is reached."""

    host: str
    python: str
    workdir: str  # the tasks' cwd
    run_dir: str  # TFL_RUN_DIR as the host's tasks see it
    ssh: SSHTarget | None  # None: this machine, no SSH
    dirs: RemoteDirs | None = None  # None: this machine
    kit: str | None = None  # this machine, another python than tfl's: where the job kit is copied for it


def is_remote(spec: ClusterSpec, host: str) -> bool:
    return not is_local_host(host) or spec.host(host).ssh is not None


def ssh_target(spec: ClusterSpec, host: str, accept_new_host_keys: bool = False) -> SSHTarget:
    """The top-level ``ssh`` settings with ``hosts.<host>.ssh`` laid over them."""
    merged = spec.ssh.model_dump()  # both validated already
    override = spec.host(host).ssh
    if override is not None:
        merged.update(override.model_dump(exclude_unset=True))
    return SSHTarget(host=host, accept_new_host_keys=accept_new_host_keys, **merged)


def host_plan(spec: ClusterSpec, host: str, *, run_id: str | None, run_dir: str, python: str, cwd: str,
              options: RemoteOptions) -> HostPlan:
    """``run_id`` None (``tfl doctor``): no run yet; a remote workdir is then the host's tfl dir."""
    settings = spec.host(host)
    own_python, python = python, settings.python or python
    if not is_remote(spec, host):
        # Another python may not have tfl installed: its tasks get the kit as an SSH host's do.
        kit = f"{run_dir}/{KIT_SUBDIR}" if run_id is not None and python != own_python else None
        return HostPlan(host, python, settings.workdir or cwd, run_dir, None, kit=kit)
    target = ssh_target(spec, host, options.accept_new_host_keys)
    if run_id is None:
        return HostPlan(host, python, settings.workdir or HOST_CACHE, "", target)
    runs = f"{HOST_CACHE}/runs"
    root = f"{runs}/{run_id}/{_slug(host)}"
    code = f"{root}/code"
    workdir = settings.workdir or (code if options.ship_code else cwd)
    kit = f"{root}/{KIT_SUBDIR}"
    removed = (kit, f"{root}/{PROGRESS_SUBDIR}", f"{root}/scratch", *((code,) if workdir == code else ()))
    dirs = RemoteDirs(private=(HOST_CACHE, runs, f"{runs}/{run_id}", root),
                      checked=(settings.workdir,) if settings.workdir and options.ship_code else (), kit=kit,
                      remove=() if options.keep_remote else removed,
                      rmdir=() if options.keep_remote else (root, f"{runs}/{run_id}"))
    return HostPlan(host, python, workdir, root, target, dirs)


def _slug(host: str) -> str:
    """A host name as one path component (an IPv6 address has colons)."""
    return "".join(c if c.isalnum() or c in ".-_" else "_" for c in host)


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
