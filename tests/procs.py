"""Orphan checks: scan the whole process table for tfl's environment marker."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie; a process that exits while we look counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_group(popen: subprocess.Popen[Any]) -> None:
    """SIGKILL a process started in a session of its own, and its group; fine if it already exited."""
    if popen.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)


def tfl_processes(run_id: str | None = None, home: str | None = None) -> list[psutil.Process]:
    """Every live process whose environment says it is a task of a tfl run.

    ``run_id`` narrows to one run; ``home`` to runs whose TFL_RUN_DIR lies under it or whose
    run store is there (``home/runs/<id>`` or ``home/*/runs/<id>``): an SSH task's run dir is
    in its host's own per-user dir.
    """
    stored = {p.name for p in (*Path(home).glob("runs/*"), *Path(home).glob("*/runs/*"))} if home else set()
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
            if proc.status() == psutil.STATUS_ZOMBIE or "TFL_RUN_ID" not in env:
                continue
        except psutil.Error:
            continue
        if run_id is not None and env["TFL_RUN_ID"] != run_id:
            continue
        if home is not None and not env.get("TFL_RUN_DIR", "").startswith(home) and env["TFL_RUN_ID"] not in stored:
            continue
        found.append(proc)
    return found


def assert_none_left(home: str, timeout: float = 5.0) -> None:
    """Fail if any task of a run under ``home`` is still alive after ``timeout`` s; kill them."""
    deadline = time.monotonic() + timeout
    left = tfl_processes(home=home)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = tfl_processes(home=home)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    assert not left, f"processes left alive: {[(p.pid, p.cmdline()) for p in left]}"
