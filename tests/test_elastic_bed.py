"""Elastic runs on hosts that fail like real ones (``tests.netbed``): chief on the first host,
workers on the two others, ``"elastic": {"min_tasks": 2}``. A cut host is left out and the run
goes on with the others from the last checkpoint; a cut chief's host makes a worker the chief;
a host that joins again is taken back at an agreed checkpoint; below the minimum the run waits,
then fails naming the host, or goes on when the host is back in time.

The job here is tiny and TensorFlow-free: it counts steps, the chief keeps a checkpoint of the
step in the shared model dir every 5 steps, and on the notice (SIGTERM) the chief saves the
exact step and every task exits 170, as the job kit does. Each "up" line says the task's
identity, the size of its cluster (from TF_CONFIG) and the step it starts from.

The job holds at its last step until the test writes ``release`` in the shared dir (``release``
below), once it has seen what it waits for (a resize, a host taken back): a run cannot end
before the fault it is there to meet, however slow the machine, and need not count for
long to make that likely.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.describe.ports import free_port
from tests.netbed import NetBed
from tests.procs import pid_alive, tfl_processes
from tests.test_ssh import only_run, wait_for, write_job

pytestmark = pytest.mark.ssh

STEPS = """
    import json, os, signal, sys, time
    TOTAL, EVERY = {total}, 0.1
    release = os.path.join(sys.argv[1], "release")
    task, config = os.environ["TFL_TASK"], json.loads(os.environ["TF_CONFIG"])
    size = len(config["cluster"].get("chief", [])) + len(config["cluster"].get("worker", []))
    lead = config["task"]["type"] == "chief"
    os.makedirs(os.environ["TFL_MODEL_DIR"], exist_ok=True)
    ckpt = os.path.join(os.environ["TFL_MODEL_DIR"], "step.json")
    step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
    batch = os.environ.get("TFL_GLOBAL_BATCH")
    print("up", task, os.getpid(), "size", size, "from", step, "batch", batch, flush=True)
    notice = []
    signal.signal(signal.SIGTERM, lambda *_: notice.append(1))

    def save(step):
        with open(ckpt + ".tmp", "w") as f:
            json.dump({{"step": step}}, f)
        os.replace(ckpt + ".tmp", ckpt)

    while step < TOTAL:
        if notice:
            if lead:
                save(step)
            print("preempted", task, "at", step, flush=True)
            sys.exit(170)
        time.sleep(EVERY)
        if step + 1 == TOTAL and not os.path.exists(release):
            continue  # the last step waits for the test's word
        step += 1
        if lead and step % 5 == 0:
            save(step)
    print("done", task, "size", size, "at", step, flush=True)
"""
TOTAL = 60  # steps of 0.1 s; the last one waits for ``release``
UP = re.compile(r"up (\S+) (\d+) size (\d+) from (\d+) batch (\S+)")


def cluster(tmp_path: Path, bed: NetBed, **elastic: Any) -> Path:
    h1, h2, h3 = bed.addresses
    tasks = {"chief": [f"{h1}:{free_port()}"], "worker": [f"{h2}:{free_port()}", f"{h3}:{free_port()}"]}
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    return bed.cluster_file(tmp_path / "cluster.json", tasks, sys.executable, ssh={"fence_after": 6},
                            storage={"path": str(shared)}, elastic={"min_tasks": 2, "global_batch": 6, **elastic})


def start(tmp_path: Path, bed: NetBed, env: dict[str, str], *args: str, total: int = TOTAL,
          **elastic: Any) -> subprocess.Popen[str]:
    job = write_job(tmp_path / "src", STEPS.format(total=total))
    return subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--cluster",
                             str(cluster(tmp_path, bed, **elastic)), "--probe-interval", "2", "--grace-period", "10",
                             *args, "--", str(tmp_path / "shared")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def release(tmp_path: Path) -> None:
    """Let the job's tasks take their last step (they hold before it until now)."""
    (tmp_path / "shared" / "release").touch()


def fenced(home: Path, task: str, size: int) -> bool:
    """Whether every start of ``task`` in a cluster of ``size`` has ended (a cut host's agent
    stops its task when the launcher has been silent for ``fence_after`` s)."""
    return not any(pid_alive(u[1]) for u in ups(home) if u[0] == task and u[2] == size)


def record(home: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((home / "runs" / only_run(home) / "state.json").read_text()))
    except (OSError, ValueError):
        return {}


def ups(home: Path) -> list[tuple[str, int, int, int, str]]:
    """Every task start so far: (task, pid, cluster size, first step, global batch), in log order per slot."""
    found = []
    for log in sorted((home / "runs").glob("*/logs/*.log")):
        found += [(m[1], int(m[2]), int(m[3]), int(m[4]), m[5]) for m in UP.finditer(log.read_text())]
    return found


def checkpoint(tmp_path: Path) -> int:
    try:
        return int(json.loads(next((tmp_path / "shared").glob("*/model/step.json")).read_text())["step"])
    except (StopIteration, OSError, ValueError):
        return 0


def training(tmp_path: Path, home: Path, launcher: subprocess.Popen[str], count: int = 3, past: int = 10) -> None:
    """Wait until ``count`` tasks are up and the checkpoint is past step ``past``."""
    def ready() -> bool:
        if launcher.poll() is not None:
            raise AssertionError(f"tfl ended early: {launcher.communicate()}")
        return len(ups(home)) >= count and checkpoint(tmp_path) >= past

    wait_for(ready, timeout=120)


def finish(launcher: subprocess.Popen[str], home: Path) -> tuple[str, str]:
    try:
        out, err = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
    assert tfl_processes(run_id=only_run(home)) == []
    return out, err


def test_a_cut_workers_host_the_run_goes_on_with_two_from_the_checkpoint_and_ends_0(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    launcher = start(tmp_path, netbed, child_env)
    try:
        training(tmp_path, tfl_home, launcher)
        netbed.cut(h3)
        wait_for(lambda: len(record(tfl_home).get("resizes", [])) == 1, timeout=120)
        release(tmp_path)
        out, err = finish(launcher, tfl_home)
    finally:
        netbed.join(h3)
    assert launcher.returncode == 0, err[-3000:]
    after = [u for u in ups(tfl_home) if u[2] == 2]
    assert sorted(u[0] for u in after) == ["chief:0", "worker:0"] and all(u[3] >= 10 for u in after)  # not step 0
    assert all(u[4] == "6" for u in ups(tfl_home))  # the global batch kept at every size
    rec = record(tfl_home)
    assert [(r["from_tasks"], r["to_tasks"], r["hosts"]) for r in rec["resizes"]] == [(3, 2, [h3])]
    assert list(rec["lost_hosts"]) == [h3] and rec["restarts"] == []
    assert f"tfl: resize: 3 -> 2 training tasks; lost: {h3}" in err
    assert f"done chief:0 size 2 at {TOTAL}" in out


def test_a_cut_chiefs_host_a_worker_becomes_chief_and_the_run_ends_0(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    launcher = start(tmp_path, netbed, child_env)
    try:
        training(tmp_path, tfl_home, launcher)
        netbed.cut(h1)
        wait_for(lambda: len(record(tfl_home).get("resizes", [])) == 1, timeout=120)
        release(tmp_path)
        out, err = finish(launcher, tfl_home)
    finally:
        netbed.join(h1)
    assert launcher.returncode == 0, err[-3000:]
    rec = record(tfl_home)
    assert [t["task"] for t in rec["tasks"]] == ["chief:0", "worker:0"] and [t["host"] for t in rec["tasks"]] == [h2, h3]
    assert rec["resizes"][0]["notes"] == [f"worker:0 on {h2} is now chief:0", f"worker:1 on {h3} is now worker:0"]
    assert all(u[3] >= 10 for u in ups(tfl_home) if u[2] == 2)
    assert f"done chief:0 size 2 at {TOTAL}" in out


def test_a_joined_host_is_taken_back_at_an_agreed_checkpoint_and_the_run_ends_with_three(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    launcher = start(tmp_path, netbed, child_env)
    try:
        training(tmp_path, tfl_home, launcher)
        netbed.cut(h3)
        wait_for(lambda: len(record(tfl_home).get("resizes", [])) == 1 and len(ups(tfl_home)) >= 5, timeout=120)
        wait_for(lambda: fenced(tfl_home, "worker:1", 3), timeout=60)  # the cut host's agent, while it is still cut
    finally:
        netbed.join(h3)
    wait_for(lambda: len(record(tfl_home).get("resizes", [])) == 2, timeout=120)
    # The job's last step waits for the release, so the chief holds at TOTAL - 1 until all three have
    # started and read the checkpoint. Released at once, the chief stepped on and saved 60 before a
    # worker of the third attempt (slower to start at load 30-50) had read it, and that one began at 60.
    # Only live starts count: every start of the first two attempts has ended by now, and a first
    # attempt's worker that started late began past 0 too (it read the chief's first save; load 10-23).
    wait_for(lambda: len([u for u in ups(tfl_home) if u[2] == 3 and u[3] > 0 and pid_alive(u[1])]) == 3, timeout=120)
    release(tmp_path)
    out, err = finish(launcher, tfl_home)
    assert launcher.returncode == 0, err[-3000:]
    rec = record(tfl_home)
    assert [(r["from_tasks"], r["to_tasks"]) for r in rec["resizes"]] == [(3, 2), (2, 3)]
    assert rec["lost_hosts"] == {} and [t["host"] for t in rec["tasks"]] == [h1, h2, h3]
    assert f"back: {h3} answers again (taken back at an agreed checkpoint)" in err
    # No step lost: the third attempt, the host taken back included, starts at the very step the chief
    # saved on the notice (its last save). Each task's last start is the third attempt's.
    saved = [int(m) for m in re.findall(r"preempted chief:0 at (\d+)", out)]
    back = list({u[0]: u for u in ups(tfl_home)}.values())
    assert len(back) == 3 and {(u[2], u[3]) for u in back} == {(3, saved[-1])}, (saved, back)
    assert f"done chief:0 size 3 at {TOTAL}" in out


def test_below_the_minimum_the_run_waits_then_fails_naming_the_host(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    launcher = start(tmp_path, netbed, child_env, "--elastic-wait", "6", min_tasks=3)
    try:
        training(tmp_path, tfl_home, launcher)
        netbed.cut(h3)
        cut = time.monotonic()
        _, err = finish(launcher, tfl_home)
        took = time.monotonic() - cut
    finally:
        netbed.join(h3)
    assert launcher.returncode == 1, err[-3000:]
    assert f"below --min-tasks 3: waiting up to 6 s for {h3}" in err
    assert re.search(rf"did not return within 6 s \(--elastic-wait\): {re.escape(h3)} \(", err), err[-2000:]
    assert took >= 6 and record(tfl_home)["state"] == "failed"


def test_below_the_minimum_a_host_back_within_the_wait_goes_on_with_three(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    launcher = start(tmp_path, netbed, child_env, "--elastic-wait", "120", min_tasks=3)
    try:
        training(tmp_path, tfl_home, launcher)
        netbed.cut(h3)
        wait_for(lambda: any(f["host"] == h3 for f in record(tfl_home).get("failures", [])), timeout=120)
        wait_for(lambda: fenced(tfl_home, "worker:1", 3), timeout=60)  # in the wait, and the cut host's task fenced
    finally:
        netbed.join(h3)
    wait_for(lambda: len(record(tfl_home).get("resizes", [])) == 1, timeout=120)
    release(tmp_path)
    out, err = finish(launcher, tfl_home)
    assert launcher.returncode == 0, err[-3000:]
    rec = record(tfl_home)
    assert [(r["from_tasks"], r["to_tasks"]) for r in rec["resizes"]] == [(3, 3)] and rec["lost_hosts"] == {}
    starts = ups(tfl_home)
    assert len(starts) == 6 and sum(u[3] >= 10 and u[2] == 3 for u in starts) == 3  # from the checkpoint, at 3
    assert f"done chief:0 size 3 at {TOTAL}" in out
