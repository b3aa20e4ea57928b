"""tfl's Slurm backend end to end, on the private two-node cluster (tests/slurm_cluster.py):
submit and follow, --detach / status / stop, the salloc form, failures, restarts, pending.

The run dir (TFL_HOME) lies on this machine, which both nodes are: storage the nodes share.
Each test proves at its end that nothing of its job is left in Slurm's queue and that no task
process is alive (the ``tfl_home`` fixture checks every process of a run under it).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.records.states import TaskState
from launcher.records.store import RunStore
from tests.conftest import ROOT
from tests.jobkit_helpers import FASHION_RECORDS_JOB, assert_trained_on_the_shards
from tests.procs import tfl_processes
from tests.slurm_cluster import (
    LOST_NODE_MESSAGE_TIMEOUT,
    LOST_NODE_SLURMD_TIMEOUT,
    SlurmCluster,
    start_cluster,
    stop_cluster,
)
from tests.test_slurm_cluster import assert_job_gone

pytestmark = pytest.mark.slurm
MNIST = str(ROOT / "jobs" / "mnist.py")
EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+) loss=([0-9.]+)", re.M)
# Several TF processes share two cores: more threads only thrash.
TF_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
SLEEPER = """\
import os, sys, time
task, attempt = os.environ["TFL_TASK"], os.environ["TFL_ATTEMPT"]
print(f"{task} attempt {attempt} on {os.environ['SLURMD_NODENAME']}", flush=True)
if sys.argv[1] == "fail" and task == "worker:0":
    time.sleep(0.5)
    print("worker:0 gives up", flush=True)
    sys.exit(3)
time.sleep(float(sys.argv[2]))
"""
# A training task as MultiWorkerMirroredStrategy uses TF_CONFIG: it listens on its own address, on
# every interface as TensorFlow binds, and reaches every other training task at theirs (each answers
# with its name); then it waits until every peer has reached it, so that none leaves too early.
PEERS = """\
import json, os, socket, threading, time
config = json.loads(os.environ["TF_CONFIG"])
me = f"{config['task']['type']}:{config['task']['index']}"
tasks = {f"{kind}:{i}": address for kind in ("chief", "worker") for i, address in enumerate(config["cluster"].get(kind, []))}
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(tasks[me].rsplit(":", 1)[1])))
server.listen(8)
reached_me = threading.Semaphore(0)
def answer():
    while True:
        conn, _ = server.accept()
        conn.sendall(me.encode()); conn.close(); reached_me.release()
threading.Thread(target=answer, daemon=True).start()
for task, address in tasks.items():
    if task == me:
        continue
    host, port = address.rsplit(":", 1)
    for _ in range(600):
        try:
            with socket.create_connection((host, int(port)), timeout=2) as conn:
                said = conn.recv(64).decode()
            break
        except OSError:
            time.sleep(0.1)
    else:
        raise SystemExit(f"{me}: nothing at {address}")
    assert said == task, (said, task)
    print(f"{me} on {os.environ['SLURMD_NODENAME']} reached {task} at {address}", flush=True)
for _ in range(len(tasks) - 1):
    assert reached_me.acquire(timeout=120), f"{me}: a peer never reached {tasks[me]}"
"""


@pytest.fixture
def env(slurm_cluster: SlurmCluster, tfl_home: Path) -> dict[str, str]:
    return {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def mnist_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Offline data for jobs/mnist.py (scikit-learn's digits as MNIST), so no task tries the network.
    Session-scoped: cheap, and a module-scoped fixture would keep the module's tests on one worker (conftest)."""
    import numpy as np

    from launcher.jobkit.datasets import load_digits_as_mnist

    path = tmp_path_factory.mktemp("data") / "digits.npz"
    (x_train, y_train), (x_test, y_test) = load_digits_as_mnist()
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    return path


def description(tmp_path: Path, **slurm: Any) -> Path:
    path = tmp_path / "slurm.json"
    path.write_text(json.dumps({"slurm": {"nodes": 2, "tasks_per_node": 1, **slurm}, "env": TF_ENV}))
    return path


def sleeper(tmp_path: Path) -> str:
    job = tmp_path / "sleeper.py"
    job.write_text(SLEEPER)
    return str(job)


def tfl(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def status(env: dict[str, str], run: str) -> dict[str, Any]:
    done = tfl(env, "status", run, "--json", timeout=60)
    assert done.returncode == 0, done.stderr
    view: dict[str, Any] = json.loads(done.stdout)
    return view


def wait_status(env: dict[str, str], run: str, ready: Any, timeout: float = 120, *, running: int = 0) -> dict[str, Any]:
    """`tfl status --json` of `run` once `ready(view)`. With `running`, first the run record (read here,
    no process) until that many of its tasks are recorded running: each `tfl status` is a process start
    (~0.5 s of CPU), and polling it every half second while Slurm starts the steps cost seconds of CPU."""
    deadline = time.monotonic() + timeout
    if running:
        store = RunStore(Path(env["TFL_HOME"]))
        while sum(t.state is TaskState.RUNNING for t in store.load(run).tasks) < running:
            assert time.monotonic() < deadline, f"run {run}: never {running} tasks recorded running: {store.load(run)}"
            time.sleep(0.1)
    view = status(env, run)
    while not ready(view):
        assert time.monotonic() < deadline, f"run {run} never got there: {view}"
        time.sleep(0.5)
        view = status(env, run)
    return view


def only_run(home: Path) -> Path:
    (run,) = list((home / "runs").iterdir())
    return run


def epochs(log: Path) -> list[tuple[int, float]]:
    text = log.read_text() if log.exists() else ""
    return [(int(m[1]), float(m[3])) for m in EPOCH_LINE.finditer(text)]


def job_id_of(run: Path) -> str:
    job_id: str = json.loads((run / "state.json").read_text())["backend_data"]["job_id"]
    return job_id


def assert_all_gone(cluster: SlurmCluster, job_id: str) -> None:
    assert_job_gone(cluster, job_id)
    cluster.wait_for("the cluster's job processes to end", lambda: not cluster.job_processes(), timeout=30)


@pytest.mark.slow
def test_mnist_on_two_nodes_with_an_evaluator_survives_a_killed_task(
        slurm_cluster: SlurmCluster, env: dict[str, str], tfl_home: Path, tmp_path: Path, mnist_data: Path) -> None:
    """Across both nodes: a worker killed with -9 mid-epoch 2, the training group restarted in the
    same allocation (--max-restarts 1), resumed from the shared model dir; the evaluator ran on."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launcher", "launch", MNIST, "--cluster", str(description(tmp_path, evaluator=True)),
         "--max-restarts", "1", "--evaluator-timeout", "120",
         "--", "--epochs", "3", "--steps-per-epoch", "40", "--batch-size", "32", "--data", str(mnist_data)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        kill_worker_after_epoch_1(tfl_home, launcher)
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
            launcher.communicate(timeout=60)
    assert launcher.returncode == 0, err[-3000:]
    assert "restart 1: worker:0 on n2: killed by SIGKILL" in err, err[-3000:]  # not the chief srun then stopped (root_cause)
    run = only_run(tfl_home)
    logs = run / "logs"
    first, second = (logs / "chief-0.log").read_text().split("--- tfl: attempt 1 of chief:0")
    reached = max(int(m[1]) for m in EPOCH_LINE.finditer(first))
    # srun's --kill-on-bad-exit SIGTERM, if it came before the chief's collective failed on the dead peer,
    # was the teardown it is, not a notice (jobkit/notice.py: the gone peer)
    assert "jobkit: preemption notice" not in first, first[-3000:]
    resumed = [int(m[1]) for m in EPOCH_LINE.finditer(second)]
    assert resumed and resumed[0] >= max(2, reached) and resumed[-1] == 3  # from the shared model dir, not epoch 1
    worker_second = (logs / "worker-0.log").read_text().split("--- tfl: attempt 1 of worker:0")[1]
    assert epochs_in(second) == epochs_in(worker_second)  # one training group: the same epochs, the same loss
    assert "MultiWorkerMirroredStrategy replicas=2" in second
    evaluator = (logs / "evaluator-0.log").read_text()
    assert "eval checkpoint=" in evaluator and evaluator.count("jobkit: task=evaluator:0") == 1  # not restarted
    assert list((run / "model" / "tensorboard" / "eval").rglob("events.out.tfevents*"))
    for task in ("chief:0", "worker:0", "evaluator:0"):  # streamed to the console with the usual prefixes
        assert re.search(rf"^\[{task}\] +", out, re.M), task
    view = status(env, run.name)
    assert view["state"] == "succeeded" and view["backend"] == "slurm" and view["restarts"] == 1
    assert view["backend_state"]["job"] == job_id_of(run) and view["backend_state"]["state"] == "COMPLETED"
    assert {t["task"]: (t["host"], t["exit_code"], t["attempt"]) for t in view["tasks"][:2]} == {
        "chief:0": ("n1", 0, 1), "worker:0": ("n2", 0, 1)}
    assert view["tasks"][2]["exit_code"] == 0 and view["tasks"][0]["progress"]["phase"] == "done"
    assert_all_gone(slurm_cluster, job_id_of(run))


def kill_worker_after_epoch_1(home: Path, launcher: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 240
    while not list(home.glob("runs/*/logs/chief-0.log")) or len(epochs(only_run(home) / "logs" / "chief-0.log")) < 1:
        assert time.monotonic() < deadline and launcher.poll() is None, "epoch 1 never ended"
        time.sleep(0.1)
    (victim,) = [p for p in tfl_processes(home=str(home)) if p.environ().get("TFL_TASK") == "worker:0"]
    victim.send_signal(signal.SIGKILL)  # mid-epoch 2: epoch 1 has been backed up


def epochs_in(text: str) -> list[tuple[int, float]]:
    return [(int(m[1]), float(m[3])) for m in EPOCH_LINE.finditer(text)]


def test_detach_status_stop(slurm_cluster: SlurmCluster, env: dict[str, str], tfl_home: Path, tmp_path: Path) -> None:
    done = tfl(env, "launch", sleeper(tmp_path), "--cluster", str(description(tmp_path, evaluator=True)), "--detach",
               "--", "sleep", "300")
    assert done.returncode == 0, done.stderr
    run = done.stdout.strip()
    view = wait_status(env, run, lambda v: v["alive"] == 3 and "slurm" not in {t["host"] for t in v["tasks"]}, running=3)
    assert view["state"] == "running" and view["backend_state"]["state"] == "RUNNING"
    assert {t["task"]: t["host"] for t in view["tasks"]} == {"chief:0": "n1", "worker:0": "n2",
                                                               "evaluator:0": view["tasks"][2]["host"]}
    text = tfl(env, "status", run)
    assert f"  slurm: job {view['backend_state']['job']}, state RUNNING, nodes n[1-2]" in text.stdout
    job_id = view["backend_state"]["job"]
    stopped = tfl(env, "stop", run)
    assert stopped.returncode == 0 and stopped.stdout.strip() == f"run {run}: stopped", stopped.stderr
    assert_all_gone(slurm_cluster, job_id)
    assert not tfl_processes(run_id=run)
    view = status(env, run)
    assert view["state"] == "stopped" and view["backend_state"]["state"] == "CANCELLED"
    again = tfl(env, "stop", run)  # idempotent
    assert again.returncode == 0 and "nothing to stop" in again.stdout
    logs = tfl(env, "logs", run)
    assert "[chief:0]     chief:0 attempt 0 on n1" in logs.stdout


def test_salloc_form(slurm_cluster: SlurmCluster, env: dict[str, str], tfl_home: Path, tmp_path: Path) -> None:
    """tfl inside an allocation: the tasks' steps start in it, and the TF_CONFIG each gets is one
    whose addresses its peers listen on and reach (a stand-in that does what MultiWorkerMirroredStrategy
    needs of it: bind its own address, connect to the others'). Real TensorFlow trains on these nodes in
    test_mnist_on_two_nodes_with_an_evaluator_survives_a_killed_task; the steps' start is the one difference."""
    job = tmp_path / "peers.py"
    job.write_text(PEERS)
    done = subprocess.run(["salloc", "-N", "2", "--ntasks-per-node", "1", sys.executable, "-m", "launcher", "launch",
                           str(job), "--slurm"], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    run = only_run(tfl_home)
    chief, worker = ((run / "logs" / f"{task}.log").read_text() for task in ("chief-0", "worker-0"))
    assert re.search(r"^chief:0 on n1 reached worker:0 at 127\.0\.0\.1:\d+$", chief, re.M), chief
    assert re.search(r"^worker:0 on n2 reached chief:0 at 127\.0\.0\.1:\d+$", worker, re.M), worker
    view = status(env, run.name)
    assert view["state"] == "succeeded" and view["backend_state"]["batch script"] == "ended"
    assert {t["task"]: t["host"] for t in view["tasks"]} == {"chief:0": "n1", "worker:0": "n2"}
    allocation = re.search(r"Granted job allocation (\d+)", done.stderr)
    assert allocation and view["backend_state"]["allocation"] == allocation[1]
    assert_all_gone(slurm_cluster, allocation[1])


def test_stop_inside_an_allocation_stops_the_steps_not_the_allocation(
        slurm_cluster: SlurmCluster, env: dict[str, str], tfl_home: Path, tmp_path: Path) -> None:
    salloc = subprocess.Popen(["salloc", "-N", "2", "--ntasks-per-node", "1", sys.executable, "-m", "launcher", "launch",
                               sleeper(tmp_path), "--slurm", "--evaluator", "--max-restarts", "2", "--", "ok", "300"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        slurm_cluster.wait_for("the run", lambda: list(tfl_home.glob("runs/*/state.json")) != [])
        run = only_run(tfl_home).name
        view = wait_status(env, run, lambda v: v["alive"] == 3, running=3)
        allocation = view["backend_state"]["allocation"]
        assert view["backend_state"]["batch script"] == "running"
        stopped = tfl(env, "stop", run)
        assert stopped.returncode == 0 and stopped.stdout.strip() == f"run {run}: stopped", stopped.stderr
        _, err = salloc.communicate(timeout=60)
    finally:
        if salloc.poll() is None:
            salloc.send_signal(signal.SIGINT)
            salloc.communicate(timeout=60)
    assert salloc.returncode == 130, err  # tfl's exit code for a stopped run, passed on by salloc
    assert f"tfl: run {run} stopped by the user" in err
    # SIGTERM reached the tasks through scancel --signal (143, not srun's abort), and no restart followed
    events = (only_run(tfl_home) / "slurm" / "events").read_text().splitlines()
    assert "training 0 exit 143" in events and "training 1 start" not in events
    assert status(env, run)["state"] == "stopped"
    assert_all_gone(slurm_cluster, allocation)


def test_each_task_sees_its_own_gpus(slurm_cluster: SlurmCluster, env: dict[str, str], tfl_home: Path, tmp_path: Path) -> None:
    if slurm_cluster.gpus_per_node < 2:
        pytest.skip("the test cluster has no fake GPUs here (mknod needs root)")
    job = tmp_path / "gpus.py"
    job.write_text("import os\nprint('gpus', os.environ['TFL_TASK'], os.environ['SLURMD_NODENAME'], "
                   "os.environ.get('CUDA_VISIBLE_DEVICES'), flush=True)\n")
    done = tfl(env, "launch", str(job), "--cluster", str(description(tmp_path, evaluator=True, gpus_per_task=1)),
               "--evaluator-timeout", "5")
    assert done.returncode == 0, done.stderr
    seen = {m[1]: (m[2], m[3]) for m in re.finditer(r"^\[\S+\] +gpus (\S+) (\S+) (\S+)$", done.stdout, re.M)}
    assert set(seen) == {"chief:0", "worker:0", "evaluator:0"} and {g for _, g in seen.values()} <= {"0", "1"}
    on_its_node = next(g for t, (n, g) in seen.items() if t != "evaluator:0" and n == seen["evaluator:0"][0])
    assert on_its_node != seen["evaluator:0"][1]  # Slurm's binding (--gpus-per-task=1): one GPU each
    assert "#SBATCH --gpus-per-task=1" in (only_run(tfl_home) / "slurm" / "job.sbatch").read_text()
    assert_all_gone(slurm_cluster, job_id_of(only_run(tfl_home)))


def test_failed_task_is_named_with_its_node(slurm_cluster: SlurmCluster, env: dict[str, str], tfl_home: Path,
                                            tmp_path: Path) -> None:
    done = tfl(env, "launch", sleeper(tmp_path), "--cluster", str(description(tmp_path)), "--", "fail", "300")
    assert done.returncode == 1, done.stderr
    run = only_run(tfl_home)
    assert f"tfl: run {run.name} failed after" in done.stderr and "worker:0 on n2 failed: exit code 3" in done.stderr
    cause = re.search(r"  root cause: worker:0 on n2 \(pid \d+\) exit code 3; last lines of its log:\n(.*)\n(.*)\n", done.stderr)
    assert cause and cause[2] == "    | worker:0 gives up", done.stderr
    assert "  stopped because of it: chief:0" in done.stderr
    assert_all_gone(slurm_cluster, job_id_of(run))


def test_pending_job_shows_its_reason(slurm_cluster: SlurmCluster, env: dict[str, str], tfl_home: Path,
                                      tmp_path: Path) -> None:
    holder = slurm_cluster.sbatch("--nodes=1", "--nodelist=n1", "--exclusive", "--output=/dev/null", "--wrap", "srun sleep 300")
    try:
        slurm_cluster.wait_state(holder, "RUNNING")
        done = tfl(env, "launch", sleeper(tmp_path), "--cluster", str(description(tmp_path)), "--detach", "--", "ok", "300")
        assert done.returncode == 0, done.stderr
        run = done.stdout.strip()
        view = wait_status(env, run, lambda v: v["backend_state"].get("reason") == "Resources", timeout=60)
        assert view["state"] == "pending" and view["backend_state"]["state"] == "PENDING" and view["alive"] == 0  # not "running"
        assert [t["state"] for t in view["tasks"]] == ["pending", "pending"]
        assert "  slurm: job " in tfl(env, "status", run).stdout and ", state PENDING, reason Resources" in tfl(env, "status", run).stdout
        assert tfl(env, "stop", run).returncode == 0
        assert_job_gone(slurm_cluster, view["backend_state"]["job"])
        assert status(env, run)["state"] == "stopped"
    finally:
        slurm_cluster.run("scancel", holder, check=False)
    assert_all_gone(slurm_cluster, holder)


def test_unknown_partition_is_one_line_before_the_run_exists(slurm_cluster: SlurmCluster, env: dict[str, str],
                                                              tfl_home: Path, tmp_path: Path) -> None:
    queue = slurm_cluster.queue()
    done = tfl(env, "launch", sleeper(tmp_path), "--cluster", str(description(tmp_path, partition="nosuch")), "--", "ok", "1")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("tfl: error: slurm: sbatch refused the job: Invalid partition name specified; the slurm block "
                           "names a partition this cluster does not have (`sinfo -s` lists them)\n")
    assert not (tfl_home / "runs").exists() or not list((tfl_home / "runs").iterdir())
    assert slurm_cluster.queue() == queue


def test_node_failure_is_named(slurm_cluster: SlurmCluster, tfl_home: Path, tmp_path: Path) -> None:
    """On a cluster of its own (``slurm_cluster`` only for its skip/fail rule): a node set DOWN
    under a running job may leave Slurm's books on that node unsettled for a while."""
    cluster = start_cluster(tmp_path / "slurm")
    env = {**cluster.env, "TFL_HOME": str(tfl_home)}
    try:
        launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", sleeper(tmp_path), "--cluster",
                                     str(description(tmp_path)), "--", "ok", "300"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            cluster.wait_for("both tasks", lambda: len(list(tfl_home.glob("runs/*/slurm/tasks/*.json"))) == 2)
            cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=tfl-test")
            _, err = launcher.communicate(timeout=120)
        finally:
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGINT)
                launcher.communicate(timeout=60)
        assert launcher.returncode == 1, err
        job_id = job_id_of(only_run(tfl_home))
        assert (f": worker:0 on n2 failed: node n2 failed: Slurm ended job {job_id} (NODE_FAIL); "
                "`sinfo -R` says why") in err
        assert_job_gone(cluster, job_id)
    finally:
        stop_cluster(cluster)


def test_a_node_whose_slurmd_dies_is_named_with_when_slurm_noticed_and_its_task_goes_when_it_is_back(
        slurm_cluster: SlurmCluster, tfl_home: Path, tmp_path: Path) -> None:
    """n2's slurmd killed mid-run: slurmctld takes n2 down (Not responding) within SlurmdTimeout,
    the job ends NODE_FAIL, tfl names n2 with when Slurm noticed. The task there outlives its
    slurmd (a partition); once n2's slurmd is back, Slurm ends what is left of the job there."""
    from tests.slurm_cluster import SBIN, _daemon

    cluster = start_cluster(tmp_path / "slurm", slurmd_timeout=LOST_NODE_SLURMD_TIMEOUT,
                            message_timeout=LOST_NODE_MESSAGE_TIMEOUT)
    env = {**cluster.env, "TFL_HOME": str(tfl_home)}
    try:
        launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", sleeper(tmp_path), "--cluster",
                                     str(description(tmp_path)), "--", "ok", "600"],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        try:
            cluster.wait_for("both tasks", lambda: len(list(tfl_home.glob("runs/*/slurm/tasks/*.json"))) == 2)
            cluster.procs["n2"].kill()
            cluster.procs["n2"].wait(10)
            _, err = launcher.communicate(timeout=240)
        finally:
            if launcher.poll() is None:
                launcher.send_signal(signal.SIGINT)
                launcher.communicate(timeout=60)
        assert launcher.returncode == 1, err
        job_id = job_id_of(only_run(tfl_home))
        assert f"worker:0 on n2 failed: node n2 failed: Slurm ended job {job_id} (NODE_FAIL)" in err, err
        timeout = f"SlurmdTimeout = {LOST_NODE_SLURMD_TIMEOUT} sec"
        assert re.search(rf"Slurm (marked n2 down at \d\d:\d\d:\d\d \(Not responding, at most {timeout} "
                         rf"after its slurmd fell silent\)|found n2 not responding at \d\d:\d\d:\d\d \(its slurmd "
                         rf"silent for {timeout}\))", err), err
        cluster.procs["n2"] = _daemon(cluster, "slurmd-n2", [str(SBIN / "slurmd"), "-D", "-N", "n2"])
        cluster.wait_for("the lost node's task ended by Slurm", lambda: tfl_processes(run_id=only_run(tfl_home).name) == [],
                         timeout=120)
    finally:
        stop_cluster(cluster)


@pytest.mark.slow
def test_the_tfrecord_job_trains_from_shards_on_two_nodes(slurm_cluster: SlurmCluster, env: dict[str, str], tfl_home: Path,
                                                          tmp_path: Path, fashion_shards: Path) -> None:
    """jobs/fashion_records.py unchanged as one Slurm job over both nodes (the shards on storage both see)."""
    done = tfl(env, "launch", str(FASHION_RECORDS_JOB), "--cluster", str(description(tmp_path)), "--", "--records",
               str(fashion_shards), "--epochs", "2", "--steps-per-epoch", "5", "--batch-size", "8", "--window", "64",
               timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    run = only_run(tfl_home)
    assert_trained_on_the_shards(run / "model", fashion_shards, (run / "logs" / "chief-0.log").read_text(),
                                 (run / "logs" / "worker-0.log").read_text(), epochs=2)
    view = status(env, run.name)
    assert view["state"] == "succeeded" and view["backend"] == "slurm"
    assert {t["task"]: t["host"] for t in view["tasks"]} == {"chief:0": "n1", "worker:0": "n2"}
    assert_all_gone(slurm_cluster, job_id_of(run))
