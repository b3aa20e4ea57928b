"""A run of tests/jobs/loops.py over many hosts of a ``tests.netbed`` bed: the cluster file, the
wait for every task to say it is up, the processes left on the bed's hosts.

Used by the large-bed slow test (tests/test_large_bed.py) and the bench (bench/many_hosts.py).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from tests.netbed import NetBed

LOOPS = Path(__file__).resolve().parent / "jobs" / "loops.py"
UP = re.compile(r"^up (\S+) (\d+)$", re.M)
PORT = 2222  # the first task port on each host


def loops_job(directory: Path) -> Path:
    """The job alone in a directory of its own (a launch ships the job's directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(LOOPS, directory / "loops.py"))


def tasks_for(addresses: list[str], per_host: int) -> dict[str, list[str]]:
    """The chief and ``per_host - 1`` workers on the first host, ``per_host`` workers on every other."""
    slots = [f"{a}:{PORT + i}" for a in addresses for i in range(per_host)]
    return {"chief": slots[:1], "worker": slots[1:]}


def cluster_for(bed: NetBed, path: Path, hosts: int, per_host: int, python: str, **ssh: Any) -> Path:
    """A cluster file over the bed's first ``hosts`` hosts (only those: a host named in ``hosts``
    but in no task is refused)."""
    addresses = bed.addresses[:hosts]
    data = {"cluster": tasks_for(addresses, per_host), "ssh": bed.ssh_settings(**ssh),
            "hosts": {a: {"python": python} for a in addresses}}
    path.write_text(json.dumps(data, indent=1))
    return path


def run_id(home: Path) -> str | None:
    runs = [p.name for p in (home / "runs").glob("*") if (p / "state.json").exists()]
    return runs[0] if len(runs) == 1 else None


def record(home: Path) -> dict[str, Any]:
    run = run_id(home)
    assert run is not None, f"no single run under {home}"
    data: dict[str, Any] = json.loads((home / "runs" / run / "state.json").read_text())
    return data


def wait_up(home: Path, tasks: int, timeout: float, failed: Callable[[], str | None] = lambda: None) -> dict[str, int]:
    """task -> pid, once every task's log says ``up``; raises after ``timeout`` s or when
    ``failed()`` says why the launch failed. Logs already up are not read again."""
    pids: dict[str, int] = {}
    done: set[Path] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in home.glob("runs/*/logs/*.log"):
            if log not in done:
                found = UP.findall(log.read_text(errors="replace"))
                if found:
                    pids.update((name, int(pid)) for name, pid in found)
                    done.add(log)
        if len(pids) >= tasks:
            return pids
        why = failed()
        if why:
            raise RuntimeError(f"the launch failed with {len(pids)} of {tasks} tasks up: {why}")
        time.sleep(0.1)
    raise RuntimeError(f"only {len(pids)} of {tasks} tasks were up after {timeout:g} s")


def wait_recorded(home: Path, state: str, timeout: float) -> None:
    """Until the run's record says ``state`` (or raise after ``timeout`` s: a hang guard)."""
    deadline = time.monotonic() + timeout
    while record(home)["state"] != state:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run's record still says {record(home)['state']!r} after {timeout:g} s")
        time.sleep(0.2)


def only_sshds(bed: NetBed) -> dict[str, list[int]]:
    """host -> the processes on it other than its sshd: {} when a run has left nothing on any host."""
    sshd = {h.name: h.sshd.proc.pid for h in bed.hosts if h.sshd is not None}
    return {name: extra for name, pids in bed.all_pids().items() if (extra := [p for p in pids if p != sshd.get(name)])}
