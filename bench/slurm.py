"""10. Slurm: from `tfl launch` to every task running, against a plain `sbatch` of an
equivalent script; a task's death → the rest of its run gone; and a preemption notice to
the batch script (``scancel --signal=TERM --batch``, what ``preemption_notice`` makes Slurm
send) → every training task has it, and → the group running again in the allocation.

On a private two-node cluster (tests/slurm_cluster.py: one slurmctld and two slurmd on this
machine, stopped by pid at the end), one tiny task per node. The plain script is what one
would write by hand for the same job: a batch script whose one srun line gives each task a
TF_CONFIG built in bash from ``scontrol show hostnames`` and SLURM_PROCID. Each repetition
runs both, back to back, in a rotating order; the clock starts just before ``tfl launch``
(or ``sbatch``) is spawned and stops when the last task printed its first line.

Slurm starts a batch job at its next scheduling pass, 1-3 s after submission here, so the
spread of both sides is Slurm's more than tfl's.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from functools import partial
from pathlib import Path

import psutil

from bench.common import (
    MNIST,
    PYTHON,
    ROOT,
    TINY,
    BenchError,
    Section,
    Stats,
    Workspace,
    assert_none_left,
    ratio_stats,
    tfl_command,
    verdict,
)
from bench.config import Config
from bench.procs import kill_group, run_tasks, spawn, teardown_trial, wait_for
from bench.runs import STARTED
from tests.slurm_cluster import SlurmCluster, missing_packages, start_cluster, stop_cluster

TARGET = 1.1
NODES = 2
PLAIN = """#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --output={out}
# each task's TF_CONFIG from the job's node names (one fixed port) and its rank
export HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed 's/$/:23456/' | paste -sd, | sed 's/,/","/g')
srun --nodes={nodes} --ntasks={nodes} bash -c {task}
"""
# Attempt 0 waits for the notice and leaves as the job kit does after its checkpoint (170);
# attempt 1 notes its start and ends. Both write wall times into the run dir.
NOTICED = """\
import os, signal, sys, time
run_dir, task = os.environ["TFL_RUN_DIR"], os.environ["TFL_TASK"].replace(":", "-")
def note(kind):
    with open(os.path.join(run_dir, f"{kind}-{task}"), "w") as f:
        f.write(repr(time.time()))
if os.environ["TFL_ATTEMPT"] != "0":
    note("again")
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: (note("noticed"), sys.exit(170)))
note("waiting")
time.sleep(300)
"""
TRAINED_TEARDOWNS = 3  # the training job's teardown trials: TensorFlow starts in 3-25 s on the shared machine
TRAIN_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
EPOCH_1 = re.compile(r"^epoch 1/", re.M)
TASK = ('export TF_CONFIG="{\\"cluster\\": {\\"worker\\": [\\"$HOSTS\\"]}, '
        '\\"task\\": {\\"type\\": \\"worker\\", \\"index\\": $SLURM_PROCID}}"; exec PYTHON -u TINY --sleep 0.5')


def availability() -> str | None:
    missing = missing_packages()
    return f"not measured: Slurm is not installed ({', '.join(missing)})" if missing else None


def slurm_runs(cfg: Config, ws: Workspace, data: Path | None = None) -> dict[str, list[float]] | str:
    """Samples per measure, or why they could not be taken. ``data``: the training job's (§3's
    trial on Slurm: jobs/mnist.py on both nodes, a worker killed after epoch 1); None: not run."""
    why = availability()
    if why:
        return why
    cluster = start_cluster(ws.root / "slurm")
    samples: dict[str, list[float]] = {"tfl": [], "plain": [], "teardown": [], "recorded": [], "noticed": [], "again": []}
    try:
        for rep in range(cfg.reps + 1):  # the first repetition warms both up and is not recorded
            order = ("tfl", "plain") if rep % 2 else ("plain", "tfl")
            phases: dict[str, list[float]] = {}
            took = {side: (_tfl_started if side == "tfl" else _plain_started)(cluster, ws, rep, phases) for side in order}
            if rep:
                for name, seconds in [*took.items(), *((k, v[0]) for k, v in phases.items())]:
                    samples.setdefault(name, []).append(seconds)
        for rep in range(cfg.reps):
            gone, recorded = _teardown(cluster, ws, rep)
            samples["teardown"].append(gone)
            samples["recorded"].append(recorded)
            noticed, again = _notice(cluster, ws, rep)
            samples["noticed"].append(noticed)
            samples["again"].append(again)
        if data is not None and cfg.uses_mnist:
            samples["trained_teardown"] = [_trained_teardown(cluster, ws, rep, data) for rep in range(TRAINED_TEARDOWNS)]
    finally:
        stop_cluster(cluster)
    return samples


def _description(ws: Workspace) -> Path:
    path = ws.root / "slurm.json"
    path.write_text(json.dumps({"slurm": {"nodes": NODES, "tasks_per_node": 1}}))
    return path


def _tfl_started(cluster: SlurmCluster, ws: Workspace, rep: int, phases: dict[str, list[float]]) -> float:
    home = ws.home(f"slurm-tfl-{rep}")
    spawned = time.time()
    done = subprocess.run([*tfl_command(), "launch", str(TINY), "--cluster", str(_description(ws)), "--", "--sleep", "0.5"],
                          env=ws.env(home, SLURM_CONF=str(cluster.conf)), capture_output=True, text=True, timeout=300, cwd=ROOT)
    if done.returncode != 0:
        raise BenchError(f"tfl launch on Slurm exited {done.returncode}: {done.stderr[-500:]}")
    assert_none_left(home)
    started = [float(m[1]) for log in home.glob("runs/*/logs/*.log") if (m := STARTED.search(log.read_text()))]
    if len(started) != NODES:
        raise BenchError(f"{home}: {len(started)} of {NODES} tiny tasks recorded their start")
    (run,) = home.glob("runs/*")
    submitted = min(t["started"] for t in json.loads((run / "state.json").read_text())["tasks"])
    drivers = max(json.loads(p.read_text())["time"] for p in run.glob("slurm/tasks/*.json"))
    for phase, seconds in (("tfl_submit", submitted - spawned), ("tfl_drivers", drivers - submitted),
                           ("tfl_exec", max(started) - drivers)):
        phases.setdefault(phase, []).append(seconds)
    return max(started) - spawned


def _plain_started(cluster: SlurmCluster, ws: Workspace, rep: int, phases: dict[str, list[float]]) -> float:
    home = ws.home(f"slurm-plain-{rep}")
    out = home / "job.out"
    script = home / "job.sbatch"
    task = TASK.replace("PYTHON", shlex.quote(PYTHON)).replace("TINY", shlex.quote(str(TINY)))
    script.write_text(PLAIN.format(nodes=NODES, out=out, task=shlex.quote(task)))
    spawned = time.time()
    job_id = subprocess.run(["sbatch", "--parsable", str(script)], env=cluster.env, capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip()
    submitted = time.time()
    state = cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED", timeout=120)
    started = [float(m) for m in STARTED.findall(out.read_text())] if out.exists() else []
    if state != "COMPLETED" or len(started) != NODES:
        raise BenchError(f"the plain sbatch job {job_id} ended {state} with {len(started)} task(s) started")
    phases.setdefault("plain_submit", []).append(submitted - spawned)
    phases.setdefault("plain_tasks", []).append(max(started) - submitted)
    return max(started) - spawned


def _teardown(cluster: SlurmCluster, ws: Workspace, rep: int) -> tuple[float, float]:
    """A worker killed with SIGKILL: to the chief gone (srun's --kill-on-bad-exit), and to tfl's exit."""
    home = ws.home(f"slurm-teardown-{rep}")
    trial = teardown_trial([*tfl_command(), "launch", str(TINY), "--cluster", str(_description(ws)), "--", "--sleep", "120"],
                           ws.env(home, SLURM_CONF=str(cluster.conf)), home, partial(_both_started, home),
                           start_wait=120, what="both tiny tasks on Slurm", kill_wait=60, exit_wait=60)
    if trial.gone is None or trial.exit_code != 1:
        raise BenchError(f"Slurm teardown run {rep}: the chief was not gone within 60 s (tfl exited {trial.exit_code})")
    return trial.gone, trial.recorded


def _trained_teardown(cluster: SlurmCluster, ws: Workspace, rep: int, data: Path) -> float:
    """The training job on both nodes, the worker killed with SIGKILL after epoch 1: to the chief gone.
    srun --kill-on-bad-exit ends the chief with SIGTERM, which the job kit must not take for a notice."""
    home = ws.home(f"slurm-trained-teardown-{rep}")
    desc = home / "slurm.json"
    desc.write_text(json.dumps({"slurm": {"nodes": NODES, "tasks_per_node": 1}, "env": TRAIN_ENV}))
    trial = teardown_trial([*tfl_command(), "launch", str(MNIST), "--cluster", str(desc), "--max-restarts", "0", "--",
                            "--epochs", "50", "--steps-per-epoch", "40", "--data", str(data)],
                           ws.env(home, SLURM_CONF=str(cluster.conf)), home, partial(_after_epoch_1, home),
                           start_wait=300, what="epoch 1 of the training job on Slurm", kill_wait=60, exit_wait=120,
                           interval=0.1)
    if trial.gone is None or trial.exit_code != 1:
        raise BenchError(f"Slurm training teardown run {rep}: the chief was not gone within 60 s "
                         f"(tfl exited {trial.exit_code})")
    return trial.gone


def _after_epoch_1(home: Path) -> dict[str, psutil.Process] | None:
    logs = list(home.glob("runs/*/logs/chief-0.log"))
    if not logs or not EPOCH_1.search(logs[0].read_text()):
        return None
    tasks = run_tasks(home)
    return tasks if len(tasks) == NODES else None


def _notice(cluster: SlurmCluster, ws: Workspace, rep: int) -> tuple[float, float]:
    """The notice to the batch script: to every training task's handler, and to the group running again."""
    home = ws.home(f"slurm-notice-{rep}")
    job = home / "noticed.py"
    job.write_text(NOTICED)
    desc = home / "slurm.json"
    desc.write_text(json.dumps({"slurm": {"nodes": NODES, "tasks_per_node": 1, "preemption_notice": 60}}))
    launcher = spawn([*tfl_command(), "launch", str(job), "--cluster", str(desc)], ws.env(home, SLURM_CONF=str(cluster.conf)))
    try:
        wait_for(lambda: len(list(home.glob("runs/*/waiting-*"))) == NODES, 120, "both tasks waiting for the notice")
        (run,) = home.glob("runs/*")
        job_id = json.loads((run / "state.json").read_text())["backend_data"]["job_id"]
        sent = time.time()
        subprocess.run(["scancel", "--signal=TERM", "--batch", job_id], env=cluster.env, check=True, timeout=60)
        code = launcher.wait(120)
    finally:
        if launcher.poll() is None:
            kill_group(launcher)
    assert_none_left(home)
    times = {kind: [float(p.read_text()) for p in run.glob(f"{kind}-*")] for kind in ("noticed", "again")}
    if code != 0 or any(len(t) != NODES for t in times.values()):
        raise BenchError(f"Slurm notice run {rep}: tfl exited {code}; {times}")
    return max(times["noticed"]) - sent, max(times["again"]) - sent


def _both_started(home: Path) -> dict[str, psutil.Process] | None:
    logs = list(home.glob("runs/*/logs/*.log"))
    if len(logs) < NODES or not all(STARTED.search(p.read_text()) for p in logs):
        return None
    tasks = run_tasks(home)
    return tasks if len(tasks) == NODES else None


def slurm_section(cfg: Config, samples: dict[str, list[float]] | str) -> Section:
    section = Section(10, "Slurm", f"`tfl launch` to every task running ≤ {TARGET}× a plain `sbatch` of an equivalent script "
                                  "(report ms); death → teardown on Slurm",
                      ["measure", "plain sbatch", "tfl launch", "tfl − plain", "tfl / plain (same repetition)", "target"])
    if isinstance(samples, str):
        section.verdict, section.headline, section.notes = "not measured", samples, [samples]
        section.rows = [["launch → every task running; death → teardown", samples, "", "", "", ""]]
        return section
    tfl, plain = Stats.of(samples["tfl"]), Stats.of(samples["plain"])
    ratio = ratio_stats(samples["tfl"], samples["plain"])
    extra = Stats.of([a - b for a, b in zip(samples["tfl"], samples["plain"], strict=True)])
    fixed = Stats.of(samples["tfl_submit"]).median - Stats.of(samples["plain_submit"]).median  # tfl's part before sbatch
    gone, recorded = Stats.of(samples["teardown"]), Stats.of(samples["recorded"])
    section.verdict = verdict(ratio.median <= TARGET)
    section.rows = [
        [f"launch → every task running ({NODES} nodes × 1 task)", plain.fmt(unit=" s"), tfl.fmt(unit=" s"),
         extra.fmt(1000, 0, " ms"), ratio.fmt(digits=3, unit="×"), f"≤ {TARGET}×: {section.verdict}"],
        ["… spawn → sbatch has returned (tfl: CLI start, plan, sbatch --test-only, run record)",
         Stats.of(samples["plain_submit"]).fmt(1000, 0, " ms"), Stats.of(samples["tfl_submit"]).fmt(1000, 0, " ms"), "", "", ""],
        ["… sbatch returned → the tasks run (Slurm's scheduling, the batch script, srun; tfl: also the nodes step, "
         "up to each task's driver)", Stats.of(samples["plain_tasks"]).fmt(unit=" s"),
         Stats.of(samples["tfl_drivers"]).fmt(unit=" s"), "", "", ""],
        ["… tfl: a task's driver → the job's first line (TF_CONFIG, log, exec of the job's python)", "",
         Stats.of(samples["tfl_exec"]).fmt(1000, 0, " ms"), "", "", ""],
        ["a worker's SIGKILL → the other task gone (srun --kill-on-bad-exit)", "", gone.fmt(1000, 0, " ms"), "", "",
         "report"],
        ["a worker's SIGKILL → tfl has recorded the failure and exited", "", recorded.fmt(unit=" s"), "", "", "report"],
        *_trained_rows(samples),
        *_notice_rows(samples),
    ]
    section.headline = (f"{ratio.median:.2f}× ({extra.median * 1000:.0f} ms more than plain sbatch); "
                        f"death → teardown {gone.median * 1000:.0f} ms, tfl exits after {recorded.median:.1f} s")
    section.notes = [
        f"{cfg.reps} repetitions after one unrecorded warm-up, tfl and plain back to back in a rotating order.",
        "The plain side is a hand-written batch script: one srun line, TF_CONFIG built in bash from "
        "`scontrol show hostnames` and SLURM_PROCID (node names, one fixed port). tfl's side also pays its CLI start, "
        "`sbatch --test-only`, the nodes step (NodeAddr of every node), the task driver's start in each task "
        "(TF_CONFIG from Slurm's node order, a port per job), and the log follower.",
        "Slurm starts a batch job at its next scheduling pass (1-3 s after submission on the test cluster), so most of "
        "the spread on both sides is Slurm's, not tfl's. The machine is shared with other engineers' test suites "
        "(2 cores; see the load average above): these figures are noisy.",
        f"Where tfl's extra time goes: before sbatch (its Python CLI: importing typer, pydantic and the cluster-file "
        f"models is most of it; `sbatch` itself is a C program) {Stats.of(samples['tfl_submit']).median * 1000:.0f} ms "
        f"against {Stats.of(samples['plain_submit']).median * 1000:.0f} ms; the Slurm side (with tfl's nodes step) "
        "is as quick as the plain script's within Slurm's spread. So the ratio is tfl's fixed cost before sbatch over "
        f"Slurm's start-up: {fixed * 1000:.0f} ms, {fixed / Stats.of(samples['plain']).median:.0%} of a plain launch "
        "here. Whether the median of a few repetitions lands within the target depends on where each submission falls "
        "in Slurm's scheduling pass (1-3 s on this idle test cluster), not on tfl: read the verdict with that spread "
        f"(tfl − plain above); the fixed cost stays within {TARGET}× once a job waits about "
        f"{fixed / (TARGET - 1):.0f} s for its nodes, as jobs on a busy cluster do.",
        "Death → teardown: the worker's task is killed with SIGKILL; srun's --kill-on-bad-exit ends the chief (SIGTERM, "
        "then SIGKILL after KillWait), without waiting for TensorFlow's heartbeat timeout. tfl then learns the outcome "
        "from the batch script's events file and srun's stderr (its poll is 0.5 s) and waits for the job to leave the "
        "queue before it exits.",
    ]
    if samples.get("trained_teardown"):
        section.notes.append(
            f"The training job's teardown ({TRAINED_TEARDOWNS} trials: `tfl launch jobs/mnist.py`, 2 nodes × 1 task, "
            "--max-restarts 0, 50 epochs × 40 steps, the worker killed with SIGKILL once the chief's log shows epoch 1): "
            "srun's --kill-on-bad-exit SIGTERM reaches the chief, whose job kit tries a connect to the worker's "
            "TF_CONFIG address, is refused and ends at once (before, it took that SIGTERM for a preemption notice and "
            "waited 2 s or more for an agreement the dead worker could never join). In some trials the chief's own "
            "collective fails on the dead peer first (\"Connection reset by peer\") and it ends with exit 1 before "
            "srun's SIGTERM comes.")
    if samples.get("noticed"):
        section.notes.append(
            "Notice: `scancel --signal=TERM --batch` (what `preemption_notice` makes Slurm send before the time limit) "
            "reaches tfl's batch script, which finds the training step (`squeue -s`) and passes SIGTERM to its tasks "
            "(`scancel --signal`); a stand-in job notes the signal and exits 170 as the job kit does once the agreed "
            "checkpoint is on disk (the kit's own notice → checkpoint time is §11's), then the script starts the group "
            "again in the allocation, not counted against --max-restarts.")
    section.raw = samples
    return section


def _trained_rows(samples: dict[str, list[float]]) -> list[list[str]]:
    if not samples.get("trained_teardown"):
        return []
    return [["the training job (jobs/mnist.py): a worker's SIGKILL after epoch 1 → the chief gone (srun's SIGTERM, "
             "which the kit tells from a notice: its peer is gone)", "",
             Stats.of(samples["trained_teardown"]).fmt(1000, 0, " ms"), "", "", "report (Slurm's own path: the tiny task's row)"]]


def _notice_rows(samples: dict[str, list[float]]) -> list[list[str]]:
    if not samples.get("noticed"):
        return []
    return [["a notice to the batch script → every training task has SIGTERM", "",
             Stats.of(samples["noticed"]).fmt(1000, 0, " ms"), "", "", "report"],
            ["a notice to the batch script → the group running again (the tasks left with 170 at once)", "",
             Stats.of(samples["again"]).fmt(unit=" s"), "", "", "report"]]
