"""Run dirs without a record: launches that ended before they recorded their run.

A run dir is made before its record: ``tfl launch --detach`` reserves it and writes ``plan.json``
for its background launcher, which records the run only once the hosts are ready
(``records.preparing``). A launcher killed meanwhile (``kill -9``, the OOM killer, a reboot) leaves
a dir with no ``state.json``: no record names it, so ``tfl rm`` and ``tfl prune`` take it by its
name, and remove it only once nothing can still be making it (``busy``).
"""

from __future__ import annotations

import glob
import os
import time
from pathlib import Path

from launcher.contract import RUN_ID
from launcher.records.preparing import read_preparing
from launcher.records.store import STATE_FILE, RunStore

QUIET_S = 60.0  # a dir changed more recently may be a launch between making its dir and recording its run


def orphan_ids(store: RunStore, prefix: str = "") -> list[str]:
    """The run dirs starting with ``prefix`` that hold no record, by name."""
    found = glob.glob(f"{glob.escape(str(store.runs_dir))}/{glob.escape(prefix)}*/")
    return sorted(name for name in (Path(p).name for p in found)  # a link is no run dir tfl made: never followed
                  if not name.startswith(".") and not store.run_dir(name).is_symlink()
                  and not os.path.lexists(store.run_dir(name) / STATE_FILE))


def find_orphan(store: RunStore, ref: str) -> str | None:
    """The run dir without a record that ``ref`` names (its name or a unique prefix), else None."""
    if "/" in ref or ref in (".", ".."):
        return None
    matches = orphan_ids(store, ref)
    return ref if ref in matches else (matches[0] if len(matches) == 1 else None)


def last_change(run_dir: Path) -> float:
    """When the dir's contents last changed (their newest mtime; the dir's own when it is empty).
    The dir's own mtime is left out otherwise: `tfl stop` removing a dead launcher's preparing.json
    changes it, and the dir is no younger for that."""
    newest = None
    for top, dirs, files in os.walk(run_dir):
        for name in dirs + files:
            try:
                newest = max(newest or 0.0, os.lstat(os.path.join(top, name)).st_mtime)
            except OSError:
                continue
    if newest is None:
        try:
            return os.lstat(run_dir).st_mtime
        except OSError:
            return 0.0
    return newest


def busy(store: RunStore, run_id: str, now: float | None = None) -> str | None:
    """Why the record-less run dir must stay (a launch may still be making it), or None."""
    run_dir = store.run_dir(run_id)
    preparing = read_preparing(run_dir)
    if preparing is not None and preparing.launcher.alive():
        return (f"its background launcher (pid {preparing.launcher.pid}) is making the hosts ready; "
                f"`tfl stop {run_id}` calls it off")
    pid = _process_of(run_id, str(run_dir))
    if pid is not None:
        return f"process {pid} still works in it (a launch being prepared, or a task of it); `tfl stop {run_id}` first"
    age = (time.time() if now is None else now) - last_change(run_dir)
    if age < QUIET_S:
        return f"it changed {age:.0f} s ago (a launch may be starting in it); try again in a minute"
    return None


def _process_of(run_id: str, run_dir: str) -> int | None:
    """A live process that names the dir in its command line (a background launcher reading its
    plan.json) or carries the run's marker (a task it started), else None."""
    import psutil

    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if any(arg.startswith(run_dir + "/") or arg == run_dir for arg in proc.cmdline()):
                return proc.pid
            if proc.environ().get(RUN_ID) == run_id:
                return proc.pid
        except psutil.Error:  # gone, a zombie, or another user's
            continue
    return None
