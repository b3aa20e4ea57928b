"""The cluster as a Kubeflow TFJob (``kubeflow.org/v1``, training-operator 1.9).

The operator makes one pod and one Service per task, named ``<tfjob>-<role>-<index>``, and
writes TF_CONFIG itself into the container named ``tensorflow``: its cluster lists every
role, the evaluator included, for every task (TensorFlow's strategies leave the evaluator
out of training), plus ``"environment": "cloud"``. So no entry shim here.

- ``restartPolicy: ExitCode``: a pod that exits with 128-255 (a signal, or 170: the job kit
  saved the agreed checkpoint on a preemption notice) is deleted and made again, alone; one
  with 1-127 (the code's own error) fails the TFJob. ``backoffLimit`` does not cap those
  retries: the operator (``core.PastBackoffLimit``) sums the container restart counts of
  running pods, and a pod made again starts at 0 (ExitCode pods run with restartPolicy Never).
  So 170 is retried without counting, and so is every other code from 128 to 255, without
  limit; ``export_warnings`` says so when --max-restarts is given.
- ``cleanPodPolicy: None``: the evaluator's pod is not killed when the chief finishes
  (kubeflow/trainer#1658), so it can evaluate the last checkpoint.
"""

from __future__ import annotations

import json
from typing import Any

from launcher.describe.spec import ClusterSpec
from launcher.engines.k8s.pods import (
    PORT,
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

API_VERSION = "kubeflow.org/v1"
REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "evaluator": "Evaluator"}
PORT_NAME = "tfjob-port"  # the operator reads the task port from this container port


def pod_name(name: str, role: str, index: int) -> str:
    return f"{name}-{role}-{index}"


def operator_tf_configs(options: ExportOptions, roles: list[Role]) -> dict[str, str]:
    """The TF_CONFIG the operator gives the last pod of each role: every role's Services, named
    ``<pod>.<namespace>.svc:<port>`` (a custom cluster domain makes them longer still), the
    evaluator included, and ``"environment": "cloud"``."""
    namespace = options.namespace or "default"
    cluster = {r.name: [f"{pod_name(options.name, r.name, i)}.{namespace}.svc:{PORT}" for i in range(r.count)]
               for r in roles}
    return {f"{r.name}:{r.count - 1}": json.dumps({"cluster": cluster, "task": {"type": r.name, "index": r.count - 1},
                                "environment": "cloud"}, separators=(",", ":")) for r in roles}


def check_roles(roles: list[Role]) -> None:
    """The operator's own rule (its admission webhook): at most one Chief."""
    for role in roles:
        if role.name == "chief" and role.count > 1:
            raise ExportError(f"cluster.chief has {role.count} tasks; a TFJob has at most one Chief "
                              "(move the others to cluster.worker)")


def replica_spec(spec: ClusterSpec, options: ExportOptions, role: Role) -> dict[str, Any]:
    volumes, mounts = storage_volume(spec)
    env = env_list(base_env(spec, options, role))
    pod: dict[str, Any] = {
        "shareProcessNamespace": True,  # see pods.container
        **grace(options),
        "containers": [container(options, role, job_command(options), env, mounts, PORT_NAME)],
    }
    if volumes:
        pod["volumes"] = volumes
    return {
        "replicas": role.count,
        "restartPolicy": "ExitCode",
        "template": {"metadata": {"labels": labels(options)}, "spec": pod},
    }


def tfjob_manifests(spec: ClusterSpec, options: ExportOptions, roles: list[Role]) -> list[dict[str, Any]]:
    check_roles(roles)
    return [{
        "apiVersion": API_VERSION, "kind": "TFJob", "metadata": metadata(options),
        "spec": {
            "runPolicy": {"backoffLimit": options.max_restarts, "cleanPodPolicy": "None"},
            "tfReplicaSpecs": {REPLICA_TYPES[r.name]: replica_spec(spec, options, r) for r in roles},
        },
    }]
