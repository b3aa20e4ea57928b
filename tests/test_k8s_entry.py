"""The JobSet entry shim for real: pods simulated as local processes with what Kubernetes gives them.

Each pod gets its container's command and env from the exported manifest, with the downward
API's label values resolved from the labels JobSet puts on its pods, ``JOB_COMPLETION_INDEX``
from the Indexed Job, and the ConfigMap's files where the volume mounts them. Only the
pods' DNS names are swapped for loopback ports.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from typer.testing import CliRunner

from launcher.cli import app
from launcher.contract import PREEMPTED_EXIT_CODE
from launcher.describe.ports import free_ports
from launcher.describe.spec import parse_cluster
from launcher.engines.k8s import jobset
from launcher.plan.build import build_plan
from tests.conftest import ROOT
from tests.jobkit_helpers import JobProcess, assert_none_alive, job_env, kill_all, wait_all
from tests.procs import assert_none_left

FIELD_LABEL = re.compile(r"metadata\.labels\['([^']+)'\]")


def export_jobset(tmp_path: Path, cluster: dict[str, Any], job_args: list[str], name: str = "e2e") -> list[dict[str, Any]]:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(cluster))
    out = tmp_path / f"{name}.yaml"
    result = CliRunner().invoke(app, ["export", "k8s", "jobs/mnist.py", "-c", str(path), "--image", "img:1",
                                      "--name", name, "--max-restarts", "2", "-o", str(out), "--", *job_args])
    assert result.exit_code == 0, result.output
    return list(yaml.safe_load_all(out.read_text()))


def mount_config_map(config_map: dict[str, Any], where: Path, hosts: dict[str, str]) -> None:
    """The ConfigMap's files, as its volume shows them, with each pod's DNS name swapped for a loopback address."""
    where.mkdir()
    (where / "entry.py").write_text(config_map["data"]["entry.py"])
    table = json.loads(config_map["data"]["tf_config.json"])
    for config in table.values():
        for kind, addresses in config["cluster"].items():
            config["cluster"][kind] = [hosts[a] for a in addresses]
    (where / "tf_config.json").write_text(json.dumps(table))


def pod_labels(js: dict[str, Any], rjob: dict[str, Any], job_index: int, attempt: int) -> dict[str, str]:
    """The labels the JobSet controller sets on a pod of its child Job (jobset_controller.go)."""
    name = js["metadata"]["name"]
    return {
        **rjob["template"]["spec"]["template"]["metadata"]["labels"],
        "jobset.sigs.k8s.io/jobset-name": name,
        "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
        "jobset.sigs.k8s.io/restart-attempt": str(attempt),
        "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob["replicas"]),
        "jobset.sigs.k8s.io/job-index": str(job_index),
    }


def container_env(container: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    env = {}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            (key,) = FIELD_LABEL.fullmatch(item["valueFrom"]["fieldRef"]["fieldPath"]).groups()  # type: ignore[union-attr]
            env[item["name"]] = labels[key]
    return env


def pods(docs: list[dict[str, Any]], mounted: Path, attempt: int) -> list[tuple[str, list[str], dict[str, str]]]:
    """(hostname, argv, env) of every pod of the JobSet."""
    config_map, js = (next(d for d in docs if d["kind"] == kind) for kind in ("ConfigMap", "JobSet"))
    found = []
    for rjob in js["spec"]["replicatedJobs"]:
        job = rjob["template"]["spec"]
        pod = job["template"]["spec"]
        (box,) = pod["containers"]
        (entry_mount,) = [m for m in box["volumeMounts"] if m["name"] == "tfl-entry"]
        assert [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v] == [config_map["metadata"]["name"]]
        for job_index in range(rjob["replicas"]):
            for completion in range(job["parallelism"]):
                host = jobset.pod_hostname(js["metadata"]["name"], rjob["name"], completion)
                env = container_env(box, pod_labels(js, rjob, job_index, attempt))
                env["JOB_COMPLETION_INDEX"] = str(completion)  # the Job controller's, for an Indexed Job
                env["HOSTNAME"] = host
                argv = [sys.executable if a == "python3" else a.replace(entry_mount["mountPath"], str(mounted))
                        for a in box["command"]]
                found.append((host, argv, env))
    return found


def start_pod(host: str, argv: list[str], env: dict[str, str], tmp_path: Path) -> JobProcess:
    image_env = job_env(host, tmp_path / "image" / host, launcher_env=False)  # private HOME/TMPDIR, no TF_CONFIG or TFL_*
    log = tmp_path / f"{host}.log"
    with log.open("wb") as handle:
        popen = subprocess.Popen(argv, env={**image_env, **env}, cwd=ROOT, stdout=handle,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    return JobProcess(host, popen, log, log, log)


@pytest.mark.slow
def test_jobset_pods_compute_tfls_tf_config_and_train_together(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    cluster = {"cluster": {"chief": ["c:2222"], "worker": ["w:2222"], "evaluator": ["e:2222"]},
               "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}, "storage": {"path": str(shared), "k8s_claim": "shared"}}
    docs = export_jobset(tmp_path, cluster, ["--epochs", "2", "--steps-per-epoch", "5", "--batch-size", "32"])
    name = docs[1]["metadata"]["name"]
    roles = {"chief": 1, "worker": 1, "evaluator": 1}
    dns = [f"{jobset.pod_hostname(name, r, i)}.{name}:2222" for r, n in roles.items() for i in range(n)]
    loopback = [f"127.0.0.1:{p}" for p in free_ports(len(dns))]
    mount_config_map(docs[0], tmp_path / "etc-tfl", dict(zip(dns, loopback, strict=True)))
    # What tfl builds for a local run of the same roles on those addresses.
    local = parse_cluster({"cluster": {"chief": loopback[:1], "worker": loopback[1:2], "evaluator": loopback[2:]}})
    plan = build_plan(local, "job.py", (), run_id="x", run_dir="/nonexistent", python=sys.executable, cwd=str(ROOT))
    expected = {t.name: t.env["TF_CONFIG"] for t in plan.tasks}

    procs = [start_pod(host, argv, env, tmp_path) for host, argv, env in pods(docs, tmp_path / "etc-tfl", attempt=1)]
    try:
        codes = wait_all(procs, timeout_s=240)
    finally:
        kill_all(procs)
    assert_none_alive(procs)
    assert_none_left(str(shared))  # the evaluator's job (a child of its shim) included
    logs = {p.name.split("-")[1]: p.output() for p in procs}
    assert set(codes.values()) == {0}, {p.name: p.output()[-3000:] for p in procs}
    for task, config in expected.items():
        role = task.split(":")[0]
        assert f"tfl-entry: {task} TF_CONFIG={config}\n" in logs[role], logs[role][-3000:]
    assert "strategy=MultiWorkerMirroredStrategy replicas=2" in logs["chief"]
    assert "attempt=1" in logs["chief"] and "attempt=1" in logs["worker"]  # JobSet's restart-attempt label
    chief_epochs = [ln for ln in logs["chief"].splitlines() if ln.startswith("epoch ")]
    assert len(chief_epochs) == 2 and chief_epochs == [ln for ln in logs["worker"].splitlines() if ln.startswith("epoch ")]
    assert "eval checkpoint=" in logs["evaluator"]
    model = shared / name / "model"  # TFL_RUN_DIR = the storage path / the JobSet's name
    assert list((model / "checkpoints").glob("*.index")) and (model / "training_done.json").exists()


# --- the shim's own behaviour, with a stand-in for the job -------------------------------------

TABLE = {"chief": {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "chief", "index": 0}},
         "worker": {"cluster": {"chief": ["a:1"], "worker": ["b:1", "c:1"]}, "task": {"type": "worker", "index": 0}}}


@pytest.fixture
def shim(tmp_path: Path) -> Path:
    (tmp_path / "entry.py").write_text((ROOT / "launcher" / "engines" / "k8s" / "node" / "entry.py").read_text())
    (tmp_path / "tf_config.json").write_text(json.dumps(TABLE))
    return tmp_path / "entry.py"


def run_shim(shim: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(shim), *args], env={"PATH": "/usr/bin:/bin", **env},
                          capture_output=True, text=True, timeout=60)


def test_shim_execs_the_job_with_its_tf_config(shim: Path) -> None:
    job = "import os, sys; print(os.environ['TF_CONFIG'], os.environ['TFL_TASK'], os.getpid()); sys.exit(3)"
    result = run_shim(shim, ["--", sys.executable, "-c", job], {"TFL_K8S_ROLE": "worker", "JOB_COMPLETION_INDEX": "1"})
    config = '{"cluster":{"chief":["a:1"],"worker":["b:1","c:1"]},"task":{"type":"worker","index":1}}'
    assert result.returncode == 3  # the job's own exit code: the shim is gone, exec'd
    assert result.stderr == f"tfl-entry: worker:1 TF_CONFIG={config}\n"
    assert result.stdout.split()[:2] == [config, "worker:1"]


@pytest.mark.parametrize(("env", "args", "message"), [
    ({"TFL_K8S_ROLE": "worker"}, ["--", "true"], "JOB_COMPLETION_INDEX is ''"),
    ({"TFL_K8S_ROLE": "ps", "JOB_COMPLETION_INDEX": "0"}, ["--", "true"], "TFL_K8S_ROLE is 'ps'; expected one of chief, worker"),
    ({"TFL_K8S_ROLE": "worker", "JOB_COMPLETION_INDEX": "2"}, ["--", "true"], "the worker role has 2 task(s)"),
    ({"TFL_K8S_ROLE": "worker", "JOB_COMPLETION_INDEX": "0"}, ["true"], "usage: entry.py"),
])
def test_shim_refuses_a_pod_it_cannot_place_in_one_line(shim: Path, env: dict[str, str], args: list[str], message: str) -> None:
    result = run_shim(shim, args, env)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and message in result.stderr, result.stderr


def test_sidecar_shim_exits_0_after_a_failure_and_143_when_told_to_go(shim: Path) -> None:
    """The evaluator's own failure never fails its pod; a SIGTERM (a drain, an eviction, a deletion)
    does, so that its Job makes it again (the manifest's podFailurePolicy ignores 143)."""
    env = {"TFL_K8S_ROLE": "chief", "JOB_COMPLETION_INDEX": "0"}
    failed = run_shim(shim, ["--sidecar", "--", sys.executable, "-c", "raise SystemExit(5)"], env)
    assert failed.returncode == 0
    assert failed.stderr.splitlines()[-1] == ("tfl-entry: chief:0 exited with 5; as in a local run, "
                                              "an evaluator's failure does not stop training")
    sleeper = "import os, time; print(os.getpid(), flush=True); time.sleep(300)"
    shim_proc = subprocess.Popen([sys.executable, str(shim), "--sidecar", "--", sys.executable, "-c", sleeper],
                                 env={"PATH": "/usr/bin:/bin", **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
    try:
        assert shim_proc.stdout is not None
        child = int(shim_proc.stdout.readline())
        started = time.monotonic()
        shim_proc.send_signal(signal.SIGTERM)  # as the kubelet does when the pod is deleted
        assert shim_proc.wait(timeout=120) == 128 + signal.SIGTERM and time.monotonic() - started < 100  # the sleep cut short
        assert ("chief:0 was told to stop (SIGTERM); it exited with -15, and the pod leaves with 143 to be made again"
                in shim_proc.stderr.read())  # type: ignore[union-attr]
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:
        if shim_proc.poll() is None:
            shim_proc.kill()
        shim_proc.wait(timeout=10)


def test_the_shim_spells_the_contracts_names() -> None:
    """The shim ships alone in a ConfigMap (stdlib only, no import of the contract), so it
    spells TF_CONFIG and TFL_TASK itself; they must be the contract's."""
    from launcher import contract
    from launcher.engines.k8s.node import entry

    source = Path(entry.__file__).read_text()
    assert f'"{contract.TF_CONFIG}"' in source and f'"{contract.TASK}"' in source
    assert "from launcher" not in source and "import launcher" not in source


# A stand-in for a job kit task on a preemption notice: its own SIGTERM handler notes the
# signal and the process that got it, then the task leaves with the preempted code.
NOTICED_JOB = """\
import os, signal, sys, time
def noticed(signum, frame):
    with open(sys.argv[1], "w") as f:
        f.write(f"{signal.Signals(signum).name} {os.getpid()}")
    sys.exit(170)
signal.signal(signal.SIGTERM, noticed)
print(os.getpid(), flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("sidecar", [False, True], ids=["training", "evaluator"])
def test_sigterm_to_the_pod_reaches_the_jobs_own_handler(shim: Path, tmp_path: Path, sidecar: bool) -> None:
    """As the kubelet does on eviction or preemption: SIGTERM to the container's process. A
    training pod's exit code is the job's (170, for the failure policy); the evaluator's is 143,
    whatever its job's (its pod is made again)."""
    job, record = tmp_path / "noticed.py", tmp_path / "noticed.txt"
    job.write_text(NOTICED_JOB)
    env = {"PATH": "/usr/bin:/bin", "TFL_K8S_ROLE": "worker", "JOB_COMPLETION_INDEX": "0"}
    shim_proc = subprocess.Popen([sys.executable, str(shim), *(["--sidecar"] if sidecar else []), "--", sys.executable,
                                  str(job), str(record)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
    try:
        assert shim_proc.stdout is not None
        job_pid = int(shim_proc.stdout.readline())
        assert (job_pid == shim_proc.pid) is not sidecar  # a training task's shim execs: the job is the pod's process
        shim_proc.send_signal(signal.SIGTERM)
        code = shim_proc.wait(timeout=120)
        err = shim_proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if shim_proc.poll() is None:
            shim_proc.kill()
        shim_proc.wait(timeout=10)
    assert record.read_text() == f"SIGTERM {job_pid}"  # the job's handler got it (forwarded, for the sidecar)
    if sidecar:
        assert code == 128 + signal.SIGTERM and "worker:0 was told to stop (SIGTERM); it exited with 170" in err
    else:
        assert code == PREEMPTED_EXIT_CODE, err  # 170 reaches Kubernetes as the container's exit code
    assert not psutil.pid_exists(job_pid) or psutil.Process(job_pid).status() == psutil.STATUS_ZOMBIE


def shim_exit(shim: Path, sidecar: bool, how: str) -> int:
    """The pod's exit code, from the real shim: its job fails (exit 5), or the pod is told to go
    (SIGTERM, as a drain, an eviction or a deletion gives it) while its job runs."""
    env = {"PATH": "/usr/bin:/bin", "TFL_K8S_ROLE": "worker", "JOB_COMPLETION_INDEX": "0"}
    args = [sys.executable, str(shim), *(["--sidecar"] if sidecar else []), "--", sys.executable, "-c"]
    if how == "fails":
        return subprocess.run([*args, "raise SystemExit(5)"], env=env, capture_output=True, timeout=60).returncode
    proc = subprocess.Popen([*args, "import time; print('up', flush=True); time.sleep(300)"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


@pytest.mark.parametrize(("role", "how", "expected"), [
    ("evaluator", "fails", "Succeeded"),  # as in a local run: recorded, training goes on, not made again
    ("evaluator", "told to go", "Ignore"),  # made again, not counted: a drained evaluator comes back
    ("evaluator", "lost with its node", "Ignore"),  # DisruptionTarget, no exit code
    ("worker", "fails", "Count"),  # backoffLimit 0: the Job fails, JobSet restarts the group (counted)
    ("worker", "lost with its node", "FailJob"),  # reason PodFailurePolicy: the group restarted, uncounted
])
def test_what_kubernetes_does_with_each_pod_s_end(shim: Path, tmp_path: Path, role: str, how: str,
                                                   expected: str) -> None:
    """The shim's real exit codes against the exported Job's podFailurePolicy, as the Job controller
    matches them: an evaluator never fails its Job (which would restart or fail the whole group)."""
    from tests.k8s_checks import pod_failure_verdict

    cluster = {"cluster": {"chief": ["c:2222"], "worker": ["w:2222"], "evaluator": ["e:2222"]}}
    (js,) = [d for d in export_jobset(tmp_path, cluster, []) if d["kind"] == "JobSet"]
    (job,) = [r["template"]["spec"] for r in js["spec"]["replicatedJobs"] if r["name"] == role]
    if how == "lost with its node":
        verdict = pod_failure_verdict(job, None, ("DisruptionTarget",))
    else:
        verdict = pod_failure_verdict(job, shim_exit(shim, role == "evaluator", how))
    assert verdict == expected



# The shim imported as it runs in a pod, its Popen made to bring the pod's SIGTERM while the job is being
# started: after the job exists, before the Popen call has returned. The job's pid goes to argv[2] first.
TOLD_WHILE_STARTING = """
import importlib.util, os, signal, subprocess, sys
spec = importlib.util.spec_from_file_location("entry", sys.argv[1])
entry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(entry)

class TermedWhileStarting(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with open(sys.argv[2] + ".tmp", "w") as f:
            f.write(str(self.pid))
        os.replace(sys.argv[2] + ".tmp", sys.argv[2])
        os.kill(os.getpid(), signal.SIGTERM)

entry.subprocess.Popen = TermedWhileStarting
sys.exit(entry.main(["--sidecar", "--", sys.executable, "-c", "import time; time.sleep(300)"]))
"""


def test_a_sidecar_told_to_go_while_its_job_starts_passes_it_on(shim: Path, tmp_path: Path) -> None:
    """The sidecar set its handlers once its job had started: a SIGTERM in between ended the shim
    at once (as a container's PID 1, the kernel dropped it), and the job ran on, never told."""
    script, pid_file, err_file = tmp_path / "told_while_starting.py", tmp_path / "job.pid", tmp_path / "err"
    script.write_text(TOLD_WHILE_STARTING)
    env = {"PATH": "/usr/bin:/bin", "TFL_K8S_ROLE": "worker", "JOB_COMPLETION_INDEX": "0"}  # the table has no evaluator
    with open(err_file, "w") as err:  # no pipe: a job left running would hold it open
        proc = subprocess.Popen([sys.executable, str(script), str(shim), str(pid_file)], env=env, stdout=err, stderr=err,
                                start_new_session=True)
    try:
        code = proc.wait(timeout=120)
        job_pid = int(pid_file.read_text())
        left = psutil.pid_exists(job_pid) and psutil.Process(job_pid).status() != psutil.STATUS_ZOMBIE
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the job, where the shim left it running
    said = err_file.read_text()
    assert code == 128 + signal.SIGTERM, said
    assert "worker:0 was told to stop (SIGTERM); it exited with -15, and the pod leaves with 143" in said
    assert not left
