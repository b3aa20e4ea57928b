"""12. Preemption through tfl: notice → agreed checkpoint on disk, and preemption → training again.

``tfl launch jobs/mnist.py --max-restarts 0`` with a chief and a worker, local or over SSH
(loopback hosts served by a private sshd, bench/ssh.py); once the chief has trained
``notice_step`` steps, worker:0 gets SIGTERM (the notice). Measured from that moment:

- **notice → checkpoint**: until the chief's ``preempted.json`` is on disk (written once the
  agreed checkpoint is saved), against the median step time of the same run;
- **preemption → training again**: until the restarted chief reports its first trained step
  (the kit's per-step progress log, TFL_PROGRESS_LOG), teardown and TensorFlow's start included.

Run alone: ``python -m bench.preempt_launch [--trials N] [--ssh]`` prints the table and the raw samples.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import MNIST, BenchError, Section, Stats, Workspace, assert_none_left, tfl_command
from bench.procs import kill_group, run_tasks, spawn, wait_for
from bench.restart import _chief_records

NOTICE_STEP = 15
JOB_ARGS = ["--epochs", "2", "--steps-per-epoch", "40", "--batch-size", "32", "--dtype", "float64", "--seed", "7",
            "--backup-every-steps", "10"]


@dataclass
class PreemptionSample:
    transport: str  # "local" or "ssh"
    step_s: float  # median step time of the chief before the notice
    agreed_step: int
    notice_to_checkpoint_s: float
    preemption_to_training_s: float


def _preempted_file(home: Path, storage: Path | None) -> Path | None:
    found = list(home.glob("runs/*/model/preempted.json")) + (list(storage.glob("*/model/preempted.json")) if storage else [])
    return found[0] if found else None


def _step_time(records: list[dict[str, Any]]) -> float:
    times = [float(r["time"]) for r in records if r.get("attempt") == 0]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b > a]
    if not gaps:
        raise BenchError("no step times from the chief's progress log")
    return statistics.median(gaps)


def one_trial(ws: Workspace, transport: str, rep: int, cluster: Path | None, storage: Path | None = None) -> PreemptionSample:
    home = ws.home(f"preempt-{transport}-{rep}")
    log = home / "progress.jsonl"
    where = ["--cluster", str(cluster)] if cluster else ["--local", "2"]
    launcher = spawn([*tfl_command(), "launch", MNIST.as_posix(), *where, "--max-restarts", "0", "--", *JOB_ARGS],
                     ws.env(home, TFL_PROGRESS_LOG=str(log), TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1"))
    try:
        wait_for(lambda: max((int(r["global_step"]) for r in _chief_records(log)), default=0) >= NOTICE_STEP, 900,
                 f"the chief to reach step {NOTICE_STEP}")
        os.kill(run_tasks(home)["worker:0"].pid, signal.SIGTERM)
        noticed = time.time()
        saved_file = wait_for(partial(_preempted_file, home, storage), 300, "the agreed checkpoint (preempted.json)", interval=0.005)
        saved = saved_file.stat().st_mtime
        agreed = int(json.loads(saved_file.read_text())["global_step"])
        wait_for(lambda: any(r.get("attempt") == 1 for r in _chief_records(log)), 900, "training again")
        code = launcher.wait(900)
    finally:
        if launcher.poll() is None:
            kill_group(launcher)
    assert_none_left(home)
    if code != 0:
        raise BenchError(f"preemption run {transport} {rep}: tfl exited {code} (a preemption must not fail the run)")
    records = _chief_records(log)
    back = min(float(r["time"]) for r in records if r.get("attempt") == 1)
    return PreemptionSample(transport, _step_time(records), agreed, saved - noticed, back - noticed)


def preemption_section(samples: list[PreemptionSample]) -> Section:
    rows = []
    for transport in sorted({s.transport for s in samples}):
        mine = [s for s in samples if s.transport == transport]
        step = Stats.of([s.step_s for s in mine])
        saved = Stats.of([s.notice_to_checkpoint_s for s in mine])
        rows.append([transport, str(len(mine)), step.fmt(1000, 0, " ms"), saved.fmt(digits=2, unit=" s"),
                     f"{saved.median / step.median:.0f}×", Stats.of([s.preemption_to_training_s for s in mine]).fmt(digits=1, unit=" s")])
    return Section(
        12, "Preemption through tfl", "time from notice to the agreed checkpoint on disk, against the step time; "
        "time from preemption to training again (local, SSH)",
        ["transport", "trials", "step time", "notice → checkpoint on disk", "in steps", "preemption → training again"],
        rows, "n/a",
        notes=[f"`tfl launch jobs/mnist.py (--local 2 | --cluster over loopback SSH) --max-restarts 0 -- {' '.join(JOB_ARGS)}`; "
               f"worker:0 gets SIGTERM once the chief has trained {NOTICE_STEP} steps. Every run ended 0: the preemption "
               "restarted the group without counting against --max-restarts.",
               "Notice → checkpoint: until the chief's model/preempted.json exists (written after the agreed checkpoint is "
               "saved). Preemption → training again: until the restarted chief's first step in the progress log; most of it "
               "is the teardown and two TensorFlow start-ups."],
        raw={"samples": [asdict(s) for s in samples]},
        headline=(f"notice → checkpoint {Stats.of([s.notice_to_checkpoint_s for s in samples]).median:.2f} s; "
                  f"preemption → training again {Stats.of([s.preemption_to_training_s for s in samples]).median:.1f} s"))


def _ssh_cluster(ws: Workspace) -> tuple[Path, Any]:
    """A two-host cluster file over a private sshd on loopback (bench/ssh.py's), with storage both see."""
    from bench.ssh import HOSTS, _start_sshd
    from launcher.spec import free_port

    sshd_dir = ws.root / "sshd-preempt"
    server, port = _start_sshd(sshd_dir, HOSTS[:2], skip_bashrc=True)
    storage = ws.root / "storage"
    storage.mkdir()
    data = {"cluster": {"chief": [f"{HOSTS[0]}:{free_port()}"], "worker": [f"{HOSTS[1]}:{free_port()}"]},
            "ssh": {"user": "root", "port": port, "identity_file": str(sshd_dir / "client_key"),
                    "known_hosts": str(sshd_dir / "known_hosts"), "connect_timeout": 10},
            "hosts": {h: {"python": sys.executable} for h in HOSTS[:2]},
            "storage": {"path": str(storage)}}
    path = ws.root / "preempt-ssh.json"
    path.write_text(json.dumps(data))
    return path, server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--ssh", action="store_true", help="also over SSH (loopback sshd)")
    parser.add_argument("--out", type=Path, default=None, help="write the section as JSON here")
    args = parser.parse_args()
    ws = Workspace()
    samples = []
    server = None
    try:
        samples += [one_trial(ws, "local", rep, None) for rep in range(args.trials)]
        if args.ssh:
            cluster, server = _ssh_cluster(ws)
            samples += [one_trial(ws, "ssh", rep, cluster, ws.root / "storage") for rep in range(args.trials)]
    finally:
        if server is not None:
            server.terminate()
            server.wait()
        ws.close()
    section = preemption_section(samples)
    print(json.dumps(asdict(section), indent=1))
    if args.out:
        args.out.write_text(json.dumps(asdict(section), indent=1))


if __name__ == "__main__":
    main()
