"""Offline checks of generated Kubernetes manifests: upstream CRD schemas, operator rules, core kinds.

- Custom resources (JobSet, TFJob) against the upstream CRD's ``openAPIV3Schema`` from
  ``../shared/k8s-crds/`` (see its README), closed with ``additionalProperties: false`` the way
  strict field validation on the API server rejects an unknown field.
- The rules those schemas do not carry (the TFJob operator's, JobSet's webhook's).
- Core kinds (ConfigMap, Job, Pod) with ``kubernetes-validate`` in strict mode for a pinned
  Kubernetes version; a kind it has no schema for raises, so it can never pass unseen.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT

CRD_DIR = ROOT.parent / "shared" / "k8s-crds"
CRD_FILES = {"JobSet": "jobset.x-k8s.io_jobsets.yaml", "TFJob": "kubeflow.org_tfjobs.yaml"}
KUBERNETES_VERSION = "1.31"  # JobSet v0.9 and training-operator v1.9 both run on it
TFJOB_RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
TFJOB_CLEAN_POD_POLICIES = ("All", "Running", "None")
TFJOB_SUCCESS_POLICIES = ("", "AllWorkers")
JOBSET_RULE_NAME = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")  # the CRD's description of a rule's name


def need_crds() -> Path:
    """The CRD directory; skip without it, except under CI=true, where that is a failure."""
    if not CRD_DIR.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CRD_DIR} is missing; CI must have ../shared/k8s-crds beside the clone")
        pytest.skip(f"{CRD_DIR} is missing (upstream CRDs for the schema checks)")
    return CRD_DIR


def close_objects(schema: Any) -> Any:
    """A copy where every object schema that lists ``properties`` and does not preserve unknown
    fields refuses any other key (``additionalProperties: false``)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@functools.cache
def crd_schema(kind: str, api_version: str, closed: bool = True) -> Any:
    crd = yaml.load((need_crds() / CRD_FILES[kind]).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert crd["spec"]["names"]["kind"] == kind
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = served["schema"]["openAPIV3Schema"]
    return close_objects(schema) if closed else schema


def validate_custom(document: dict[str, Any], closed: bool = True) -> None:
    """Raises jsonschema.ValidationError when the CRD's schema refuses the object."""
    schema = crd_schema(document["kind"], document["apiVersion"], closed)
    jsonschema.Draft7Validator(schema).validate(document)


def validate_core(document: dict[str, Any]) -> None:
    """Raises kubernetes_validate's ValidationError, or SchemaNotFoundError for a kind it lacks."""
    kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def tfjob_rule_violations(tfjob: dict[str, Any]) -> list[str]:
    """What training-operator v1.9 refuses although its CRD schema lets it through."""
    problems = []
    specs = tfjob["spec"]["tfReplicaSpecs"]
    chiefs = sum(spec.get("replicas", 1) for kind, spec in specs.items() if kind in ("Chief", "Master"))
    if chiefs > 1:
        problems.append(f"{chiefs} Chief/Master replicas; at most one")
    for kind, spec in specs.items():
        names = [c["name"] for c in spec["template"]["spec"]["containers"]]
        if names.count("tensorflow") != 1:
            problems.append(f"{kind}: containers {names}; exactly one must be named tensorflow")
        if spec.get("restartPolicy", "Never") not in TFJOB_RESTART_POLICIES:
            problems.append(f"{kind}: restartPolicy {spec['restartPolicy']!r}")
    run_policy = tfjob["spec"].get("runPolicy", {})
    if run_policy.get("cleanPodPolicy", "None") not in TFJOB_CLEAN_POD_POLICIES:
        problems.append(f"cleanPodPolicy {run_policy['cleanPodPolicy']!r}")
    if tfjob["spec"].get("successPolicy", "") not in TFJOB_SUCCESS_POLICIES:
        problems.append(f"successPolicy {tfjob['spec']['successPolicy']!r}")
    return problems


def jobset_rule_violations(jobset: dict[str, Any]) -> list[str]:
    """What JobSet's webhook (and the entry shim) need beyond the schema."""
    problems = []
    names = [r["name"] for r in jobset["spec"]["replicatedJobs"]]
    for target in jobset["spec"].get("successPolicy", {}).get("targetReplicatedJobs", []):
        if target not in names:
            problems.append(f"successPolicy names {target!r}, not one of {names}")
    for rjob in jobset["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        if job.get("completionMode") != "Indexed":
            problems.append(f"{rjob['name']}: not an Indexed Job (no JOB_COMPLETION_INDEX for the shim)")
        host = f"{jobset['metadata']['name']}-{rjob['name']}-{rjob.get('replicas', 1) - 1}-{job['parallelism'] - 1}"
        if len(host) > 63:
            problems.append(f"{rjob['name']}: pod hostname {host!r} is longer than 63")
        problems += pod_failure_policy_violations(rjob["name"], job)
    for rule in jobset["spec"].get("failurePolicy", {}).get("rules", []):
        if not JOBSET_RULE_NAME.fullmatch(rule["name"]):
            problems.append(f"failurePolicy rule name {rule['name']!r} is not allowed")
        problems += [f"failurePolicy rule {rule['name']} names {t!r}, not one of {names}"
                     for t in rule.get("targetReplicatedJobs", []) if t not in names]
    return problems


def pod_failure_policy_violations(name: str, job: dict[str, Any]) -> list[str]:
    """What the API server's Job validation refuses in a podFailurePolicy (batch/v1, Kubernetes 1.31)."""
    policy = job.get("podFailurePolicy")
    if policy is None:
        return []
    pod = job["template"]["spec"]
    problems = [] if pod.get("restartPolicy") == "Never" else [f"{name}: a podFailurePolicy needs restartPolicy Never"]
    containers = [c["name"] for c in pod["containers"]]
    for rule in policy["rules"]:
        exits = rule.get("onExitCodes")
        if (exits is None) == (rule.get("onPodConditions") is None):
            problems.append(f"{name}: a rule needs exactly one of onExitCodes and onPodConditions")
        if exits is not None:
            if exits.get("containerName") not in (None, *containers):
                problems.append(f"{name}: onExitCodes names container {exits['containerName']!r}, not one of {containers}")
            if exits["operator"] == "In" and 0 in exits["values"]:
                problems.append(f"{name}: onExitCodes In may not hold 0")
        for condition in rule.get("onPodConditions") or []:
            if condition.get("status") not in ("True", "False", "Unknown"):
                problems.append(f"{name}: onPodConditions {condition['type']} needs a status")
    return problems


def pod_failure_verdict(job: dict[str, Any], exit_code: int | None, conditions: tuple[str, ...] = ()) -> str:
    """What the Job controller does with a pod that ended (batch/v1 podFailurePolicy, Kubernetes 1.31):
    ``Succeeded`` for exit 0; else the action of the first rule that matches its container's exit code
    (``None``: it never ran to an exit, e.g. its node was lost) or one of its true conditions; else
    ``Count`` (against backoffLimit)."""
    if exit_code == 0:
        return "Succeeded"
    for rule in (job.get("podFailurePolicy") or {}).get("rules", []):
        exits = rule.get("onExitCodes")
        if exits is not None and exit_code is not None and (exit_code in exits["values"]) == (exits["operator"] == "In"):
            return str(rule["action"])
        if any(c["type"] in conditions and c.get("status", "True") == "True" for c in rule.get("onPodConditions") or []):
            return str(rule["action"])
    return "Count"


def core_objects(documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every core object of an export, the ones embedded in custom resources included: each
    replicated job's Job template as a Job, each TFJob replica's pod template as a Pod."""
    found = []
    for doc in documents:
        if doc["kind"] == "JobSet":
            for rjob in doc["spec"]["replicatedJobs"]:
                name = f"{doc['metadata']['name']}-{rjob['name']}-0"
                found.append({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": rjob["template"]["spec"]})
        elif doc["kind"] == "TFJob":
            for kind, spec in doc["spec"]["tfReplicaSpecs"].items():
                name = f"{doc['metadata']['name']}-{kind.lower()}-0"
                found.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **spec["template"].get("metadata", {})},
                              "spec": spec["template"]["spec"]})
        else:
            found.append(doc)
    return found
