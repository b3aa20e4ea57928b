"""The Ray backend: the `ray` description (pure), and runs on a private five-node Ray
cluster on loopback (the head, where tfl's launcher connects, and four task nodes) (``tests.ray_cluster``; each node its own raylet, told apart by node id).

The ``ray_cluster`` fixture proves at the end of the module that no Ray process is left and that
``os.environ`` is put back; ``cluster`` (the fixture the tests on the cluster take) proves after each
test that no actor of tfl's (a task runner) lives on the cluster, by pid; ``tfl_home`` that no
task of its runs is alive.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from launcher.describe.kinds import parse_description
from launcher.describe.spec import parse_cluster
from launcher.errors import ClusterFileError
from launcher.plan.tfconfig import tf_config
from tests.conftest import ROOT
from tests.jobkit_helpers import FASHION_RECORDS_JOB, HELD_JOB, Hold, assert_trained_on_the_shards
from tests.ray_cluster import RayCluster, stop_ray_cluster, task_runners
from tests.test_ssh import only_run, tfl, wait_for

MNIST = str(ROOT / "jobs" / "mnist.py")
EPOCH = re.compile(r"^epoch (\d+)/\d+ loss=", re.M)
TINY = """\
import json, os, sys, time
print("TF_CONFIG " + os.environ["TF_CONFIG"], flush=True)
print("attempt " + os.environ["TFL_ATTEMPT"] + " kit " + __import__("launcher").__file__, flush=True)
with open(os.environ["TFL_PROGRESS_FILE"], "w") as f:
    json.dump({"task": os.environ["TFL_TASK"]}, f)
if len(sys.argv) > 3 and os.environ["TFL_TASK"] == "chief:0" and not os.path.exists(sys.argv[3]):
    open(sys.argv[3], "w").close()  # once: as if another process had taken the port the actor released
    print("E0000 UNKNOWN: Could not start gRPC server: Address already in use", flush=True)
    sys.exit(1)
time.sleep(float(sys.argv[1]))
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""

# Saves its step on SIGTERM, or once another task has (the notice), in the run's shared model dir, as
# the job kit saves the agreed checkpoint; a new attempt starts from the saved step.
SAVER = """\
import json, os, signal, sys, time
task, attempt = os.environ["TFL_TASK"], int(os.environ["TFL_ATTEMPT"])
shared = os.environ["TFL_MODEL_DIR"]
os.makedirs(shared, exist_ok=True)
saved = os.path.join(shared, "saved-" + task.replace(":", "-"))
notice = os.path.join(shared, "notice-%d" % attempt)
step = int(open(saved).read()) if os.path.exists(saved) else 0
print("start", task, "attempt", attempt, "step", step, flush=True)

def save_and_leave(*_):
    open(notice, "a").close()
    with open(saved + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(saved + ".tmp", saved)
    progress = os.environ["TFL_PROGRESS_FILE"]
    with open(progress + ".tmp", "w") as f:
        json.dump({"task": task, "attempt": attempt, "phase": "preempted", "global_step": step}, f)
    os.replace(progress + ".tmp", progress)
    print("saved", task, "at step", step, flush=True)
    os._exit(170)

signal.signal(signal.SIGTERM, save_and_leave)
while step < int(sys.argv[1]):
    time.sleep(0.05)
    step += 1
    if os.path.exists(notice):
        save_and_leave()
"""


def description(tmp_path: Path, address: str, env: dict[str, str] | None = None, **ray: Any) -> Path:
    """A Ray description for the test cluster. The tasks' temp dirs go under ``tmp_path``: a task whose node
    is killed under it (its actor SIGKILLed by Ray) leaves its private temp dir (docs/security.md), and on
    this machine every node's temp dir would be /tmp."""
    path = tmp_path / "ray.json"
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    nodes_tmp = tmp_path / "nodes-tmp"
    nodes_tmp.mkdir(mode=0o700, exist_ok=True)
    path.write_text(json.dumps({"ray": {"address": address, "ready_timeout": 60, **ray}, "storage": {"path": str(shared)},
                                "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "TMPDIR": str(nodes_tmp), **(env or {})}}))
    return path


def tiny_job(tmp_path: Path) -> str:
    job = tmp_path / "job" / "tiny.py"
    job.parent.mkdir()
    job.write_text(TINY)
    return str(job)


@pytest.fixture
def cluster(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """The module's cluster; afterwards, proof by pid that no task runner (actor) of tfl's is left on it."""
    yield ray_cluster
    deadline = time.monotonic() + 60  # a hang guard: a killed actor's process exits within a second or two
    while (left := task_runners(ray_cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"tfl's Ray actors left alive on the cluster: {left}"


def record(home: Path, run: str) -> dict[str, Any]:
    """The run's record; {} until the launcher has written it (a detached one prepares the cluster first)."""
    try:
        return dict(json.loads((home / "runs" / run / "state.json").read_text()))
    except FileNotFoundError:
        return {}


# --- the description (pure) ----------------------------------------------------------------
@pytest.mark.parametrize("ray, expected", [
    ({"address": "nowhere"}, "ray.address: 'nowhere' is not a Ray address; write \"auto\""),
    ({"address": "ray://head:99999"}, "ray.address: 'ray://head:99999' is not a Ray address"),
    ({"workers": "2"}, "ray.workers: '2' is not a count of workers"),
    ({"workers": 0, "chief": False}, "a run needs at least one training task"),
    ({"placement": "STRICT_PACK"}, "ray.placement: 'STRICT_PACK' is not a placement; write one of STRICT_SPREAD, SPREAD, PACK"),
    ({"resources_per_task": {"CPU": -1}}, "ray.resources_per_task: CPU: -1 is not an amount"),
    ({"resources_per_task": {"GPU": 0}}, "ray.resources_per_task: asks for nothing"),
    ({"evaluator": 1}, "ray.evaluator: expected true or false"),
    ({"gpus": 1}, "ray.gpus: unknown key"),
])
def test_bad_fields_are_one_line_naming_the_field(ray: dict[str, Any], expected: str) -> None:
    with pytest.raises(ClusterFileError) as caught:
        parse_description({"ray": ray}, "ray.json")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("ray.json: ") and expected in message, message


def test_a_ray_block_with_hosts_is_refused() -> None:
    with pytest.raises(ClusterFileError, match="'hosts' cannot be used with 'ray'"):
        parse_description({"ray": {}, "hosts": {}}, "ray.json")


def test_defaults_and_the_dry_run_need_no_ray(tmp_path: Path, tfl_home: Path) -> None:
    """Without the extra (ray made unimportable): --dry-run prints the plan; a launch says how to install it, in one line."""
    path = description(tmp_path, "127.0.0.1:6379", workers=1, evaluator=True)
    job = tiny_job(tmp_path)
    spec = parse_description(json.loads(path.read_text()), "ray.json")
    assert (spec.ray.address, spec.ray.placement, spec.ray.bundle) == ("127.0.0.1:6379", "STRICT_SPREAD", {"CPU": 1.0})
    code = ("import sys; sys.modules['ray'] = None; sys.argv = ['tfl', *sys.argv[1:]]; "
            "from launcher.cli import main; main()")
    env = {"PATH": "/usr/bin:/bin", "TFL_HOME": str(tfl_home), "PYTHONPATH": str(ROOT)}
    dry = subprocess.run([sys.executable, "-c", code, "launch", job, "--cluster", str(path), "--dry-run"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "placement group tfl-tiny-" in dry.stdout and "3 bundles of {\"CPU\": 1.0}, STRICT_SPREAD" in dry.stdout
    assert all(f"  {t}  on a bundle of its own" in dry.stdout for t in ("chief:0", "worker:0", "evaluator:0"))
    run = subprocess.run([sys.executable, "-c", code, "launch", job, "--cluster", str(path)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode != 0 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "needs Ray, which is not installed here" in run.stderr and "uv sync --extra ray" in run.stderr
    assert "pip install 'tfl[ray]'" in run.stderr


def test_several_tasks_without_storage_are_refused(tmp_path: Path) -> None:
    (tmp_path / "ray.json").write_text(json.dumps({"ray": {"workers": 1}}))
    result = tfl(["launch", tiny_job(tmp_path), "--cluster", str(tmp_path / "ray.json")], {"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "a Ray run of several tasks needs storage every node sees" in result.stderr


def test_stopping_the_test_cluster_puts_the_environment_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the cluster set in this process (its nodes' cache, Ray's tmp dir and switches) is gone after
    its stop, and what it changed or removed is back: later tests see the environment they had."""
    before = dict(os.environ)

    class Stopped:
        def shutdown(self) -> None:
            pass

    found = RayCluster(Stopped(), str(tmp_path / "cluster"), before)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cluster" / "cache"))
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "cluster"))
    monkeypatch.setenv("PATH", "/nowhere")
    monkeypatch.delenv("HOME", raising=False)
    assert stop_ray_cluster(found) == []
    assert dict(os.environ) == before


# --- on a real Ray cluster -----------------------------------------------------------------
@pytest.mark.ray
def test_each_task_on_its_own_node_with_the_roles_ssh_gives_them(cluster: RayCluster, tmp_path: Path, tfl_home: Path,
                                                                   child_env: dict[str, str]) -> None:
    path = description(tmp_path, cluster.address, workers=1, evaluator=True)
    result = tfl(["launch", tiny_job(tmp_path), "--cluster", str(path), "--", "1"], child_env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tfl_home)
    plan = record(tfl_home, run)["plan"]
    nodes = plan["unit"]["nodes"]
    assert sorted(nodes) == ["chief:0", "evaluator:0", "worker:0"]
    assert len(set(nodes.values())) == 3 and set(nodes.values()) <= {n.node_id for n in cluster.task_nodes()}
    # TF_CONFIG as over SSH for the same roles, apart from hosts and ports: the addresses the actors reported.
    addresses = {t["task"]: f"{t['host']}:{t['port']}" for t in plan["tasks"]}
    ssh = parse_cluster({"cluster": {"chief": [addresses["chief:0"]], "worker": [addresses["worker:0"]],
                                     "evaluator": [addresses["evaluator:0"]]}}).cluster
    for task in plan["tasks"]:
        log = (tfl_home / "runs" / run / "logs" / f"{task['task'].replace(':', '-')}.log").read_text()
        seen = json.loads(log.split("TF_CONFIG ", 1)[1].splitlines()[0])
        kind, index = task["task"].split(":")
        assert seen == tf_config(ssh, parse_cluster_task(kind, int(index))), log
        assert "/tfl/ray/" in log and "/kit/launcher/__init__.py" in log  # the kit came with the run, not from this checkout
        progress = json.loads((tfl_home / "runs" / run / "progress" / f"{kind}-{index}.json").read_text())
        assert progress == {"task": task["task"]}  # relayed from the node to this machine


def parse_cluster_task(kind: str, index: int) -> Any:
    from launcher.tasks import TaskId

    return TaskId(kind, index)


def test_an_address_where_nothing_listens_is_one_line_within_seconds(tmp_path: Path, child_env: dict[str, str]) -> None:
    """Ray's own connect retries such an address for minutes, printing its C++ warnings."""
    pytest.importorskip("ray")
    from launcher.describe.ports import free_port

    address = f"127.0.0.1:{free_port()}"  # loopback, and nothing listens there
    path = description(tmp_path, address)
    started = time.monotonic()
    result = tfl(["launch", tiny_job(tmp_path), "--cluster", str(path), "--", "1"], child_env, timeout=60)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"tfl: error: ray.address {address}: nothing answers at {address} (Connection refused); start the cluster "
        "(`ray start --head`) or fix ray.address in the description"), result.stderr[-3000:]
    assert time.monotonic() - started < 30


def test_stop_of_a_run_whose_cluster_is_gone_names_it_and_the_run_can_then_be_removed(
        tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """Its launcher and its cluster gone (a `ray stop`, a reboot): `tfl stop` said 'start the cluster' and
    exited 2, and `tfl rm` refused a run whose tasks 'still run', so the record could never go."""
    pytest.importorskip("ray")
    from launcher.describe.ports import free_port
    from launcher.engines.ray.plan import RayUnit
    from launcher.records.states import RunState, TaskState
    from launcher.records.store import RunRecord, RunStore, TaskRecord

    address = f"127.0.0.1:{free_port()}"  # loopback, and nothing listens there
    store = RunStore(tfl_home)
    run = store.new_run_id("job")
    unit = RayUnit(address=address, placement="SPREAD", bundle={"CPU": 1.0}, ready_timeout=60.0, working_dir=str(tmp_path))
    tasks = [TaskRecord(task=t, host="10.0.0.7", backend="ray", log_path=str(tmp_path / f"{t}.log"),
                        progress_path=str(tmp_path / f"{t}.json"), state=TaskState.RUNNING, started=time.time())
             for t in ("chief:0", "worker:0")]
    store.create(RunRecord(run_id=run, job="job.py", job_args=[], run_dir=str(store.run_dir(run)), created=time.time(),
                           state=RunState.RUNNING, tasks=tasks, plan={"unit": {**unit.to_dict(), "kind": "ray"}, "tasks": []},
                           backend="ray"))
    refused = tfl(["rm", run], child_env, timeout=60)
    assert refused.returncode == 1 and "tasks of it still run" in refused.stdout, refused.stdout + refused.stderr
    stopped = tfl(["stop", run], child_env, timeout=60)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert stopped.stdout.splitlines() == [
        f"run {run}: stopped 0 process(es) left by a launcher that was gone",
        f"  not reached: the Ray cluster at {address}: ray.address {address}: nothing answers at {address} (Connection "
        "refused); nothing of the run runs there: its actors were its launcher's, and Ray ends an actor with its owner"], \
        stopped.stdout
    assert record(tfl_home, run)["state"] == "stopped"
    removed = tfl(["rm", run], child_env, timeout=60)
    assert removed.returncode == 0 and not store.run_dir(run).exists(), removed.stdout + removed.stderr


@pytest.mark.ray
@pytest.mark.parametrize("ray, expected", [
    ({"workers": 4}, "STRICT_SPREAD puts each of the 5 tasks on its own node and only 4 of the cluster's 5 nodes"),
    ({"resources_per_task": {"CPU": 1, "GPU": 1}}, "no node of the cluster has any GPU (fix ray.resources_per_task)"),
])
def test_an_infeasible_placement_is_one_line_not_a_hang(ray: dict[str, Any], expected: str, cluster: RayCluster,
                                                         tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    path = description(tmp_path, cluster.address, **{"ready_timeout": 3, **ray})
    started = time.monotonic()
    result = tfl(["launch", tiny_job(tmp_path), "--cluster", str(path), "--", "1"], child_env, timeout=120)
    assert result.returncode != 0 and len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert "was not ready within 3 s" in result.stderr and expected in result.stderr, result.stderr
    assert time.monotonic() - started < 100  # a hang guard, far above the expected figure


@pytest.mark.ray
def test_a_port_taken_before_tensorflow_binds_it_is_retried_once_on_new_ports(
        cluster: RayCluster, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    path = description(tmp_path, cluster.address, workers=1, placement="SPREAD")
    result = tfl(["launch", tiny_job(tmp_path), "--cluster", str(path), "--", "1", "0", str(tmp_path / "taken")],
                 child_env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tfl_home)
    assert record(tfl_home, run)["restarts"] == []  # not a restart: --max-restarts is 0
    chief = (tfl_home / "runs" / run / "logs" / "chief-0.log").read_text()
    assert "was taken before TensorFlow bound it; the training group starts again on new ports (once)" in chief
    configs = [json.loads(line.split("TF_CONFIG ", 1)[1]) for line in chief.splitlines() if line.startswith("TF_CONFIG ")]
    assert len(configs) == 2 and configs[0]["cluster"]["chief"] != configs[1]["cluster"]["chief"]


@pytest.mark.ray
def test_detach_status_logs_stop_then_resume_from_the_saved_step(cluster: RayCluster, tmp_path: Path, tfl_home: Path,
                                                                  child_env: dict[str, str]) -> None:
    """`--detach` returns once the run is recorded (Ray's preparation takes seconds: placement group, actors);
    `tfl stop` has every task save its step (shared storage) and leave; `tfl resume --detach` starts the
    next attempt on new actors and ports, from the saved step."""
    path = description(tmp_path, cluster.address, workers=1)
    job = tmp_path / "job" / "saver.py"
    job.parent.mkdir()
    job.write_text(SAVER)
    temp = tmp_path / "tmp"  # the launcher's temp dir: its copy of the kit is gone once Ray has it
    temp.mkdir(mode=0o700)
    result = tfl(["launch", str(job), "--cluster", str(path), "--detach", "--", "100000"], {**child_env, "TMPDIR": str(temp)},
                 timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    run = result.stdout.strip()
    assert record(tfl_home, run).get("launcher_pid"), "--detach returned before the run was recorded"
    try:
        wait_for(lambda: "start worker:0 attempt 0 step 0" in tfl(["logs", run, "--task", "worker:0"], child_env).stdout,
                 timeout=240)
        assert not list(temp.glob("tfl-ray-kit-*")), "the kit's copy stays while the run lives (and after a kill -9)"
        status = tfl(["status", run], child_env, timeout=120)
        assert status.returncode == 0 and status.stdout.count("127.0.0.1") >= 2, status.stdout + status.stderr
        assert "running" in status.stdout and "gone" not in status.stdout
        busy = tfl(["resume", run], child_env, timeout=120)
        assert busy.returncode == 2 and f"run {run} is still running" in busy.stderr, busy.stderr
    finally:
        stop = tfl(["stop", run], child_env, timeout=180)
    assert stop.returncode == 0, stop.stderr
    wait_for(lambda: record(tfl_home, run)["state"] == "stopped", timeout=120)
    assert tfl(["stop", run], child_env, timeout=120).returncode == 0  # idempotent
    after = tfl(["status", run], child_env, timeout=120)
    assert after.returncode == 0 and "stopped" in after.stdout, after.stdout
    saved = {t: int((tmp_path / "shared" / run / "model" / f"saved-{t}").read_text()) for t in ("chief-0", "worker-0")}
    assert saved["chief-0"] > 0 and saved["worker-0"] > 0, saved

    resumed = tfl(["resume", run, "--detach"], child_env, timeout=600)
    assert resumed.returncode == 0 and resumed.stdout.strip() == run, resumed.stderr[-3000:]
    assert record(tfl_home, run)["attempt"] == 1
    try:
        wait_for(lambda: all(f"start {t} attempt 1 step {saved[t.replace(':', '-')]}\n" in _log(tfl_home, run, t.replace(":", "-"))
                             for t in ("chief:0", "worker:0")), timeout=240)
    finally:
        again = tfl(["stop", run], child_env, timeout=180)
    assert again.returncode == 0, again.stderr
    wait_for(lambda: record(tfl_home, run)["state"] == "stopped", timeout=120)
    assert [r["kind"] for r in record(tfl_home, run)["restarts"]] == ["resume"]


def _log(home: Path, run: str, slug: str) -> str:
    try:
        return (home / "runs" / run / "logs" / f"{slug}.log").read_text()
    except FileNotFoundError:
        return ""


@pytest.mark.ray
@pytest.mark.slow
def test_mnist_with_an_evaluator_survives_the_loss_of_a_workers_node(cluster: RayCluster, tmp_path: Path,
                                                                      tfl_home: Path, child_env: dict[str, str]) -> None:
    """Chief, worker and evaluator each on a node of its own, a fourth node free; the worker's node dies
    mid-training (its raylet and every process on it killed): Ray places the lost bundle on the free node,
    the group restarts, resumes from the backup, and the run ends 0 with the evaluator's checkpoints evaluated."""
    hold = Hold(tmp_path / "hold", 45)  # the moment: chief and worker hold in epoch 2 (tests/jobs/held.py)
    path = description(tmp_path, cluster.address, env=hold.env, workers=1, evaluator=True)
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(HELD_JOB), "--cluster", str(path),
                                 "--max-restarts", "1", "--", MNIST, "--epochs", "4", "--steps-per-epoch", "40",
                                 "--batch-size", "16"], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        hold.wait(["chief:0", "worker:0"], alive=lambda: launcher.poll() is None,
                     why=lambda: launcher.communicate()[1][-4000:], timeout_s=500)
        run = only_run(tfl_home)
        nodes = record(tfl_home, run)["plan"]["unit"]["nodes"]
        assert len(set(nodes.values())) == 3
        cluster.kill_node(nodes["worker:0"])
        hold.release()
        out, err = launcher.communicate(timeout=600)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err[-3000:]
    # The chief's collective fails at once; Ray declares the node dead after its health checks (~15 s):
    # whichever tfl notices first is the restart's cause.
    assert re.search(r"restart 1: (chief|worker):0", err) and "(1 restart(s))" in err, err[-3000:]
    logs = tfl_home / "runs" / run / "logs"
    chief, worker = ((logs / f"{t}-0.log").read_text() for t in ("chief", "worker"))
    restored = [re.search(r"every training task restored the backup of epoch (\d+)", log.split("--- tfl: attempt 1")[1])
                for log in (chief, worker)]
    assert all(restored) and restored[0][1] == restored[1][1], (chief[-2000:], worker[-2000:])  # type: ignore[index]
    resumed = int(restored[0][1]) + 1  # type: ignore[index]
    assert [int(e) for e in EPOCH.findall(chief.split("--- tfl: attempt 1")[1])] == list(range(resumed, 5)) and resumed >= 2
    assert "eval checkpoint=ckpt-4" in (logs / "evaluator-0.log").read_text()
    assert list((tmp_path / "shared" / run / "model" / "checkpoints").glob("ckpt-4.index"))



@pytest.mark.ray
@pytest.mark.slow
def test_the_tfrecord_job_trains_from_shards(cluster: RayCluster, tmp_path: Path, tfl_home: Path,
                                             child_env: dict[str, str], fashion_shards: Path) -> None:
    """jobs/fashion_records.py unchanged on two Ray nodes (the shards on storage every node sees)."""
    path = description(tmp_path, cluster.address, workers=1)
    result = tfl(["launch", str(FASHION_RECORDS_JOB), "--cluster", str(path), "--", "--records", str(fashion_shards),
                  "--epochs", "2", "--steps-per-epoch", "5", "--batch-size", "8", "--window", "64"], child_env, timeout=500)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tfl_home)
    nodes = record(tfl_home, run)["plan"]["unit"]["nodes"]
    assert sorted(nodes) == ["chief:0", "worker:0"] and len(set(nodes.values())) == 2
    chief, worker = ((tfl_home / "runs" / run / "logs" / f"{t}-0.log").read_text() for t in ("chief", "worker"))
    assert_trained_on_the_shards(tmp_path / "shared" / run / "model", fashion_shards, chief, worker, epochs=2)
