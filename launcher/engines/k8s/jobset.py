"""The cluster as a JobSet (``jobset.x-k8s.io/v1alpha2``) and the ConfigMap with its entry shim.

One replicated job per role (``chief``, ``worker``, ``evaluator``), each a single Indexed Job
with one pod per task. JobSet gives every pod a stable DNS name,
``<jobset>-<role>-0-<index>.<jobset>``; tfl builds the TF_CONFIG of each role with those names
as hosts, and the entry shim (launcher/engines/k8s/node/entry.py) picks the pod's own.

- ``failurePolicy.maxRestarts``: any training pod that fails fails its Job (``backoffLimit: 0``)
  and JobSet recreates the whole group, as MultiWorkerMirroredStrategy needs.
- Preemption: a training pod that exits ``contract.PREEMPTED_EXIT_CODE`` (170: the job kit saved
  the agreed checkpoint after SIGTERM), or that Kubernetes disrupted (the pod condition
  ``DisruptionTarget``: preemption, eviction, a node drain), fails its Job through the Job's
  ``podFailurePolicy`` (``FailJob``: reason ``PodFailurePolicy``), and the JobSet rule
  ``preempted`` restarts the group with ``RestartJobSetAndIgnoreMaxRestarts``: not counted
  against maxRestarts, and not capped either. Every other failure takes the default action
  (``RestartJobSet``, counted).
- ``successPolicy``: the chief's Job (the workers' when there is no chief, worker 0 being chief
  then). The evaluator never decides: its shim exits 0 whatever the job returns, and JobSet
  deletes it once the JobSet has succeeded. An evaluator pod told to go (its shim exits 143)
  or disrupted is made again by its Job (``podFailurePolicy``: ``Ignore``), never counted.
"""

from __future__ import annotations

import json
import posixpath
import signal
from importlib import resources
from typing import Any

from launcher import contract
from launcher.describe.spec import ClusterSpec, Topology
from launcher.engines.k8s.node import entry
from launcher.engines.k8s.pods import (
    CONTAINER,
    PORT,
    PYTHON,
    ExportOptions,
    Role,
    base_env,
    container,
    env_list,
    grace,
    job_command,
    labels,
    metadata,
    storage_volume,
)
from launcher.errors import ExportError
from launcher.plan.tfconfig import tf_config
from launcher.tasks import TaskId

API_VERSION = "jobset.x-k8s.io/v1alpha2"
ROLE_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"  # set by JobSet on every pod
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"  # 0, then 1, 2, ... after each group restart
ENTRY_DIR = "/etc/tfl"
MAX_INDEXED_PODS = 100_000  # Kubernetes' limit on an Indexed Job's completions and parallelism
PREEMPTED_RULE = "preempted"  # the JobSet failure policy rule for a group that was preempted
POD_FAILURE_POLICY_REASON = "PodFailurePolicy"  # a Job's failure reason when a podFailurePolicy rule failed it


def pod_hostname(name: str, role: str, index: int) -> str:
    """The pod of task ``role:index``: job 0 of replicated job ``role``, completion index ``index``."""
    return f"{name}-{role}-0-{index}"


def check_roles(roles: list[Role]) -> None:
    for role in roles:
        if role.count > MAX_INDEXED_PODS:
            raise ExportError(f"cluster.{role.name} has {role.count} tasks; a JobSet runs a role as one Indexed Job, "
                              f"which Kubernetes limits to {MAX_INDEXED_PODS} pods")


def dns_topology(name: str, roles: list[Role]) -> Topology:
    """The cluster as its pods see each other (the JobSet's headless Service is named after it)."""
    hosts = {r.name: [f"{pod_hostname(name, r.name, i)}.{name}:{PORT}" for i in range(r.count)] for r in roles}
    return Topology.model_validate(hosts)


def tf_config_table(name: str, roles: list[Role]) -> dict[str, Any]:
    """tfl's TF_CONFIG for index 0 of each role; the shim puts in the pod's own index."""
    topology = dns_topology(name, roles)
    return {r.name: tf_config(topology, TaskId(r.name, 0)) for r in roles}


def pod_tf_configs(name: str, roles: list[Role]) -> dict[str, str]:
    """The TF_CONFIG the shim gives the last pod of each role (the longest index), as it writes it."""
    table = tf_config_table(name, roles)
    return {f"{r.name}:{r.count - 1}": entry.tf_config_for(table, r.name, r.count - 1) for r in roles}


def entry_config_map(options: ExportOptions, roles: list[Role]) -> dict[str, Any]:
    source = resources.files("launcher.engines.k8s.node").joinpath("entry.py").read_text()
    rows = [f" {json.dumps(role)}: {json.dumps(config)}" for role, config in tf_config_table(options.name, roles).items()]
    table = "{\n" + ",\n".join(rows) + "\n}\n"  # one role's TF_CONFIG per line
    return {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata(options, config_map_name(options)),
        "data": {"entry.py": source, entry.CONFIG_FILE: table},
    }


def config_map_name(options: ExportOptions) -> str:
    return f"{options.name}-tfl-entry"


def jobset(spec: ClusterSpec, options: ExportOptions, roles: list[Role]) -> dict[str, Any]:
    target = "chief" if any(r.name == "chief" for r in roles) else "worker"
    return {
        "apiVersion": API_VERSION, "kind": "JobSet", "metadata": metadata(options),
        "spec": {
            "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [target]},
            "failurePolicy": {"maxRestarts": options.max_restarts, "rules": [preempted_rule(roles)]},
            "replicatedJobs": [replicated_job(spec, options, role) for role in roles],
        },
    }


def preempted_rule(roles: list[Role]) -> dict[str, Any]:
    """A training Job failed by its pod failure policy (a preempted pod): restart the group, uncounted."""
    return {"name": PREEMPTED_RULE, "action": "RestartJobSetAndIgnoreMaxRestarts",
            "onJobFailureReasons": [POD_FAILURE_POLICY_REASON],
            "targetReplicatedJobs": [r.name for r in roles if r.name != "evaluator"]}


def pod_failure_policy() -> dict[str, Any]:
    """A training pod that saved and left on a notice (170), or that Kubernetes disrupted, fails its
    Job with reason PodFailurePolicy (see ``preempted_rule``); others count against backoffLimit (0)."""
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                              "values": [contract.PREEMPTED_EXIT_CODE]}},
        {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


def evaluator_failure_policy() -> dict[str, Any]:
    """The evaluator's pod, told to go (its shim exits 128 + SIGTERM) or disrupted: made again,
    not counted; its job's own failures end in exit 0 (the shim), so its Job never fails the group."""
    return {"rules": [
        {"action": "Ignore", "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                             "values": [128 + signal.SIGTERM]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


def replicated_job(spec: ClusterSpec, options: ExportOptions, role: Role) -> dict[str, Any]:
    sidecar = role.name == "evaluator"
    command = [PYTHON, f"{ENTRY_DIR}/entry.py", *(["--sidecar"] if sidecar else []), "--", *job_command(options)]
    env = env_list(base_env(spec, options, role), {entry.ROLE_ENV: ROLE_LABEL, contract.ATTEMPT: RESTART_LABEL})
    volumes, mounts = storage_volume(spec)
    entry_volume = {"name": "tfl-entry", "configMap": {"name": config_map_name(options)}}
    entry_mount = {"name": "tfl-entry", "mountPath": ENTRY_DIR, "readOnly": True}
    pod = {
        "metadata": {"labels": labels(options)},
        "spec": {
            "restartPolicy": "Never",  # also what a podFailurePolicy needs
            "shareProcessNamespace": True,  # see pods.container
            **grace(options),
            "containers": [container(options, role, command, env, [entry_mount, *mounts], "tf-grpc")],
            "volumes": [entry_volume, *volumes],
        },
    }
    job_spec = {
        "parallelism": role.count, "completions": role.count, "completionMode": "Indexed",
        # A training pod's failure fails the group (JobSet restarts it); the evaluator's pod
        # is made again on its own when it is told to go or lost (its job's own failures end in exit 0).
        "backoffLimit": options.max_restarts if sidecar else 0,
        "podFailurePolicy": evaluator_failure_policy() if sidecar else pod_failure_policy(),
        "template": pod,
    }
    return {"name": role.name, "replicas": 1, "template": {"metadata": {"labels": labels(options)}, "spec": job_spec}}


def check_storage_mount(spec: ClusterSpec) -> None:
    """The claim cannot go where the shim's ConfigMap is mounted: the same path twice hides one of
    them, and a path inside it cannot be made (the ConfigMap's volume is read-only)."""
    if spec.storage is None or spec.storage.k8s_claim is None:
        return
    path = posixpath.normpath(spec.storage.path)
    if path == ENTRY_DIR or path.startswith(f"{ENTRY_DIR}/"):
        raise ExportError(f"storage.path {spec.storage.path}: the JobSet pods mount tfl's entry shim at {ENTRY_DIR} "
                          "(read-only), so the claim cannot be mounted there; mount it elsewhere, e.g. /mnt/shared")


def jobset_manifests(spec: ClusterSpec, options: ExportOptions, roles: list[Role]) -> list[dict[str, Any]]:
    check_roles(roles)
    check_storage_mount(spec)
    return [entry_config_map(options, roles), jobset(spec, options, roles)]
