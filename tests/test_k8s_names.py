"""The names `tfl export k8s` accepts: the ones Kubernetes accepts, no more and no fewer."""

from __future__ import annotations

import pytest

from launcher.describe.spec import parse_cluster
from launcher.engines.k8s.export import export_k8s
from launcher.engines.k8s.pods import ExportOptions
from launcher.errors import ExportError

CLUSTER = {"cluster": {"chief": ["c:2222"], "worker": ["w:2222"]}}


def export(namespace: str, fmt: str = "jobset") -> list[str]:
    options = ExportOptions(job="jobs/mnist.py", image="img:1", name="m1", format=fmt, namespace=namespace)
    return [d["metadata"]["namespace"] for d in export_k8s(parse_cluster(CLUSTER), options).documents]


@pytest.mark.parametrize("fmt", ["jobset", "tfjob"])
@pytest.mark.parametrize("namespace", ["1team", "2024", "team-a", "a", "0" * 63])
def test_namespaces_are_rfc_1123_labels_so_may_start_with_a_digit(namespace: str, fmt: str) -> None:
    """A namespace is a DNS-1123 label (`kubectl create namespace 1team` works); --namespace 1team was
    refused as "not a DNS label", the rule of a Service's name (RFC 1035), which it is not."""
    assert set(export(namespace, fmt)) == {namespace}


@pytest.mark.parametrize("namespace", ["Team", "a.b", "-a", "a-", "a_b", "", "a" * 64])
def test_namespaces_kubernetes_refuses_are_refused(namespace: str) -> None:
    with pytest.raises(ExportError, match=rf"^--namespace '{namespace}' is not a DNS label: .*starting and ending with a "
                                          r"letter or digit"):
        export(namespace)


@pytest.mark.parametrize("name", ["1mnist", "Mnist", "m_1", "m-"])
def test_the_run_name_stays_an_rfc_1035_label(name: str) -> None:
    """The JobSet's Service and the TFJob's are named after --name: a Service name must start with a letter."""
    options = ExportOptions(job="jobs/mnist.py", image="img:1", name=name)
    with pytest.raises(ExportError, match=rf"^--name '{name}' is not a DNS label"):
        export_k8s(parse_cluster(CLUSTER), options)


@pytest.mark.parametrize("path", ["/etc/tfl", "/etc/tfl/", "/etc//tfl", "/etc/tfl/runs"])
def test_storage_cannot_be_mounted_over_the_entry_shim(path: str) -> None:
    """The pods mount the shim's ConfigMap at /etc/tfl, read-only. The claim there too was two
    volumes at one path (the API server refuses an equal mountPath, and '/etc/tfl/' is not equal:
    one hid the other); inside it, a mount point that cannot be made in a read-only volume."""
    data = {**CLUSTER, "storage": {"path": path, "k8s_claim": "shared"}}
    options = ExportOptions(job="jobs/mnist.py", image="img:1", name="m1")
    with pytest.raises(ExportError, match=rf"^storage.path {path}: the JobSet pods mount tfl's entry shim at /etc/tfl"):
        export_k8s(parse_cluster(data), options)


@pytest.mark.parametrize("path", ["/etc", "/etc/tfl-runs", "/mnt/shared"])
def test_storage_beside_or_above_the_entry_shim_is_mounted(path: str) -> None:
    data = {**CLUSTER, "storage": {"path": path, "k8s_claim": "shared"}}
    options = ExportOptions(job="jobs/mnist.py", image="img:1", name="m1")
    jobset = export_k8s(parse_cluster(data), options).documents[1]
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]] == ["/etc/tfl", path]
