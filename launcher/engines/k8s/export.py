"""`tfl export k8s`: check the options and the cluster, build one format's objects, render them.

Nothing is written before every check has passed: a refused export leaves no file behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from launcher.describe.spec import ClusterSpec
from launcher.engines.k8s import jobset, tfjob
from launcher.engines.k8s.netpol import network_policy
from launcher.engines.k8s.pods import (
    ExportOptions,
    check_options,
    check_pod_names,
    check_tf_config_size,
    ignored_settings,
    roles_of,
)
from launcher.engines.k8s.render import render_yaml
from launcher.errors import ExportError

_NEEDS = {
    "jobset": "JobSet (jobset.x-k8s.io/v1alpha2, v0.9 or later)",
    "tfjob": "Kubeflow's training operator (kubeflow.org/v1 TFJob, v1.9)",
}


@dataclass(frozen=True)
class Export:
    """The manifests as YAML, the objects themselves, and the warnings for the user."""

    text: str
    documents: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]


def export_k8s(spec: ClusterSpec, options: ExportOptions) -> Export:
    """Raises ExportError, with the option or field and the fix, when the format cannot express it."""
    check_options(options)
    roles = roles_of(spec)
    if options.format == "jobset":
        check_pod_names(roles, partial(jobset.pod_hostname, options.name), "JobSet")
        check_tf_config_size(jobset.pod_tf_configs(options.name, roles), "JobSet")
        documents = jobset.jobset_manifests(spec, options, roles)
    else:
        check_pod_names(roles, partial(tfjob.pod_name, options.name), "TFJob")
        check_tf_config_size(tfjob.operator_tf_configs(options, roles), "TFJob")
        documents = tfjob.tfjob_manifests(spec, options, roles)
    documents = [*documents, network_policy(options)]  # only the job's own pods reach its task ports
    header = (f"Written by `tfl export k8s --format {options.format}`; apply with `kubectl apply -f FILE`.\n"
              f"Needs {_NEEDS[options.format]} in the cluster; see docs/kubernetes.md.")
    return Export(render_yaml(documents, header), tuple(documents), tuple(export_warnings(spec, options)))


def export_warnings(spec: ClusterSpec, options: ExportOptions) -> list[str]:
    warnings = []
    ignored = ignored_settings(spec)
    if ignored:
        warnings.append(f"ignored on Kubernetes, where the image and the pods replace them: {', '.join(ignored)}")
    if spec.elastic is not None:
        warnings.append("elastic: not carried into the manifests, which run the group at its full size; on Kubernetes "
                        "a lost pod is made again at the same size (docs/kubernetes.md, Elastic runs)")
    if spec.storage is None and (spec.cluster.evaluator or options.max_restarts):
        warnings.append("no shared storage in the cluster file: each pod keeps its model dir on its own disk, so the "
                        "evaluator sees no checkpoint and a restart starts over; add "
                        "\"storage\": {\"path\": \"/mnt/shared\", \"k8s_claim\": \"<claim>\"}")
    if options.format == "tfjob" and options.max_restarts:
        warnings.append(f"--max-restarts {options.max_restarts} becomes the TFJob's backoffLimit, which training-operator "
                        "does not apply under restartPolicy ExitCode: exit codes 128-255 (a preemption's 170 among them) "
                        "are retried without limit and 1-127 fail the TFJob; use --format jobset for a cap")
    if spec.storage is not None and not spec.storage.path.startswith("/"):
        warnings.append(f"storage.path {spec.storage.path} reaches the pods as TFL_RUN_DIR, unmounted; tfl's job kit "
                        "writes through local paths today, so its jobs need a mounted path (k8s_claim) for now")
    return warnings


def write_manifests(path: Path, text: str) -> None:
    """All or nothing: a temp file beside ``path``, then renamed over it."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ExportError(f"-o {path}: cannot write there: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise ExportError(f"-o {path}: cannot write there: {exc.strerror}") from None
