"""Which runs to read without reading every record: active markers and recency.

`tfl status` must cost the same with 10 runs or 10,000, so it never parses every
``state.json``. Two cheap facts stand in for that:

- ``<home>/active/<run_id>``: an empty file made with the run's record and removed when the
  record reaches a terminal state (``RunStore.create`` / ``RunStore.save``). A launcher that
  died leaves its marker behind, so its run is still listed (as lost) until ``tfl stop`` or
  ``tfl rm`` ends it.
- a run directory's mtime: every write of ``state.json`` (a temp file, then ``os.replace``)
  updates it, so it says when the run's record last changed (for a finished run, its end).

Run ids are not parsed for their date: their format is not a contract. Standard library only.
"""

from __future__ import annotations

import heapq
import os
from pathlib import Path

ACTIVE_DIR = "active"


def mark_active(home: Path, run_id: str) -> None:
    active = home / ACTIVE_DIR
    active.mkdir(mode=0o700, parents=True, exist_ok=True)
    (active / run_id).touch(mode=0o600)


def mark_ended(home: Path, run_id: str) -> None:
    (home / ACTIVE_DIR / run_id).unlink(missing_ok=True)


def active_ids(home: Path) -> list[str]:
    """Runs whose record is not terminal yet (or whose launcher died before it was)."""
    try:
        return sorted(os.listdir(home / ACTIVE_DIR))
    except OSError:
        return []


def recent_ids(runs_dir: Path, count: int) -> tuple[list[str], int]:
    """The ``count`` run dirs whose record changed last, newest first, and how many run
    dirs there are: one ``stat`` per run, no record read."""
    stamped = []
    try:
        with os.scandir(runs_dir) as entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stamped.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
                except OSError:
                    continue  # removed while we looked
    except OSError:
        return [], 0
    return [name for _, name in heapq.nlargest(count, stamped)], len(stamped)


def run_ids(runs_dir: Path, prefix: str = "") -> list[str]:
    """Every run dir's name starting with ``prefix`` (shell completion): names only."""
    try:
        return sorted(n for n in os.listdir(runs_dir) if n.startswith(prefix) and not n.startswith("."))
    except OSError:
        return []
