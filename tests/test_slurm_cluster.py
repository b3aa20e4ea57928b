"""The private two-node Slurm cluster (tests/slurm_cluster.py) and tfl's batch script on it.

Each test proves at its end that none of its job's processes is left.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import pytest

from launcher.engines.slurm.jobstate import (
    CommandResult,
    SrunTaskFailure,
    parse_scontrol_job,
    parse_srun_failures,
    query_job,
    query_steps,
    root_cause,
    scontrol_command,
)
from launcher.engines.slurm.node.nodes import port_block
from launcher.engines.slurm.script import BatchJob, render_batch_script, sbatch_command
from launcher.engines.slurm.settings import SlurmSettings
from tests.slurm_cluster import SlurmCluster, cluster_processes, start_cluster, stop_cluster

pytestmark = pytest.mark.slurm


def runner(cluster: SlurmCluster) -> Callable[[Sequence[str]], CommandResult]:
    def run(argv: Sequence[str]) -> CommandResult:
        done = cluster.run(*argv, check=False)
        return CommandResult(done.returncode, done.stdout, done.stderr)
    return run


def job_processes(cluster: SlurmCluster, job_id: str) -> list[psutil.Process]:
    """Live task processes of one job (their environment names the job)."""
    found = []
    for proc in cluster.job_processes():
        try:
            if proc.environ().get("SLURM_JOB_ID") == job_id:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def assert_job_gone(cluster: SlurmCluster, job_id: str) -> None:
    cluster.wait_for(f"job {job_id} to leave the queue", lambda: job_id not in cluster.queue(), timeout=30)
    cluster.wait_for(f"job {job_id}'s processes to end", lambda: not job_processes(cluster, job_id), timeout=30)


def test_two_node_job_runs_a_step_on_each_node(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job_id = slurm_cluster.sbatch("--nodes=2", "--ntasks-per-node=1", f"--output={out}", "--wrap",
                                  "srun --ntasks=2 bash -c 'echo $SLURM_PROCID $SLURMD_NODENAME'")
    assert job_id.isdigit()
    assert slurm_cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED") == "COMPLETED"
    assert sorted(out.read_text().splitlines()) == ["0 n1", "1 n2"]
    assert slurm_cluster.run("scontrol", "show", "hostnames", "n[1-2]").stdout.split() == ["n1", "n2"]
    assert [slurm_cluster.node_addr(n) for n in slurm_cluster.nodes] == ["127.0.0.1", "127.0.0.1"]
    state = query_job(job_id, runner(slurm_cluster))
    assert state is not None and (state.state, state.nodelist, state.source) == ("COMPLETED", "n[1-2]", "squeue")
    assert_job_gone(slurm_cluster, job_id)


def test_pending_on_resources(slurm_cluster: SlurmCluster) -> None:
    holder = slurm_cluster.sbatch("--nodes=1", "--nodelist=n1", "--exclusive", "--output=/dev/null", "--wrap", "srun sleep 300")
    slurm_cluster.wait_state(holder, "RUNNING")
    waiting = slurm_cluster.sbatch("--nodes=2", "--output=/dev/null", "--wrap", "true")
    # Reason=None until the scheduler has looked at the job (about a second here).
    slurm_cluster.wait_for("a pending reason", lambda: slurm_cluster.job_field(waiting, "%r") != "None", timeout=30)
    state = query_job(waiting, runner(slurm_cluster))
    assert state is not None and (state.state, state.reason, state.nodelist) == ("PENDING", "Resources", None)
    scontrol = slurm_cluster.run("scontrol", "show", "job", "-o", waiting).stdout
    assert "JobState=PENDING Reason=Resources" in scontrol
    slurm_cluster.run("scancel", waiting, holder)
    for job_id in (waiting, holder):
        assert_job_gone(slurm_cluster, job_id)


def test_scancel_leaves_nothing(slurm_cluster: SlurmCluster) -> None:
    job_id = slurm_cluster.sbatch("--nodes=2", "--ntasks-per-node=1", "--output=/dev/null", "--wrap",
                                  "srun --job-name=training sleep 300")
    slurm_cluster.wait_state(job_id, "RUNNING")
    slurm_cluster.wait_for("both sleeps", lambda: sum(p.name() == "sleep" for p in job_processes(slurm_cluster, job_id)) == 2)
    assert sorted(s.name for s in query_steps(job_id, runner(slurm_cluster))) == ["batch", "training"]
    slurm_cluster.run("scancel", job_id)
    assert_job_gone(slurm_cluster, job_id)
    state = query_job(job_id, runner(slurm_cluster))
    assert state is not None and state.state == "CANCELLED" and state.is_terminal
    assert slurm_cluster.run("scancel", job_id, check=False).returncode == 0  # cancelling twice is fine
    assert query_steps(job_id, runner(slurm_cluster)) == []


def test_unknown_partition_is_refused_and_too_many_nodes_pend(slurm_cluster: SlurmCluster) -> None:
    refused = slurm_cluster.run("sbatch", "--parsable", "--partition=nosuch", "--wrap", "true", check=False)
    assert refused.returncode == 1 and "Invalid partition name specified" in refused.stderr
    job_id = slurm_cluster.sbatch("--nodes=3", "--output=/dev/null", "--wrap", "true")
    slurm_cluster.wait_for("a pending reason", lambda: slurm_cluster.job_field(job_id, "%r") != "None", timeout=30)
    # Accepted, never started: 22.05 says PartitionConfig at first, PartitionNodeLimit later.
    assert slurm_cluster.job_field(job_id, "%T|%r") in ("PENDING|PartitionConfig", "PENDING|PartitionNodeLimit")
    slurm_cluster.run("scancel", job_id)
    assert_job_gone(slurm_cluster, job_id)


def test_salloc_runs_a_command_without_a_terminal(slurm_cluster: SlurmCluster) -> None:
    done = slurm_cluster.run("salloc", "--nodes=2", "--ntasks-per-node=1", "bash", "-c",
                             "echo alloc=$SLURM_JOB_ID tasks=$SLURM_TASKS_PER_NODE; srun printenv SLURMD_NODENAME; exit 3", check=False)
    assert done.returncode == 3, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0].startswith("alloc=") and lines[0].endswith("tasks=1(x2)") and sorted(lines[1:3]) == ["n1", "n2"]
    job_id = lines[0].split()[0].removeprefix("alloc=")
    assert_job_gone(slurm_cluster, job_id)


# A stand-in for a training job: records what its task saw, then behaves as its mode says.
FAKE_JOB = """\
import json, os, signal, sys, time
task, attempt, run_dir = os.environ["TFL_TASK"], os.environ["TFL_ATTEMPT"], os.environ["TFL_RUN_DIR"]
print(json.dumps({"task": task, "node": os.environ["SLURMD_NODENAME"], "attempt": attempt, "args": sys.argv[1:],
                  "tf_config": json.loads(os.environ["TF_CONFIG"]), "note": os.environ.get("NOTE"),
                  "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}), flush=True)


def wait_for_log(slug, text):
    log, deadline = os.path.join(run_dir, "logs", slug + ".log"), time.time() + 60
    while not (os.path.exists(log) and text in open(log).read()) and time.time() < deadline:
        time.sleep(0.1)


if task == "evaluator:0":
    signal.signal(signal.SIGTERM, lambda *_: (print("evaluator stopped", flush=True), sys.exit(0)))
    while True:
        time.sleep(0.1)
if sys.argv[1] == "fail-once" and attempt == "0":
    if task == "worker:0":
        wait_for_log("chief-0", '"attempt": "0"')  # the chief has started this attempt too
        sys.exit(3)
    time.sleep(300)  # the chief: --kill-on-bad-exit must end it
if sys.argv[2] == "with-evaluator" and task == "chief:0":
    wait_for_log("evaluator-0", "evaluator:0")  # training must not end before the evaluator ran
"""


def submit_tfl_script(cluster: SlurmCluster, tmp_path: Path, mode: str, evaluator: bool, restarts: int,
                      **slurm: int) -> tuple[str, Path]:
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "slurm").mkdir()
    job = tmp_path / "fake_job.py"
    job.write_text(FAKE_JOB)
    settings = SlurmSettings.model_validate({"nodes": 2, "tasks_per_node": 1, "evaluator": evaluator, **slurm})
    batch = BatchJob(settings=settings, job=str(job), job_args=(mode, "with-evaluator" if evaluator else "alone"),
                     run_id="fake-1", run_dir=str(run_dir), env={"NOTE": "a 'quoted' note"},
                     python=sys.executable, cwd=str(tmp_path), max_restarts=restarts, evaluator_timeout=1.0)
    script = run_dir / "job.sbatch"
    script.write_text(render_batch_script(batch))
    return cluster.run(*sbatch_command(batch), str(script)).stdout.strip(), run_dir


def records(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_tfl_batch_script_gives_each_task_its_tf_config(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id, run_dir = submit_tfl_script(slurm_cluster, tmp_path, "ok", evaluator=True, restarts=0)
    state = slurm_cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=120)
    batch_log = (run_dir / "slurm" / f"batch-{job_id}.out").read_text()
    assert state == "COMPLETED", batch_log
    base = port_block(int(job_id))
    training = {"chief": [f"127.0.0.1:{base}"], "worker": [f"127.0.0.1:{base + 1}"]}
    chief, worker, evaluator = (records(run_dir / "logs" / f"{t}.log") for t in ("chief-0", "worker-0", "evaluator-0"))
    assert chief == [{"task": "chief:0", "node": "n1", "attempt": "0", "args": ["ok", "with-evaluator"], "note": "a 'quoted' note",
                      "tf_config": {"cluster": training, "task": {"type": "chief", "index": 0}}, "gpus": None}]
    assert (worker[0]["node"], worker[0]["tf_config"]) == ("n2", {"cluster": training, "task": {"type": "worker", "index": 0}})
    ev_config = evaluator[0]["tf_config"]
    assert isinstance(ev_config, dict) and ev_config["task"] == {"type": "evaluator", "index": 0}
    assert ev_config["cluster"]["evaluator"] == [f"127.0.0.1:{base + 31}"]
    # Training ended, so the script stopped the evaluator; it did not decide the result.
    assert "evaluator stopped" in (run_dir / "logs" / "evaluator-0.log").read_text()
    assert_job_gone(slurm_cluster, job_id)


def test_tfl_batch_script_gives_each_task_its_own_gpu(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    if slurm_cluster.gpus_per_node < 2:
        pytest.skip("the test cluster has no fake GPUs here (mknod needs root)")
    job_id, run_dir = submit_tfl_script(slurm_cluster, tmp_path, "ok", evaluator=True, restarts=0, gpus_per_task=1)
    state = slurm_cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=120)
    assert state == "COMPLETED", (run_dir / "slurm" / f"batch-{job_id}.out").read_text()
    seen = {t: records(run_dir / "logs" / f"{t}.log")[0] for t in ("chief-0", "worker-0", "evaluator-0")}
    assert {r["gpus"] for r in seen.values()} <= {"0", "1"}
    on_evaluator_node = next(r for t, r in seen.items() if t != "evaluator-0" and r["node"] == seen["evaluator-0"]["node"])
    assert on_evaluator_node["gpus"] != seen["evaluator-0"]["gpus"]  # Slurm's binding: one GPU each
    assert_job_gone(slurm_cluster, job_id)


def test_tfl_batch_script_restarts_the_training_group(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    started = time.monotonic()
    job_id, run_dir = submit_tfl_script(slurm_cluster, tmp_path, "fail-once", evaluator=False, restarts=1)
    state = slurm_cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=120)
    batch_log = (run_dir / "slurm" / f"batch-{job_id}.out").read_text()
    assert state == "COMPLETED", batch_log
    assert time.monotonic() - started < 100  # the chief's 300 s sleep was cut short by --kill-on-bad-exit
    assert "tfl: training step failed (exit 143); restart 1 of 1" in batch_log  # srun's status: the largest
    srun_err = (run_dir / "slurm" / "training-0.err").read_text()
    assert root_cause(parse_srun_failures(srun_err)) == SrunTaskFailure("n2", (1,), "Exited with exit code 3", 3)
    for task in ("chief-0", "worker-0"):
        assert [r["attempt"] for r in records(run_dir / "logs" / f"{task}.log")] == ["0", "1"]
    assert_job_gone(slurm_cluster, job_id)


def test_tfl_batch_script_fails_after_the_last_restart(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id, run_dir = submit_tfl_script(slurm_cluster, tmp_path, "fail-once", evaluator=False, restarts=0)
    assert slurm_cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=120) == "FAILED"
    state = query_job(job_id, runner(slurm_cluster))
    assert state is not None and state.state == "FAILED"
    if state.exit_code is None:  # squeue knows no exit codes; scontrol does
        state = parse_scontrol_job(slurm_cluster.run(*scontrol_command(job_id)).stdout)
        assert state is not None
    assert (state.exit_code, state.signal) == (143, 0)  # the training step's status is the job's (see above)
    cause = root_cause(parse_srun_failures((run_dir / "slurm" / "training-0.err").read_text()))
    assert cause is not None and (cause.node, cause.ranks, cause.exit_code) == ("n2", (1,), 3)
    assert_job_gone(slurm_cluster, job_id)


def test_cluster_stops_completely(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """A second cluster, stopped while a job runs: every daemon, stepd and task ends by pid.

    (``slurm_cluster`` only for its skip/fail rule; the two clusters share nothing.)"""
    cluster = start_cluster(tmp_path / "slurm")
    pids = [p.pid for p in cluster.procs.values()]
    try:
        job_id = cluster.sbatch("--nodes=2", "--output=/dev/null", "--wrap", "srun sleep 300")
        cluster.wait_state(job_id, "RUNNING")
        cluster.wait_for("the job's tasks", lambda: len(job_processes(cluster, job_id)) >= 2)
    finally:
        stop_cluster(cluster)
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not cluster_processes(cluster.dir, cluster.conf)
