"""`tfl export k8s`'s NetworkPolicy: the job's own pods, and only they, reach the task ports."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from launcher.describe.spec import parse_cluster
from launcher.engines.k8s.export import export_k8s
from launcher.engines.k8s.pods import PORT, ExportOptions
from tests.k8s_checks import core_objects, validate_core

CLUSTER = {"cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "evaluator": ["e:2222"]}}


def _labels_match(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def _admitted(policy: dict[str, Any], source: dict[str, str], target: dict[str, str], port: int) -> bool:
    """What Kubernetes decides for a connection from a pod labelled ``source`` (same namespace)."""
    if not _labels_match(policy["spec"]["podSelector"], target):
        return True  # the policy does not select the target
    return any(any(_labels_match(peer["podSelector"], source) for peer in rule["from"])
               and any(p["port"] == port for p in rule["ports"]) for rule in policy["spec"]["ingress"])


@pytest.mark.parametrize("fmt", ["jobset", "tfjob"])
def test_only_the_jobs_own_pods_reach_the_task_port(fmt: str) -> None:
    options = ExportOptions(job="jobs/mnist.py", image="img:1", name="run1", format=fmt, namespace="team-a")
    documents = list(export_k8s(parse_cluster(CLUSTER), options).documents)
    policy = documents[-1]
    assert policy["kind"] == "NetworkPolicy" and policy["metadata"]["namespace"] == "team-a"
    validate_core(policy)  # kubernetes-validate, strict, Kubernetes 1.31
    pods = [o["spec"]["template"]["metadata"]["labels"] if o["kind"] == "Job" else o["metadata"]["labels"]
            for o in core_objects(documents) if o["kind"] in ("Job", "Pod")]
    assert len(pods) == 3 and all(_labels_match(policy["spec"]["podSelector"], p) for p in pods)  # every role selected
    other_job = {**pods[0], "app.kubernetes.io/name": "run2"}
    assert _admitted(policy, pods[1], pods[0], PORT)
    assert not _admitted(policy, other_job, pods[0], PORT)
    assert not _admitted(policy, {}, pods[0], PORT)
    assert not _admitted(policy, pods[1], pods[0], 22)  # nothing else of the pods is opened
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_validation_catches_a_broken_policy() -> None:
    options = ExportOptions(job="jobs/mnist.py", image="img:1", name="run1")
    policy = copy.deepcopy(export_k8s(parse_cluster(CLUSTER), options).documents[-1])
    policy["spec"]["ingress"][0]["ports"][0]["protocl"] = "TCP"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(policy)
