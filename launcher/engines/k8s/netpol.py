"""The NetworkPolicy of an export: only the job's own pods reach its task ports.

TensorFlow's server runs whatever graph reaches its port (docs/security.md). Pods of one
namespace reach each other by default; this policy selects the job's pods and admits, to
TensorFlow's port, only pods with the same labels. With ``policyTypes: [Ingress]`` every other
connection to those pods is refused (a network plugin that enforces NetworkPolicy is needed:
Calico, Cilium, ...; without one the object is accepted and does nothing). Pure.
"""

from __future__ import annotations

from typing import Any

from launcher.engines.k8s.pods import PORT, ExportOptions, labels, metadata


def network_policy(options: ExportOptions) -> dict[str, Any]:
    own_pods = {"matchLabels": labels(options)}
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": metadata(options, f"{options.name}-task-ports"),
        "spec": {
            "podSelector": own_pods,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": own_pods}], "ports": [{"protocol": "TCP", "port": PORT}]}],
        },
    }
