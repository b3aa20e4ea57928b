"""One group of training processes started directly (no tfl): each task's output lines with
the moment the bench read them, its exit code and its exact peak RSS (from wait4)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from bench.common import PYTHON, ROOT, BenchError, Workspace, assert_none_left
from bench.runs import free_ports

EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+) loss=(\S+) accuracy=(\S+)")
EVAL_LINE = re.compile(r"^eval checkpoint=\S+ epoch=(\d+) loss=(\S+) accuracy=(\S+)")


@dataclass
class TaskOutput:
    name: str
    lines: list[tuple[float, str]] = field(default_factory=list)  # (time.monotonic() when read, line)
    exit_code: int | None = None
    peak_rss_mb: float = 0.0

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def epochs(self) -> list[tuple[float, int, float, float]]:
        """(read at, epoch, loss, accuracy) of every `epoch e/E` line."""
        found = [(t, EPOCH_LINE.match(line)) for t, line in self.lines]
        return [(t, int(m[1]), float(m[3]), float(m[4])) for t, m in found if m]

    def evals(self) -> list[tuple[int, float, float]]:
        """(epoch, loss, accuracy) of every `eval` line (the kit's evaluator)."""
        found = [EVAL_LINE.match(line) for _, line in self.lines]
        return [(int(m[1]), float(m[2]), float(m[3])) for m in found if m]


@dataclass
class GroupResult:
    tasks: list[TaskOutput]
    wall_s: float

    @property
    def chief(self) -> TaskOutput:
        return self.tasks[0]

    def steady_rate(self, examples_per_epoch: int) -> float:
        """Examples/s from the first epoch line to the last: every epoch but the first (which
        traces the functions and fills the shuffle buffer), with its checkpoint, backup and
        TensorBoard writes, as the chief's output shows them."""
        times = [t for t, *_ in self.chief.epochs()]
        if len(times) < 2:
            raise BenchError(f"{self.chief.name}: fewer than 2 epoch lines:\n{self.chief.text()[-2000:]}")
        return (len(times) - 1) * examples_per_epoch / (times[-1] - times[0])

    @property
    def peak_rss_mb(self) -> float:
        """The largest peak RSS of the group's training tasks."""
        return max(t.peak_rss_mb for t in self.tasks if not t.name.startswith("evaluator"))


def tf_config(ports: Sequence[int], task_type: str, index: int, evaluator: bool) -> str:
    cluster: dict[str, list[str]] = {"chief": [f"127.0.0.1:{ports[0]}"]}
    workers = [f"127.0.0.1:{p}" for p in ports[1:len(ports) - int(evaluator)]]
    if workers:
        cluster["worker"] = workers
    if evaluator:
        cluster["evaluator"] = [f"127.0.0.1:{ports[-1]}"]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def run_group(ws: Workspace, label: str, job: Path, tasks: int, args: Sequence[str], *,
              evaluator: bool = False, env: dict[str, str] | None = None, timeout: float = 900.0) -> GroupResult:
    """`tasks` training tasks of `job` (and an evaluator), as the launcher's plan would start them."""
    home = ws.home(label)
    run_dir = home / "run"
    names = ["chief:0"] + [f"worker:{i}" for i in range(tasks - 1)] + (["evaluator:0"] if evaluator else [])
    ports = free_ports(len(names))
    procs: list[tuple[subprocess.Popen[str], TaskOutput, threading.Thread]] = []
    started = time.monotonic()
    for name in names:
        kind, index = name.split(":")
        plan = {"TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2",
                "TFL_RUN_ID": label, "TFL_TASK": name, "TFL_ATTEMPT": "0", "TFL_RUN_DIR": str(run_dir),
                "TFL_PROGRESS_FILE": str(run_dir / f"{kind}-{index}.progress.json"),
                "TF_CONFIG": tf_config(ports, kind, int(index), evaluator)}
        task_env = ws.env(home, **{**plan, **(env or {})})
        run_dir.mkdir(parents=True, exist_ok=True)
        popen = subprocess.Popen([PYTHON, "-u", str(job), *args], env=task_env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        output = TaskOutput(name)
        thread = threading.Thread(target=_follow, args=(popen, output), daemon=True)
        thread.start()
        procs.append((popen, output, thread))
    deadline = started + timeout
    for _popen, output, thread in procs:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            for other, _, _ in procs:
                _kill(other)
            raise BenchError(f"{label}: {output.name} ran past {timeout:.0f} s")
    wall = time.monotonic() - started
    assert_none_left(home)
    failed = [o for _, o, _ in procs if o.exit_code != 0]
    if failed:
        raise BenchError(f"{label}: {failed[0].name} exited {failed[0].exit_code}:\n{failed[0].text()[-3000:]}")
    return GroupResult([o for _, o, _ in procs], wall)


def _follow(popen: subprocess.Popen[str], output: TaskOutput) -> None:
    assert popen.stdout is not None
    for line in popen.stdout:
        output.lines.append((time.monotonic(), line.rstrip("\n")))
    # wait4 gives the child's own peak RSS (ru_maxrss, KiB), exact where sampling is not.
    _, status, usage = os.wait4(popen.pid, 0)
    popen.returncode = os.waitstatus_to_exitcode(status)
    output.exit_code = popen.returncode
    output.peak_rss_mb = usage.ru_maxrss / 1024


def _kill(popen: subprocess.Popen[str]) -> None:
    try:
        os.killpg(popen.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
