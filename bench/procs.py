"""Processes the measures start and watch: timed runs, the launcher's own accounting, exits."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil

from bench.common import ROOT, BenchError, assert_none_left
from tests.procs import tfl_processes


def timed_run(argv: Sequence[str], env: dict[str, str], timeout: float = 600.0,
              cwd: Path = ROOT) -> tuple[float, int]:
    """Wall time from spawn to exit, and the exit code; output is discarded."""
    start = time.perf_counter()
    popen = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        code = popen.wait(timeout)
    except subprocess.TimeoutExpired:
        kill_group(popen)
        raise BenchError(f"{' '.join(argv[:4])} … ran past {timeout:.0f} s") from None
    return time.perf_counter() - start, code


@dataclass
class LauncherUsage:
    """What a finished launcher process cost: its own CPU, its children's, its peak RSS."""

    wall_s: float
    exit_code: int
    own_cpu_s: float
    children_cpu_s: float
    peak_rss_mb: float
    cpu_trace: list[tuple[float, float]] = field(default_factory=list, repr=False)  # (unix time, own CPU s)

    def cpu_at(self, when: float) -> float:
        """The launcher's own CPU seconds at unix time ``when`` (the first sample from then on)."""
        return next((cpu for t, cpu in self.cpu_trace if t >= when), self.own_cpu_s)


def run_launcher(argv: Sequence[str], env: dict[str, str], timeout: float = 900.0) -> LauncherUsage:
    """Run ``tfl launch …`` to its end and account for it exactly.

    The launcher reaps its tasks, so once it has exited its ``/proc`` entry (a zombie
    still: we wait with WNOWAIT) holds its own CPU time and, apart from it, the CPU time
    of every task. Its peak RSS is the kernel's high-water mark (VmHWM), sampled by a
    thread until it exits; the wall time is taken when it exits, not at a sample.
    """
    start = time.perf_counter()
    popen = subprocess.Popen(list(argv), env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    peak_kb = [0]
    trace: list[tuple[float, float]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak_kb[0] = max(peak_kb[0], _vm_hwm_kb(popen.pid))
            try:
                utime, stime, _, _ = _cpu_times(popen.pid)
            except (OSError, IndexError, ValueError):
                continue
            trace.append((time.time(), utime + stime))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    watchdog = threading.Timer(timeout, lambda: os.kill(popen.pid, signal.SIGKILL))
    watchdog.start()
    os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOWAIT)
    wall = time.perf_counter() - start
    watchdog.cancel()
    done.set()
    sampler.join()
    utime, stime, cutime, cstime = _cpu_times(popen.pid)
    code = popen.wait()
    if wall >= timeout:
        raise BenchError(f"{' '.join(argv[:4])} … ran past {timeout:.0f} s and was killed")
    return LauncherUsage(wall, code, utime + stime, cutime + cstime, peak_kb[0] / 1024, trace)


def _vm_hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_times(pid: int) -> tuple[float, float, float, float]:
    """utime, stime, cutime, cstime of a (zombie) process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    utime, stime, cutime, cstime = (int(fields[i]) / ticks for i in (11, 12, 13, 14))
    return utime, stime, cutime, cstime


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02,
             failed: Callable[[], str | None] | None = None) -> Any:
    """``predicate()``'s first true value; a ``BenchError`` at the timeout, or at once when ``failed()`` says
    why the value will never come."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        why = failed() if failed is not None else None
        if why:
            raise BenchError(f"waiting for {what}: {why}")
        time.sleep(interval)
    raise BenchError(f"timed out after {timeout:.0f} s waiting for {what}")


class ExitWatcher:
    """The moment each of some processes (children or not) exits.

    A pidfd becomes readable when its process exits, so the watcher sleeps in ``poll``
    instead of sampling the process table: the times are exact to the scheduler.
    """

    def __init__(self, pids: Sequence[int]) -> None:
        self.exits: dict[int, float] = {}
        self._fds: dict[int, int] = {}
        for pid in pids:
            try:
                self._fds[os.pidfd_open(pid)] = pid
            except ProcessLookupError:
                self.exits[pid] = time.monotonic()  # gone already

    def wait(self, timeout: float) -> dict[int, float]:
        """``pid -> time.monotonic()`` of its exit, for those that exited within ``timeout``."""
        poller = select.poll()
        pending = {fd: pid for fd, pid in self._fds.items() if pid not in self.exits}
        for fd in pending:
            poller.register(fd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for fd, _ in poller.poll(remaining * 1000):
                self.exits[pending.pop(fd)] = time.monotonic()
                poller.unregister(fd)
        return dict(self.exits)

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = {}


def kill_group(popen: subprocess.Popen[Any]) -> None:
    """Kill a process started with ``start_new_session=True`` and its whole group."""
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    popen.wait()


def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def run_tasks(home: Path) -> dict[str, psutil.Process]:
    found = {}
    for proc in tfl_processes(home=str(home)):
        try:
            found[proc.environ()["TFL_TASK"]] = proc
        except (psutil.Error, KeyError):
            continue
    return found


def tasks_named(home: Path, *names: str, timeout: float = 30.0) -> dict[str, psutil.Process]:
    """The run's tasks once every one of ``names`` is seen: a task just reached may not be listed at
    once (its environ unreadable for an instant under load; a bench run of load 38 met that)."""
    def seen() -> dict[str, psutil.Process] | None:
        found = run_tasks(home)
        return found if all(n in found for n in names) else None

    found: dict[str, psutil.Process] = wait_for(seen, timeout, f"tasks {', '.join(names)} to be seen")
    return found


def kill_and_time(tasks: dict[str, psutil.Process], victim: str, timeout: float) -> float | None:
    """SIGKILL ``victim``; seconds from its death to the last other task gone (None: not within timeout)."""
    watcher = ExitWatcher([p.pid for p in tasks.values()])
    try:
        os.kill(tasks[victim].pid, signal.SIGKILL)
        exits = watcher.wait(timeout)
    finally:
        watcher.close()
    others = [exits.get(p.pid) for name, p in tasks.items() if name != victim]
    if any(t is None for t in others) or tasks[victim].pid not in exits:
        return None
    return max(t for t in others if t is not None) - exits[tasks[victim].pid]


@dataclass(frozen=True)
class Teardown:
    """One kill-a-worker trial: death → last other task gone (None: not within the wait), tfl's exit."""

    gone: float | None
    exit_code: int | None
    recorded: float  # seconds from the kill to tfl's exit


def teardown_trial(argv: Sequence[str], env: dict[str, str], home: Path,
                   started: Callable[[], dict[str, psutil.Process] | None], *, start_wait: float, what: str,
                   kill_wait: float, exit_wait: float, interval: float = 0.02) -> Teardown:
    """Launch ``argv``, wait until ``started`` names the tasks, SIGKILL ``worker:0`` and time the rest
    going; the launcher is killed if it is still there, and no process of the run may be left."""
    launcher = spawn(list(argv), env)
    try:
        tasks = wait_for(started, start_wait, what, interval=interval)
        killed = time.monotonic()
        gone = kill_and_time(tasks, "worker:0", kill_wait)
        code = launcher.wait(exit_wait)
        recorded = time.monotonic() - killed
    finally:
        if launcher.poll() is None:
            kill_group(launcher)
    assert_none_left(home)
    return Teardown(gone, code, recorded)
