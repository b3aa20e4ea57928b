"""What every pod of an export shares, whatever the format: roles, names, environment, volumes.

Pure: a ``ClusterSpec`` and the export options in, plain dicts (Kubernetes objects) out.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher import contract
from launcher.contract import TASK_TYPES
from launcher.describe.fields import MAX_ENV_STRING
from launcher.describe.placement import VISIBLE_DEVICES
from launcher.describe.spec import ClusterSpec
from launcher.errors import ExportError
from launcher.tasks import TaskId

FORMATS = ("jobset", "tfjob")
CONTAINER = "tensorflow"  # the TFJob operator injects TF_CONFIG only into a container of this name
PORT = 2222  # every pod has its own address, so all tasks use TensorFlow's usual port
PYTHON = "python3"
GPU_RESOURCE = "nvidia.com/gpu"
MAX_NAME = 63
MAX_GRACE = 31_536_000  # a year: far beyond what a preemption notice gives  # a DNS label: pod hostnames, Job and Service names
_DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # RFC 1035, as Services and TFJobs require
_DNS_1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # RFC 1123, as namespaces require: may start with a digit
_HOST_SETTINGS_IGNORED = ("python", "workdir", "env", "ssh", "share_gpus", "gpu_memory_limit_mb")


@dataclass(frozen=True)
class ExportOptions:
    """The command line of `tfl export k8s`, checked by ``check_options``."""

    job: str
    image: str
    name: str
    job_args: tuple[str, ...] = ()
    format: str = "jobset"
    namespace: str | None = None
    max_restarts: int = 0
    termination_grace: int | None = None  # terminationGracePeriodSeconds: the notice (SIGTERM) to SIGKILL; None: Kubernetes' 30


@dataclass(frozen=True)
class Role:
    """One task type of the cluster as Kubernetes runs it: ``count`` pods from one template."""

    name: str  # chief | worker | evaluator
    count: int
    gpus: int | None  # nvidia.com/gpu per pod; 0 = hidden from the GPUs; None = the cluster file says nothing


def check_options(options: ExportOptions) -> None:
    if options.format not in FORMATS:
        raise ExportError(f"--format {options.format}: choose {' or '.join(FORMATS)}")
    if not options.image or any(c.isspace() for c in options.image):
        raise ExportError(f"--image {options.image!r}: give the container image, e.g. registry.example.com/train:1")
    check_dns_label(options.name, "--name")
    if options.namespace is not None:
        check_namespace(options.namespace)
    if options.max_restarts < 0:
        raise ExportError(f"--max-restarts {options.max_restarts}: give 0 or more")
    if options.termination_grace is not None and not 0 <= options.termination_grace <= MAX_GRACE:
        raise ExportError(f"--termination-grace {options.termination_grace}: give the seconds from the notice to SIGKILL, "
                          f"0 to {MAX_GRACE} (e.g. 120: time for the agreed checkpoint)")


def check_dns_label(value: str, option: str) -> None:
    if len(value) > MAX_NAME or not _DNS_LABEL.fullmatch(value):
        raise ExportError(f"{option} {value!r} is not a DNS label: use at most {MAX_NAME} lowercase letters, "
                          "digits and '-', starting with a letter and ending with a letter or digit (e.g. mnist-1)")


def check_namespace(value: str) -> None:
    if len(value) > MAX_NAME or not _DNS_1123_LABEL.fullmatch(value):
        raise ExportError(f"--namespace {value!r} is not a DNS label: use at most {MAX_NAME} lowercase letters, "
                          "digits and '-', starting and ending with a letter or digit (e.g. ml-team)")


def default_name(job: str, stamp: str) -> str:
    """The job's file name made a DNS label, plus a time stamp (each export is a new run)."""
    stem = job.rsplit("/", 1)[-1].removesuffix(".py").lower()
    stem = re.sub(r"[^a-z0-9]+", "-", stem).lstrip("-0123456789")[:24].strip("-")
    return f"{stem or 'tfl'}-{stamp}"


def roles_of(spec: ClusterSpec) -> list[Role]:
    """Each task type with tasks, with the GPUs every one of its pods gets."""
    placement = spec.placement  # placed once, when the cluster file was read
    roles = []
    for kind in TASK_TYPES:
        tasks = [TaskId(kind, i) for i in range(len(getattr(spec.cluster, kind)))]
        if not tasks:
            continue
        counts = {len(placement.tasks[t].gpus) if t in placement.tasks else None for t in tasks}
        if len(counts) > 1:
            seen = ", ".join(f"{t}: {len(placement.tasks[t].gpus) if t in placement.tasks else 'unset'}" for t in tasks)
            raise ExportError(f"devices: the {kind} tasks have different GPUs ({seen}); Kubernetes gives every pod "
                              "of a role the same limits: give each the same count (hosts.<h>.gpus / devices)")
        roles.append(Role(kind, len(tasks), counts.pop()))
    return roles


def ignored_settings(spec: ClusterSpec) -> list[str]:
    """The cluster file's settings that mean nothing on Kubernetes (the image and the pods replace them)."""
    ignored = ["ssh"] if "ssh" in spec.model_fields_set else []
    for host, settings in spec.hosts.items():
        ignored += [f"hosts.{host}.{key}" for key in _HOST_SETTINGS_IGNORED if key in settings.model_fields_set]
    ignored += [f"devices.{task}.gpu_memory_limit_mb" for task, d in spec.devices.items() if d.gpu_memory_limit_mb]
    return ignored


def run_dir(spec: ClusterSpec, name: str) -> str | None:
    """Where the run's model dir goes: the shared storage's ``NAME`` directory (a URL passes through)."""
    return None if spec.storage is None else f"{spec.storage.path.rstrip('/')}/{name}"


def base_env(spec: ClusterSpec, options: ExportOptions, role: Role) -> dict[str, str]:
    """Every container's environment, as a local run's but for what only a local run has."""
    env = {
        **spec.env,
        # tf_keras, not Keras 3: Keras 3 fails under MultiWorkerMirroredStrategy (keras-team/keras#20585).
        contract.LEGACY_KERAS: "1",
        "PYTHONUNBUFFERED": "1",
        contract.RUN_ID: options.name,
        **({contract.EVALUATOR_IN_RUN: "1"} if spec.cluster.evaluator else {}),
    }
    directory = run_dir(spec, options.name)
    if directory is not None:
        env[contract.RUN_DIR] = directory
    if role.gpus == 0:  # a task the cluster file keeps off the GPUs stays off them
        env[VISIBLE_DEVICES] = ""
    return env


def env_list(env: dict[str, str], from_labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A container's ``env``: plain values, then values the downward API reads from pod labels."""
    entries: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items()]
    for key, label in (from_labels or {}).items():
        entries.append({"name": key, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{label}']"}}})
    return entries


def storage_volume(spec: ClusterSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The shared storage's claim as (volumes, volumeMounts), mounted at its own path; none for a URL."""
    if spec.storage is None or spec.storage.k8s_claim is None:
        return [], []
    volume = {"name": "shared", "persistentVolumeClaim": {"claimName": spec.storage.k8s_claim}}
    return [volume], [{"name": "shared", "mountPath": spec.storage.path}]


def grace(options: ExportOptions) -> dict[str, Any]:
    """A pod spec's ``terminationGracePeriodSeconds``, when the export sets it: the time the job
    kit has, from the kubelet's SIGTERM (eviction, preemption, deletion), for the agreed checkpoint."""
    return {} if options.termination_grace is None else {"terminationGracePeriodSeconds": options.termination_grace}


def container(options: ExportOptions, role: Role, command: list[str], env: list[dict[str, Any]],
              mounts: list[dict[str, Any]], port_name: str) -> dict[str, Any]:
    """The one container of a task's pod. Its pod shares one process namespace (``shareProcessNamespace``)
    so that the job is not PID 1: PID 1 ignores a signal it has no handler for, so a job without the
    kit's SIGTERM handler (which saves the agreed checkpoint and exits 170) would wait out the grace period."""
    body: dict[str, Any] = {
        "name": CONTAINER, "image": options.image, "command": command, "env": env,
        "ports": [{"name": port_name, "containerPort": PORT}],
    }
    if role.gpus:
        body["resources"] = {"limits": {GPU_RESOURCE: role.gpus}}
    if mounts:
        body["volumeMounts"] = mounts
    return body


def job_command(options: ExportOptions) -> list[str]:
    return [PYTHON, "-u", options.job, *options.job_args]


def labels(options: ExportOptions) -> dict[str, str]:
    return {"app.kubernetes.io/name": options.name, "app.kubernetes.io/managed-by": "tfl"}


def metadata(options: ExportOptions, name: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name or options.name}
    if options.namespace is not None:
        meta["namespace"] = options.namespace
    meta["labels"] = labels(options)
    return meta


def check_pod_names(roles: list[Role], pod_name: Callable[[str, int], str], fmt: str) -> None:
    """Every pod's name (its DNS label) must fit 63 characters; the last index is the longest."""
    for role in roles:
        name = pod_name(role.name, role.count - 1)
        if len(name) > MAX_NAME:
            raise ExportError(f"--name: the {fmt} pod name {name!r} of {role.name}:{role.count - 1} has {len(name)} "
                              f"characters and Kubernetes allows {MAX_NAME}; shorten --name by {len(name) - MAX_NAME} "
                              f"or run fewer {role.name} tasks")


def check_tf_config_size(configs: dict[str, str], fmt: str) -> None:
    """Each role's longest TF_CONFIG (its last pod's, as JSON, keyed by that task) must fit one
    environment string: Linux starts no process given a longer one (E2BIG), so the pod's job never runs."""
    for task, text in configs.items():
        size = len(f"{contract.TF_CONFIG}={text}".encode()) + 1
        if size > MAX_ENV_STRING:
            raise ExportError(f"cluster: the {fmt} pod of {task} would get a TF_CONFIG of {size} bytes, and Linux starts no "
                              f"process with an environment variable over {MAX_ENV_STRING} (the pod's job could never "
                              "start); run fewer tasks, or give a shorter --name")
