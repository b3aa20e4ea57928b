"""Starting one group of tasks either way: under `tfl launch --local N`, or with the plain
shell script (bench/plain_launch.sh) that sets TF_CONFIG and starts the same processes."""

from __future__ import annotations

import json
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bench.common import PLAIN_LAUNCH, PYTHON, BenchError, Workspace, assert_none_left, tfl_command
from bench.procs import LauncherUsage, run_launcher, timed_run

STARTED = re.compile(r"^tiny started=([0-9.]+)", re.M)
LOST_COORDINATOR = "Failed to send RPC to coordination service"


@dataclass
class GroupRun:
    wall_s: float
    run_dir: Path
    spawned_at: float  # unix time just before the command was spawned
    usage: LauncherUsage | None = None  # tfl runs only

    def log(self, task: str = "chief-0") -> str:
        return (self.run_dir / "logs" / f"{task}.log").read_text(errors="replace")

    def progress(self, task: str = "chief-0") -> dict[str, object]:
        data: dict[str, object] = json.loads((self.run_dir / "progress" / f"{task}.json").read_text())
        return data

    def worker_outlived_chief(self) -> bool:
        """A task's log says it lost the chief's coordination service at the end (TensorFlow's shutdown race)."""
        return any(LOST_COORDINATOR in p.read_text(errors="replace") for p in (self.run_dir / "logs").glob("worker-*.log"))

    def launcher_only_s(self) -> float:
        """tfl's own wall time: spawn → first task started, plus last task ended → tfl exited."""
        tasks = json.loads((self.run_dir / "state.json").read_text())["tasks"]
        head = min(t["started"] for t in tasks) - self.spawned_at
        tail = self.spawned_at + self.wall_s - max(t["ended"] for t in tasks)
        return float(head + tail)

    def startup_cpu_s(self) -> float:
        """The launcher's own CPU seconds until its last task had been started (its start-up)."""
        assert self.usage is not None
        record = json.loads((self.run_dir / "state.json").read_text())
        return self.usage.cpu_at(max(t["started"] for t in record["tasks"]))

    def all_started_s(self, tasks: int) -> float:
        """From spawning the command until the last tiny task began running its own code."""
        found = [STARTED.search(p.read_text()) for p in sorted((self.run_dir / "logs").glob("*.log"))]
        started = [float(m[1]) for m in found if m]
        if len(started) != tasks:
            raise BenchError(f"{self.run_dir}: {len(started)} of {tasks} tiny tasks recorded their start")
        return max(started) - self.spawned_at


def free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in ports:
            ports.append(port)
    return ports


def tfl_group(ws: Workspace, label: str, job: Path, n: int, args: Sequence[str]) -> GroupRun:
    home = ws.home(f"tfl-{label}")
    spawned = time.time()
    usage = run_launcher([*tfl_command(), "launch", str(job), "--local", str(n), "--", *args], ws.env(home))
    (run_dir,) = (home / "runs").iterdir()
    assert_none_left(home)
    if usage.exit_code != 0:
        raise BenchError(f"tfl launch {job.name} --local {n} exited {usage.exit_code}: {_tails(run_dir)}")
    return GroupRun(usage.wall_s, run_dir, spawned, usage)


def plain_group(ws: Workspace, label: str, job: Path, n: int, args: Sequence[str]) -> GroupRun:
    home = ws.home(f"plain-{label}")
    run_dir = home / "runs" / f"plain-{label}"
    ports = ",".join(str(p) for p in free_ports(n))
    spawned = time.time()
    wall, code = timed_run(["bash", str(PLAIN_LAUNCH), str(run_dir), PYTHON, str(job), ports, *args], ws.env(home))
    assert_none_left(home)
    if code != 0:
        raise BenchError(f"plain_launch.sh {job.name} ({n} tasks) exited {code}: {_tails(run_dir)}")
    return GroupRun(wall, run_dir, spawned)


def _tails(run_dir: Path) -> str:
    return " | ".join(f"{p.name}: {p.read_text(errors='replace')[-300:]}" for p in sorted((run_dir / "logs").glob("*.log")))
