"""`tfl export k8s`: the manifests' shape, the upstream schemas, the operators' rules, core kinds, bad input."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from launcher import contract
from launcher.cli import app
from launcher.describe.spec import parse_cluster
from launcher.engines.k8s import jobset
from launcher.engines.k8s.export import export_k8s
from launcher.engines.k8s.node import entry
from launcher.engines.k8s.pods import ExportOptions, Role, default_name
from launcher.engines.k8s.tfjob import check_roles
from launcher.errors import ClusterFileError, ExportError
from launcher.plan.tfconfig import tasks_of, tf_config_json
from tests.conftest import ROOT
from tests.k8s_checks import (
    core_objects,
    jobset_rule_violations,
    tfjob_rule_violations,
    validate_core,
    validate_custom,
)

runner = CliRunner()
GPU_CLUSTER = {
    "cluster": {"chief": ["g1:2222"], "worker": ["g2:2222", "g3:2222"], "evaluator": ["g4:2222"]},
    "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "0"},
    "hosts": {"g1": {"gpus": 2}, "g2": {"gpus": 2}, "g3": {"gpus": [0, 1]}, "g4": {"gpus": 1}},
    "devices": {"evaluator:0": {"gpus": [0]}},
    "storage": {"path": "/mnt/shared", "k8s_claim": "train-data"},
}
TOPOLOGIES = [  # (chief, workers, evaluator)
    (1, 0, 0), (1, 1, 0), (1, 3, 1), (0, 2, 0), (0, 4, 1), (1, 0, 1),
]


def cluster(chief: int, workers: int, evaluator: int, **extra: Any) -> dict[str, Any]:
    roles = {"chief": chief, "worker": workers, "evaluator": evaluator}
    hosts = {kind: [f"{kind}{i}.example:2222" for i in range(n)] for kind, n in roles.items()}
    return {"cluster": hosts, **extra}


def export(data: dict[str, Any], fmt: str = "jobset", **options: Any) -> list[dict[str, Any]]:
    opts = ExportOptions(job="jobs/mnist.py", image="registry.example/train:1", name=options.pop("name", "run1"), format=fmt, **options)
    result = export_k8s(parse_cluster(data), opts)
    assert list(yaml.safe_load_all(result.text)) == list(result.documents)  # the YAML says exactly that
    assert result.documents[-1]["kind"] == "NetworkPolicy"  # tests/test_k8s_netpol.py checks it
    return list(result.documents[:-1])


def by_kind(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in documents}


def pod_spec(rjob: dict[str, Any]) -> dict[str, Any]:
    return rjob["template"]["spec"]["template"]["spec"]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# --- JobSet -------------------------------------------------------------------------------

def test_jobset_one_indexed_job_per_role_with_the_group_policies() -> None:
    docs = by_kind(export(cluster(1, 3, 1), max_restarts=4, job_args=("--epochs", "2")))
    spec = docs["JobSet"]["spec"]
    assert docs["JobSet"]["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert [(r["name"], r["replicas"], r["template"]["spec"]["parallelism"], r["template"]["spec"]["completions"])
            for r in spec["replicatedJobs"]] == [("chief", 1, 1, 1), ("worker", 1, 3, 3), ("evaluator", 1, 1, 1)]
    assert {r["template"]["spec"]["completionMode"] for r in spec["replicatedJobs"]} == {"Indexed"}
    assert spec["failurePolicy"]["maxRestarts"] == 4
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    assert spec["network"]["enableDNSHostnames"] is True
    backoff = {r["name"]: r["template"]["spec"]["backoffLimit"] for r in spec["replicatedJobs"]}
    assert backoff == {"chief": 0, "worker": 0, "evaluator": 4}  # a training pod's failure restarts the group
    commands = {r["name"]: pod_spec(r)["containers"][0]["command"] for r in spec["replicatedJobs"]}
    assert commands["worker"] == ["python3", "/etc/tfl/entry.py", "--", "python3", "-u", "jobs/mnist.py", "--epochs", "2"]
    assert commands["evaluator"][:4] == ["python3", "/etc/tfl/entry.py", "--sidecar", "--"]


def test_jobset_restarts_a_preempted_group_without_counting() -> None:
    spec = by_kind(export(cluster(1, 3, 1), max_restarts=4))["JobSet"]["spec"]
    assert spec["failurePolicy"]["rules"] == [{
        "name": "preempted", "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"],
        "targetReplicatedJobs": ["chief", "worker"]}]
    policies = {r["name"]: r["template"]["spec"].get("podFailurePolicy") for r in spec["replicatedJobs"]}
    assert policies["evaluator"] == {"rules": [  # told to go (its shim's 143) or disrupted: made again, not counted
        {"action": "Ignore", "onExitCodes": {"containerName": "tensorflow", "operator": "In", "values": [143]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}
    for role in ("chief", "worker"):
        exits, disrupted = policies[role]["rules"]
        assert exits == {"action": "FailJob", "onExitCodes": {"containerName": "tensorflow", "operator": "In",
                                                              "values": [contract.PREEMPTED_EXIT_CODE]}}
        assert disrupted == {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    rjob = spec["replicatedJobs"][0]
    assert pod_spec(rjob)["containers"][0]["name"] == "tensorflow" and pod_spec(rjob)["restartPolicy"] == "Never"
    bad = copy.deepcopy(by_kind(export(cluster(1, 1, 0)))["JobSet"])
    bad["spec"]["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] = "main"
    bad["spec"]["failurePolicy"]["rules"][0]["name"] = "pre-empted"
    assert jobset_rule_violations(bad) == ["chief: onExitCodes names container 'main', not one of ['tensorflow']",
                                           "failurePolicy rule name 'pre-empted' is not allowed"]


@pytest.mark.parametrize("fmt", ["jobset", "tfjob"])
def test_termination_grace_reaches_every_pod(fmt: str) -> None:
    docs = export(cluster(1, 2, 1), fmt, termination_grace=180)
    pods = [o["spec"]["template"]["spec"] if o["kind"] == "Job" else o["spec"] for o in core_objects(docs) if o["kind"] != "ConfigMap"]
    assert len(pods) == 3 and {p["terminationGracePeriodSeconds"] for p in pods} == {180}
    custom = next(d for d in docs if d["kind"] in ("JobSet", "TFJob"))
    validate_custom(custom)
    for obj in core_objects(docs):
        validate_core(obj)
    default = export(cluster(1, 1, 0), fmt)
    assert "terminationGracePeriodSeconds" not in json.dumps(default)  # Kubernetes' own 30 s
    with pytest.raises(ExportError, match=r"--termination-grace -1: give the seconds from the notice to SIGKILL"):
        export(cluster(1, 1, 0), fmt, termination_grace=-1)


def test_tfjob_warns_that_backoff_limit_does_not_cap_exit_code_retries(tmp_path: Path) -> None:
    path = write_cluster(tmp_path, cluster(1, 1, 0))
    result = runner.invoke(app, ["export", "k8s", "jobs/mnist.py", "-c", str(path), "--image", "img:1", "--format", "tfjob",
                                 "--max-restarts", "3", "--termination-grace", "90"])
    assert result.exit_code == 0, result.output
    (warning,) = [ln for ln in result.stderr.splitlines() if "backoffLimit" in ln]
    assert "exit codes 128-255 (a preemption's 170 among them) are retried without limit" in warning
    (tfjob, _) = yaml.safe_load_all(result.stdout)
    assert {s["template"]["spec"]["terminationGracePeriodSeconds"] for s in tfjob["spec"]["tfReplicaSpecs"].values()} == {90}
    assert "backoffLimit" not in runner.invoke(app, ["export", "k8s", "jobs/mnist.py", "-c", str(path), "--image", "img:1",
                                                     "--format", "jobset", "--max-restarts", "3"]).stderr
    refused = runner.invoke(app, ["export", "k8s", "jobs/mnist.py", "-c", str(path), "--image", "img:1",
                                  "--termination-grace", "-5"])
    assert refused.exit_code == 2 and "--termination-grace" in refused.stderr


def test_jobset_success_belongs_to_the_workers_without_a_chief() -> None:
    spec = by_kind(export(cluster(0, 2, 1)))["JobSet"]["spec"]
    assert spec["successPolicy"]["targetReplicatedJobs"] == ["worker"]


@pytest.mark.parametrize("roles", TOPOLOGIES)
def test_jobset_shim_table_gives_every_pod_tfls_own_tf_config(roles: tuple[int, int, int]) -> None:
    docs = by_kind(export(cluster(*roles)))
    table = json.loads(docs["ConfigMap"]["data"]["tf_config.json"])
    rjobs = {r["name"]: r["template"]["spec"]["parallelism"] for r in docs["JobSet"]["spec"]["replicatedJobs"]}
    assert list(rjobs) == list(table)
    topology = parse_cluster({"cluster": {
        kind: [f"run1-{kind}-0-{i}.run1:2222" for i in range(n)] for kind, n in zip(("chief", "worker", "evaluator"), roles, strict=True)
    }}).cluster
    for task in tasks_of(topology):
        assert task.index < rjobs[task.type]
        assert entry.tf_config_for(table, task.type, task.index) == tf_config_json(topology, task)
    assert docs["ConfigMap"]["data"]["entry.py"] == (ROOT / "launcher" / "engines" / "k8s" / "node" / "entry.py").read_text()


def test_env_gpus_and_storage_reach_every_container() -> None:
    for fmt in ("jobset", "tfjob"):
        docs = export(GPU_CLUSTER, fmt)
        pods = ([pod_spec(r) for r in by_kind(docs)["JobSet"]["spec"]["replicatedJobs"]] if fmt == "jobset"
                else [s["template"]["spec"] for s in by_kind(docs)["TFJob"]["spec"]["tfReplicaSpecs"].values()])
        limits = [p["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods]
        assert limits == [2, 2, 1], fmt  # chief, workers, evaluator
        for pod in pods:
            (box,) = pod["containers"]
            env = env_of(box)
            assert env["TF_CPP_MIN_LOG_LEVEL"] == "2" and env["TF_USE_LEGACY_KERAS"] == "1", fmt
            assert env["PYTHONUNBUFFERED"] == "1" and env["TFL_RUN_DIR"] == "/mnt/shared/run1", fmt
            assert "CUDA_VISIBLE_DEVICES" not in env and "TF_CONFIG" not in env, fmt  # the device plugin and the shim/operator set those
            assert {"name": "shared", "mountPath": "/mnt/shared"} in box["volumeMounts"], fmt
            assert {"name": "shared", "persistentVolumeClaim": {"claimName": "train-data"}} in pod["volumes"], fmt
            assert pod["shareProcessNamespace"] is True  # the job is not PID 1: SIGTERM's default action works


def test_gs_storage_passes_through_and_cpu_only_tasks_stay_off_gpus() -> None:
    data = cluster(1, 1, 1, storage={"path": "gs://bucket/runs"},
                   hosts={"chief0.example": {"gpus": 1}, "worker0.example": {"gpus": 1}, "evaluator0.example": {"gpus": 1}})
    for rjob in by_kind(export(data))["JobSet"]["spec"]["replicatedJobs"]:
        pod = pod_spec(rjob)
        env = env_of(pod["containers"][0])
        assert env["TFL_RUN_DIR"] == "gs://bucket/runs/run1"
        assert [v["name"] for v in pod["volumes"]] == ["tfl-entry"]  # no volume for a URL
        if rjob["name"] == "evaluator":  # an evaluator gets no GPU unless given one, as in a local run
            assert env["CUDA_VISIBLE_DEVICES"] == "" and "resources" not in pod["containers"][0]
        else:
            assert "CUDA_VISIBLE_DEVICES" not in env


def test_warnings_name_missing_or_unmounted_storage() -> None:
    def warnings(data: dict[str, Any], restarts: int = 0) -> tuple[str, ...]:
        options = ExportOptions(job="jobs/mnist.py", image="img:1", name="run1", max_restarts=restarts)
        return export_k8s(parse_cluster(data), options).warnings

    assert warnings(cluster(1, 1, 0)) == ()
    assert warnings(cluster(1, 1, 0, storage={"path": "/mnt/s", "k8s_claim": "s"}), restarts=2) == ()
    for data, restarts in ((cluster(1, 1, 1), 0), (cluster(1, 1, 0), 1)):
        (line,) = warnings(data, restarts)
        assert line.startswith("no shared storage in the cluster file: each pod keeps its model dir on its own disk")
    (line,) = warnings(cluster(1, 1, 1, storage={"path": "gs://bucket/runs"}))
    assert line.startswith("storage.path gs://bucket/runs reaches the pods as TFL_RUN_DIR, unmounted")


# --- TFJob --------------------------------------------------------------------------------

def test_tfjob_replica_specs_and_policies() -> None:
    (tfjob,) = export(cluster(1, 2, 1), "tfjob", max_restarts=3, namespace="ml")
    assert tfjob["apiVersion"] == "kubeflow.org/v1" and tfjob["metadata"]["namespace"] == "ml"
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert {k: s["replicas"] for k, s in specs.items()} == {"Chief": 1, "Worker": 2, "Evaluator": 1}
    assert {s["restartPolicy"] for s in specs.values()} == {"ExitCode"}
    assert tfjob["spec"]["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "None"}
    for spec in specs.values():
        (box,) = spec["template"]["spec"]["containers"]
        assert box["name"] == "tensorflow" and box["command"] == ["python3", "-u", "jobs/mnist.py"]
        assert box["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
    assert tfjob_rule_violations(tfjob) == []


def test_formats_refuse_role_counts_they_cannot_express() -> None:
    with pytest.raises(ExportError, match="a TFJob has at most one Chief"):
        check_roles([Role("chief", 2, None), Role("worker", 1, None)])
    jobset.check_roles([Role("worker", 100_000, None)])
    with pytest.raises(ExportError, match="cluster.worker has 100001 tasks; a JobSet runs a role as one Indexed Job"):
        jobset.check_roles([Role("chief", 1, None), Role("worker", 100_001, None)])


# --- the upstream schemas and the rules they do not carry ----------------------------------

@pytest.mark.parametrize("fmt", ["jobset", "tfjob"])
@pytest.mark.parametrize("data", [cluster(1, 3, 1), cluster(0, 1, 0), GPU_CLUSTER], ids=["mixed", "one-worker", "gpus"])
def test_custom_resources_pass_the_upstream_crd_closed(fmt: str, data: dict[str, Any]) -> None:
    docs = export(data, fmt, max_restarts=2, namespace="team-a")
    custom = [d for d in docs if d["kind"] in ("JobSet", "TFJob")]
    assert len(custom) == 1
    validate_custom(custom[0])
    violations = jobset_rule_violations(custom[0]) if fmt == "jobset" else tfjob_rule_violations(custom[0])
    assert violations == []


def test_the_closed_schema_and_the_rules_catch_what_they_should() -> None:
    (config_map, js) = export(cluster(1, 1, 1))
    misspelt = copy.deepcopy(js)
    misspelt["spec"]["failurePolicy"] = {"maxRestart": 1}
    validate_custom(misspelt, closed=False)  # the CRD as shipped leaves unknown fields open...
    with pytest.raises(jsonschema.ValidationError, match="maxRestart"):
        validate_custom(misspelt)  # ...closed, as strict field validation is, it refuses them
    (tfjob,) = export(cluster(1, 1, 1), "tfjob")
    broken = copy.deepcopy(tfjob)
    broken["spec"]["tfReplicaSpecs"]["Chief"]["replicas"] = 2
    broken["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "main"
    broken["spec"]["runPolicy"]["cleanPodPolicy"] = "Never"
    broken["spec"]["tfReplicaSpecs"]["Evaluator"]["restartPolicy"] = "Sometimes"
    validate_custom(broken)  # the schema types these as plain strings and integers
    assert len(tfjob_rule_violations(broken)) == 4
    bad_target = copy.deepcopy(js)
    bad_target["spec"]["successPolicy"]["targetReplicatedJobs"] = ["leader"]
    assert jobset_rule_violations(bad_target) == ["successPolicy names 'leader', not one of ['chief', 'worker', 'evaluator']"]


@pytest.mark.parametrize("fmt", ["jobset", "tfjob"])
def test_core_kinds_pass_kubernetes_validate_strict(fmt: str) -> None:
    docs = export(GPU_CLUSTER, fmt, max_restarts=1, namespace="team-a")
    objects = core_objects(docs)
    expected = {"jobset": ["ConfigMap", "Job", "Job", "Job"], "tfjob": ["Pod", "Pod", "Pod"]}[fmt]
    assert [o["kind"] for o in objects] == expected
    for obj in objects:
        validate_core(obj)  # raises on an error, and on a kind without a schema (never a pass)


def test_kubernetes_validate_is_strict_and_never_passes_an_unknown_kind() -> None:
    config_map, js = export(cluster(1, 1, 0))
    job = core_objects([js])[0]
    job["spec"]["backofLimit"] = 1
    with pytest.raises(kubernetes_validate.ValidationError, match="backofLimit"):
        validate_core(job)
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        validate_core(js)


# --- the command line -----------------------------------------------------------------------

def write_cluster(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(data))
    return path


def test_cli_prints_yaml_or_writes_the_file(tmp_path: Path) -> None:
    printed = runner.invoke(app, ["export", "k8s", "jobs/mnist.py", "--local", "2", "--image", "img:1", "--name", "m1",
                                  "--", "--epochs", "3"])
    assert printed.exit_code == 0, printed.output
    kinds = [d["kind"] for d in yaml.safe_load_all(printed.stdout)]
    assert kinds == ["ConfigMap", "JobSet", "NetworkPolicy"] and printed.stderr == ""
    out = tmp_path / "m1.yaml"
    written = runner.invoke(app, ["export", "k8s", "jobs/mnist.py", "--local", "1", "--evaluator", "--image", "img:1",
                                  "--name", "m1", "--format", "tfjob", "-o", str(out)])
    assert written.exit_code == 0 and written.stdout == ""
    (tfjob, _) = yaml.safe_load_all(out.read_text())
    assert list(tfjob["spec"]["tfReplicaSpecs"]) == ["Chief", "Evaluator"]


def test_cli_warns_once_about_host_settings_kubernetes_ignores(tmp_path: Path) -> None:
    data = cluster(1, 1, 0, ssh={"user": "train"}, storage={"path": "/mnt/s"},
                   hosts={"chief0.example": {"python": "/opt/py/bin/python", "workdir": "/srv"},
                          "worker0.example": {"ssh": {"port": 2222}, "env": {"A": "1"}}})
    result = runner.invoke(app, ["export", "k8s", "jobs/mnist.py", "-c", str(write_cluster(tmp_path, data)),
                                 "--image", "img:1", "--name", "m1"])
    assert result.exit_code == 0
    assert result.stderr.splitlines() == [
        "tfl: warning: ignored on Kubernetes, where the image and the pods replace them: ssh, "
        "hosts.chief0.example.python, hosts.chief0.example.workdir, hosts.worker0.example.env, hosts.worker0.example.ssh"]


def test_cli_warns_that_an_elastic_block_is_not_carried_over(tmp_path: Path) -> None:
    data = cluster(1, 2, 0, storage={"path": "/mnt/s", "k8s_claim": "c"}, elastic={"min_tasks": 2, "global_batch": 64})
    result = runner.invoke(app, ["export", "k8s", "jobs/mnist.py", "-c", str(write_cluster(tmp_path, data)),
                                 "--image", "img:1", "--name", "m1"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "tfl: warning: elastic: not carried into the manifests, which run the group at its full size; on Kubernetes "
        "a lost pod is made again at the same size (docs/kubernetes.md, Elastic runs)"]
    (js,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "JobSet"]
    assert [r["template"]["spec"]["parallelism"] for r in js["spec"]["replicatedJobs"]] == [1, 2]


def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    two_chiefs = write_cluster(tmp_path, {"cluster": {"chief": ["a:1", "b:1"]}})
    uneven = tmp_path / "uneven.json"  # worker:1 is on a host without GPU settings: no one template fits both
    uneven.write_text(json.dumps({"cluster": {"chief": ["g1:1"], "worker": ["g2:1", "g3:1"]},
                                  "hosts": {"g1": {"gpus": 1}, "g2": {"gpus": 1}}}))
    many = tmp_path / "many.json"  # 11 workers: worker:10's hostname has one digit more than worker:9's
    many.write_text(json.dumps({"cluster": {"worker": [f"w{i}:2222" for i in range(11)]}}))
    out = tmp_path / "out.yaml"
    job = ["export", "k8s", "jobs/mnist.py"]
    cases = [
        (["--local", "2", "-o", str(out)], "--image is required"),
        (["--local", "2", "--image", "img:1", "--name", "Mnist_1", "-o", str(out)], "--name 'Mnist_1' is not a DNS label"),
        (["--local", "2", "--image", "img:1", "--name", "1mnist", "-o", str(out)], "--name '1mnist' is not a DNS label"),
        (["--local", "2", "--image", "img:1", "--namespace", "a.b", "-o", str(out)], "--namespace 'a.b' is not a DNS label"),
        (["-c", str(two_chiefs), "--image", "img:1", "-o", str(out)], "at most one chief is allowed"),
        (["-c", str(uneven), "--image", "img:1", "-o", str(out)], "devices: the worker tasks have different GPUs"),
        (["-c", str(many), "--image", "img:1", "--name", "n" * 52, "-o", str(out)], "of worker:10 has 64 characters"),
        (["--local", "2", "--image", "img:1", "--format", "mpijob", "-o", str(out)], "--format mpijob: choose jobset or tfjob"),
        (["--local", "2", "--image", "img:1", "-o", str(tmp_path / "no" / "dir.yaml")], "cannot write there"),
    ]
    for args, message in cases:
        result = runner.invoke(app, [*job, *args])
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.splitlines()) == 1 and message in result.stderr, (args, result.stderr)
        assert result.stdout == "" and "Traceback" not in result.output
        assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.json", "many.json", "uneven.json"], args
    # The same name fits 10 workers, and the same 11 workers fit a shorter name.
    many.write_text(json.dumps({"cluster": {"worker": [f"w{i}:2222" for i in range(10)]}}))
    assert runner.invoke(app, [*job, "-c", str(many), "--image", "img:1", "--name", "n" * 52, "-o", str(out)]).exit_code == 0
    many.write_text(json.dumps({"cluster": {"worker": [f"w{i}:2222" for i in range(11)]}}))
    assert runner.invoke(app, [*job, "-c", str(many), "--image", "img:1", "--name", "n" * 51, "-o", str(out)]).exit_code == 0


def test_default_name_is_a_dns_label_from_the_job() -> None:
    assert default_name("jobs/model_parallel.py", "20261122-101500") == "model-parallel-20261122-101500"
    assert default_name("/x/3D_Net.py", "1") == "d-net-1"
    assert default_name("jobs/___.py", "1") == "tfl-1"
    assert jobset.pod_hostname("a", "worker", 7) == "a-worker-0-7"


def test_tfl_status_does_not_import_yaml(tmp_path: Path) -> None:
    code = ("import sys; from typer.testing import CliRunner; from launcher.cli import app; "
            "r = CliRunner().invoke(app, ['status']); assert r.exit_code == 0, r.output; "
            "print('yaml' in sys.modules, 'launcher.engines.k8s.pods' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "TFL_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]


@pytest.mark.parametrize(("storage", "message"), [
    ({"path": "shared/runs"}, "storage.path: 'shared/runs' is neither an absolute directory nor a URL"),
    ({"path": "gs://bucket/runs", "k8s_claim": "data"}, "storage: k8s_claim is mounted at path, but path 'gs://bucket/runs' is a URL"),
    ({"path": "/mnt/s", "k8s_claim": "Data_1"}, "storage.k8s_claim: 'Data_1' is not a PersistentVolumeClaim name"),
    ({"path": "/mnt/s\n"}, "storage.path: '/mnt/s\\n' is neither"),
    ({"claim": "x", "path": "/mnt/s"}, "storage.claim: unknown key"),
])
def test_storage_field_is_checked_with_its_fix(storage: dict[str, Any], message: str) -> None:
    with pytest.raises(ClusterFileError) as caught:
        parse_cluster(cluster(1, 0, 0, storage=storage), "c.json")
    assert str(caught.value).startswith(f"c.json: {message}"), str(caught.value)
