"""The cluster description: what runs where, validated with pydantic.

Pure data. ``parse_cluster`` turns a ``cluster`` description (``launcher.describe.kinds``
tells the kinds apart) into a ``ClusterSpec``, or raises ``ClusterFileError`` whose message
names the file, the field and the fix.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from launcher.contract import CHIEF, RESERVED_PREFIX, TASK_TYPES, WORKER
from launcher.contract import TF_CONFIG as TF_CONFIG_VAR
from launcher.describe.fields import (
    HOST_FIX,
    EnvName,
    EnvValue,
    HostName,
    JumpText,
    PathText,
    UserName,
    describe_error,
    one_line,
    parse_port,
    shown,
    valid_host,
)
from launcher.describe.placement import GpuInputs, Placement, place_gpus
from launcher.describe.ports import free_ports, kernel_port_range
from launcher.errors import ClusterFileError
from launcher.limits import limit_error, own_fault
from launcher.tasks import TaskId, is_local_host, task_ids

MAX_GPUS = 1024  # per host; a count beyond any machine is a typo (and a huge range to build)
MAX_GPU_MEMORY_MB = 16 * 1024 * 1024


@dataclass(frozen=True, order=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def is_local(self) -> bool:
        return is_local_host(self.host)

    @property
    def endpoint(self) -> tuple[str, int]:
        """Equal for two addresses that reach the same socket: hostnames ignore case, IPs are
        compared as numbers, and localhost, 127.0.0.1 and ::1 are all this machine."""
        if self.is_local:
            return ("localhost", self.port)
        address, _, scope = self.host.partition("%")
        try:
            return (ipaddress.ip_address(address).compressed + (f"%{scope}" if scope else ""), self.port)
        except ValueError:
            return (self.host.lower(), self.port)


def parse_address(text: str) -> Address:
    """``host:port`` or ``[v6]:port``; raises ValueError with the fix."""
    match = re.fullmatch(r"\[(?P<v6>[^\]]+)\]:(?P<p1>[^:]*)|(?P<host>[^:\[\]]*):(?P<p2>[^:]*)", text)
    if not match:
        raise ValueError(f"{shown(text)} is not host:port (write e.g. 'localhost:23456', or '[::1]:23456' for IPv6)")
    host = match["v6"] or match["host"] or ""
    if not valid_host(host, bracketed=bool(match["v6"])):
        raise ValueError(f"{shown(text)}: {shown(host)} is not a valid hostname or IP address{HOST_FIX}")
    try:
        port = parse_port(match["p1"] if match["v6"] else match["p2"])
    except ValueError as exc:
        raise ValueError(f"{shown(text)}: {exc}") from None
    return Address(host, port)


def _address(text: str) -> str:
    parse_address(text)
    return text


AddressText = Annotated[str, AfterValidator(_address)]


class _Strict(BaseModel):
    # strict: JSON's true is not 1, "22" is not 22; what validates is what runs.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SSHSettings(_Strict):
    """How to reach a remote host. Every field may be overridden per host."""

    user: UserName | None = Field(None, description="login user (default: the local user / ssh config)")
    port: int = Field(22, ge=1, le=65535, description="sshd port")
    identity_file: PathText | None = Field(None, description="private key file")
    connect_timeout: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False, description="seconds to wait for the connection")
    known_hosts: PathText | None = Field(None, description="known_hosts file (default: ~/.ssh/known_hosts)")
    fence_after: float = Field(30.0, ge=5, le=3600, allow_inf_nan=False,
                               description="seconds without word from tfl after which a host's agent stops its tasks "
                                           "(the fence: nothing of a lost run writes on)")
    firewall: bool = Field(False, description="fence the task ports with an nftables table of the run's own on each "
                                              "host: only the run's hosts reach them (needs nft, and root or "
                                              "passwordless sudo there; docs/security.md)")
    jump: JumpText | None = Field(None, description="a bastion (jump host) the host is reached through, "
                                                    "'[user@]host[:port]' (user default: ssh.user): one connection "
                                                    "to it carries every host behind it, its key is checked against "
                                                    "known_hosts like theirs; 'none': straight, whatever the ssh "
                                                    "config's ProxyJump says (docs/ssh.md#bastions-jump-hosts)")
    config: PathText | None = Field(None, description="the OpenSSH client config whose HostName, User, Port (of a "
                                                      "bastion), IdentityFile and ProxyJump apply (default: "
                                                      "~/.ssh/config, then /etc/ssh/ssh_config)")


class HostSettings(_Strict):
    """Settings for every task on one host."""

    python: PathText | None = Field(None, description="python executable for the tasks (default: the launcher's)")
    workdir: PathText | None = Field(None, description="working directory of the tasks")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description="extra environment for this host's tasks")
    ssh: SSHSettings | None = Field(None, description="overrides of the top-level ssh settings")
    # GPUs (see launcher/describe/placement.py for how they are split among the host's tasks).
    gpus: int | list[int] | None = Field(None, description="the host's GPUs: a count (2 = GPUs 0 and 1) or a list of indices")
    share_gpus: bool = Field(False, description="allow several tasks on one GPU (each gets memory growth or its memory limit)")
    gpu_memory_limit_mb: int | None = Field(None, gt=0, le=MAX_GPU_MEMORY_MB,
                                            description="each task's memory limit in MB on each GPU it sees")

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: object) -> object:
        return check_gpus(value)


def check_gpus(value: object) -> object:
    """A GPU count or a list of distinct indices; JSON's true/1.5/"0" are refused, not coerced."""
    def number(v: object, limit: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= limit
    if value is None or number(value, MAX_GPUS):
        return value
    if isinstance(value, list) and all(number(v, MAX_GPUS - 1) for v in value):
        if len(set(value)) < len(value):
            raise ValueError(f"{shown(str(value))[1:-1]} names a GPU twice; list each index once")
        return value
    raise ValueError(f"{shown(repr(value))[1:-1]} is not a GPU count or a list of GPU indices (write e.g. 2 or [0, 1]); "
                     f"at most {MAX_GPUS} GPUs per host")


class StorageSettings(_Strict):
    """Storage every host sees: each run's model dir (checkpoints, backups, TensorBoard, the
    evaluator's input) goes there, so that restarted tasks and an evaluator on another host
    find what the chief wrote."""

    path: str = Field(description="a directory every host mounts at the same path (e.g. /mnt/shared/tfl), or a URL "
                                  "TensorFlow's file system supports (e.g. gs://bucket/tfl); a run's model dir is "
                                  "<path>/<run id>/model; `tfl doctor` proves a directory is shared")

    k8s_claim: str | None = Field(None, description="tfl export k8s: the PersistentVolumeClaim mounted at `path` in every pod")

    @field_validator("path")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.isprintable() or not (value.startswith("/") or re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", value)):
            raise ValueError(f"{value!r} is neither an absolute directory nor a URL; write e.g. \"/mnt/shared/tfl\" "
                             "(mounted at that path on every host) or \"gs://bucket/tfl\"")
        return value

    @field_validator("k8s_claim")
    @classmethod
    def _claim(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", value):
            raise ValueError(f"{value!r} is not a PersistentVolumeClaim name (lowercase letters, digits, '-' and '.')")
        return value

    @model_validator(mode="after")
    def _claim_is_mounted(self) -> StorageSettings:
        if self.k8s_claim is not None and not self.path.startswith("/"):
            raise ValueError(f"k8s_claim is mounted at path, but path {self.path!r} is a URL; "
                             "remove k8s_claim or give the directory it is mounted at")
        return self


def _check_distinct(addresses: list[Address]) -> None:
    by_endpoint: dict[tuple[str, int], list[Address]] = {}
    for address in addresses:
        by_endpoint.setdefault(address.endpoint, []).append(address)
    for same in by_endpoint.values():
        names = sorted({str(a) for a in same})
        if len(same) > 1 and len(names) == 1:
            raise ValueError(f"{names[0]} is used by more than one task; give each task its own host:port")
        if len(same) > 1:
            raise ValueError(f"{' and '.join(names)} are the same address (hostnames ignore case; localhost, 127.0.0.1 "
                             "and ::1 are all this machine); give each task its own host:port")


class ElasticSettings(_Strict):
    """An elastic run (``tfl launch --min-tasks``): it goes on with fewer training tasks when a
    host is lost, and takes the host back when it returns (``launcher.plan.resize``)."""

    min_tasks: int = Field(ge=1, description="the fewest training tasks, the chief included, the run goes on with")
    global_batch: int | None = Field(None, ge=1, description="the job's global batch (all replicas together), kept "
                                                             "whatever the size (--global-batch)")
    batch: Literal["global", "per-replica"] = Field("global", description="what a resize keeps: the global batch "
                                                                          "(default) or the per-replica batch")
    evaluator_moves_to: list[HostName] | Literal["any"] | None = Field(
        None, description="where the evaluator may move while its host is lost: hosts of training tasks, tried in "
                          "order, or \"any\" (any surviving one); unset: it waits for its host")

    @field_validator("evaluator_moves_to", mode="before")
    @classmethod
    def _any_or_hosts(cls, value: object) -> object:
        if value is None or value == "any" or isinstance(value, list):
            return value
        example = f"[\"{value}\"]" if isinstance(value, str) else "[\"host-b\"]"
        raise ValueError(f"is {json.dumps(value)}; give \"any\" (any surviving host) or a list of hosts, e.g. {example}")


class TaskDevices(_Strict):
    """The devices of one task (``devices.<task>``)."""

    gpus: int | list[int] = Field(description="GPU indices on the task's host (e.g. [0]) or a count of them; 0 or [] = CPU only")
    gpu_memory_limit_mb: int | None = Field(None, gt=0, le=MAX_GPU_MEMORY_MB, description="this task's GPU memory limit in MB")

    @field_validator("gpus", mode="before")
    @classmethod
    def _gpus(cls, value: object) -> object:
        return check_gpus(value)


class Topology(_Strict):
    """Mirrors TF_CONFIG's ``cluster``: task type -> list of host:port."""

    chief: list[AddressText] = Field(default_factory=list, description="at most one host:port")
    worker: list[AddressText] = Field(default_factory=list, description="host:port of each worker")
    evaluator: list[AddressText] = Field(default_factory=list, description="at most one host:port (sidecar evaluator)")

    @field_validator("chief")
    @classmethod
    def _one_chief(cls, entries: list[str]) -> list[str]:
        if len(entries) > 1:
            raise ValueError(f"has {len(entries)} entries; at most one chief is allowed (move the others to cluster.worker)")
        return entries

    @field_validator("evaluator")
    @classmethod
    def _one_evaluator(cls, entries: list[str]) -> list[str]:
        if len(entries) > 1:
            raise ValueError(f"has {len(entries)} entries; at most one evaluator is allowed (remove the others)")
        return entries

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        if not self.chief and not self.worker:
            raise ValueError("no training task; add a 'chief' or at least one 'worker' (e.g. \"chief\": [\"localhost:23456\"])")
        addresses = [parse_address(a) for a in self.chief + self.worker + self.evaluator]
        _check_distinct(addresses)
        kinds = {a.is_local for a in addresses}
        if len(kinds) > 1:
            raise ValueError(
                "mixes local hosts (localhost/127.0.0.1/::1) with remote ones; remote tasks could not reach a "
                "local address: use the machine's real hostname instead of localhost"
            )
        return self

    def addresses(self, task_type: str) -> list[Address]:
        return [parse_address(a) for a in getattr(self, task_type)]

    def tasks(self) -> list[TaskId]:
        """Every task, chief first, evaluator last (the order tasks are started in)."""
        return task_ids({t: len(getattr(self, t)) for t in TASK_TYPES})

    def address(self, task: TaskId) -> Address:
        return parse_address(getattr(self, task.type)[task.index])  # one entry: a plan of T tasks parses T, not T²


class ClusterSpec(_Strict):
    """A cluster description file."""

    kind: ClassVar[str] = "cluster"  # its description kind (launcher.describe.kinds)
    cluster: Topology
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description="extra environment for every task")
    hosts: dict[HostName, HostSettings] = Field(default_factory=dict, description="per-host settings, keyed by host")
    ssh: SSHSettings = Field(default_factory=SSHSettings, description="defaults for hosts reached over SSH")
    devices: dict[str, TaskDevices] = Field(default_factory=dict, description="per-task devices, keyed by task (e.g. \"worker:1\")")
    storage: StorageSettings | None = Field(None, description="shared storage for the runs' model dirs; needed when "
                                                              "tasks on several hosts restart or an evaluator runs on "
                                                              "another host than the chief")
    elastic: ElasticSettings | None = Field(None, description="go on with fewer training tasks when a host is lost "
                                                              "(like tfl launch --min-tasks)")
    _placement: Placement = PrivateAttr(default_factory=lambda: Placement({}))

    @model_validator(mode="after")
    def _hosts_known(self) -> ClusterSpec:
        used = {a.host for t in TASK_TYPES for a in self.cluster.addresses(t)}
        unknown = sorted(set(self.hosts) - used)
        if unknown:
            raise ValueError(f"hosts.{unknown[0]} names a host no task runs on (tasks run on: {', '.join(sorted(used))}); "
                             "fix its spelling or remove it")
        relative = [(h, s.workdir) for h, s in self.hosts.items()
                    if s.workdir and not s.workdir.startswith("/") and (not is_local_host(h) or s.ssh is not None)]
        if relative:  # the host would make it under its login dir, and the job's path would name it twice
            raise ValueError(f"hosts.{relative[0][0]}.workdir: '{relative[0][1]}' is not an absolute path, which an SSH "
                             "host's working dir must be ('~' is not expanded there); write it whole, e.g. /srv/tfl, or "
                             "leave it out for the run's own dir on the host")
        keys = [*self.env, *(k for h in self.hosts.values() for k in h.env)]
        reserved = sorted(k for k in keys if k == TF_CONFIG_VAR or k.startswith(RESERVED_PREFIX))
        if reserved:
            raise ValueError(f"env sets {reserved[0]}, which tfl sets for each task; remove it")
        return self

    @model_validator(mode="after")
    def _evaluator_may_move(self) -> ClusterSpec:
        moves_to = self.elastic.evaluator_moves_to if self.elastic else None
        if not moves_to:
            return self
        if not self.cluster.evaluator:
            raise ValueError("elastic.evaluator_moves_to: the cluster has no evaluator to move; remove it or add "
                             "cluster.evaluator")
        training = {a.host for t in (CHIEF, WORKER) for a in self.cluster.addresses(t)}
        odd = [h for h in moves_to if h not in training] if isinstance(moves_to, list) else []
        if odd:
            raise ValueError(f"elastic.evaluator_moves_to names {odd[0]}, where no training task runs (they run on: "
                             f"{', '.join(sorted(training))}); name one of those hosts, or \"any\"")
        return self

    @model_validator(mode="after")
    def _devices_fit(self) -> ClusterSpec:
        # Placed once, here, so that a contradiction is reported with the file; the plan reads it.
        hosts = {t: [a.host for a in self.cluster.addresses(t)] for t in TASK_TYPES}  # parsed once: O(tasks)
        tasks = [(t, hosts[t.type][t.index]) for t in self.cluster.tasks()]
        self._placement = place_gpus(GpuInputs(tasks=tasks, hosts=self.hosts, devices=self.devices, env=self.env))
        return self

    @property
    def placement(self) -> Placement:
        """Which GPUs each task sees (see ``launcher.describe.placement``)."""
        return self._placement

    def host(self, name: str) -> HostSettings:
        return self.hosts.get(name, HostSettings())


def load_cluster(path: Path) -> ClusterSpec:
    """A description with a ``cluster`` block, for the commands that need hosts (doctor, export)."""
    from launcher.describe.kinds import load_description

    spec = load_description(path)
    if not isinstance(spec, ClusterSpec):
        raise ClusterFileError(f"{path}: a '{spec.kind}' description has no hosts of its own for this command; give a file "
                               f"with a 'cluster' block, or launch it with `tfl launch JOB --cluster {path}`")
    return spec


def parse_cluster(data: Any, name: str = "cluster") -> ClusterSpec:
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise ClusterFileError(one_line(f"{name}: {describe_error(exc, ClusterSpec)}")) from None


def local_cluster(workers: int, evaluator: bool = False) -> ClusterSpec:
    """``--local N``: a chief and N-1 workers (plus an evaluator) on free localhost ports."""
    if workers < 1:
        raise ClusterFileError(f"--local {workers}: needs at least 1 training task (e.g. --local 2)")
    count = workers + int(evaluator)
    low, high = kernel_port_range()
    if count > high - low + 1:
        raise ClusterFileError(f"--local {workers}: {count} tasks need {count} ports, and this machine hands out "
                               f"{high - low + 1} (net.ipv4.ip_local_port_range {low}-{high}); give fewer tasks")
    try:
        ports = free_ports(count)
    except OSError as exc:  # out of descriptors, or fewer free ports than tasks: one line, not a traceback
        fault = own_fault(exc)
        if fault is not None:
            raise limit_error(fault, f"holding {count} free ports for --local {workers}") from None
        raise ClusterFileError(f"--local {workers}: this machine has no {count} free ports for the tasks "
                               f"({exc.strerror}); give fewer tasks, or a cluster file") from None
    addr = [f"127.0.0.1:{p}" for p in ports]
    topology: dict[str, list[str]] = {"chief": addr[:1], "worker": addr[1:workers]}
    if evaluator:
        topology["evaluator"] = addr[workers:]
    return parse_cluster({"cluster": topology}, "--local")

