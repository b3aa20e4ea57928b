"""Process identity on this machine: a pid is ours only if its create time matches.

pids get reused, so every pid tfl records (launcher, local tasks) comes with psutil's
create time, and a process counts as that pid only while both match.
"""

from __future__ import annotations

import os

import psutil

from launcher.contract import RUN_ID


def find_process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The live process with this pid *and* create time, else None."""
    if pid is None or create_time is None:
        return None
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 0.01 or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def marked_processes(run_id: str, known: dict[int, psutil.Process]) -> list[psutil.Process]:
    """``known`` plus every live process whose environment carries the run's marker
    (``TFL_RUN_ID``): children a task started, a task the record never got to name."""
    found = dict(known)
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(RUN_ID) == run_id and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = proc
        except psutil.Error:
            continue
    return list(found.values())


def signal_group(proc: psutil.Process, signum: int) -> None:
    """``signum`` to the process's group (never to our own group: then to it alone)."""
    try:
        pgid = os.getpgid(proc.pid)
        if pgid == os.getpgid(0):
            proc.send_signal(signum)
        else:
            os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError, psutil.Error):
        pass


def is_running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def cpu_percent(proc: psutil.Process | None) -> float | None:
    try:
        return proc.cpu_percent(None) if proc else None
    except psutil.Error:
        return None


def rss_mb(proc: psutil.Process | None) -> float | None:
    try:
        return round(proc.memory_info().rss / 2**20, 1) if proc else None
    except psutil.Error:
        return None
