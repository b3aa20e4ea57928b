"""``tfl rm`` and ``tfl prune``: remove finished runs, here and on their hosts.

A run goes with everything tfl made for it: its directory in the run store (record, logs,
progress, the default model dir) and, through its backend's ``clean_recorded``, what it
left on SSH hosts (shipped code, their run dirs). A model dir on shared storage
(``TFL_MODEL_DIR``) is the user's and stays, as does one given as the job's ``--model-dir``: both are
named on a ``kept:`` line. A run still running is never touched: its
launcher is alive, or (launcher gone) a task of it still is; ``tfl stop`` it first.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from launcher.contract import MODEL_DIR
from launcher.engines import registry
from launcher.errors import RunNotFoundError, UsageError
from launcher.records import orphans
from launcher.records.identity import launcher_identity
from launcher.records.index import mark_ended
from launcher.records.store import RunRecord, RunStore
from launcher.views.tensorboard import model_dir_arg, model_dir_of, serving

DEFAULT_AGE = "7d"
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


@dataclass
class Removed:
    run_id: str
    bytes_freed: int  # on this machine
    elsewhere: list[str] = field(default_factory=list)  # "host:/path" removed on the run's hosts
    bytes_elsewhere: int = 0
    left: list[str] = field(default_factory=list)  # what could not be removed, with why
    kept: list[str] = field(default_factory=list)  # what is deliberately not removed (shared storage)
    note: str = ""  # what it was, when that is not a recorded run
    held: bool = False  # its record stays here: ``left`` lies on its hosts, for a later ``tfl rm`` to remove


def parse_age(text: str) -> float:
    """``7d`` -> seconds (s, m, h, d, w)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if not match:
        raise UsageError(f"--older-than {text}: give a number and a unit, s, m, h, d or w (e.g. 7d or 12h)")
    return float(match[1]) * _UNITS[match[2]]


def still_running(record: RunRecord) -> str | None:
    """Why the run must not be removed, or None when nothing of it runs any more."""
    if launcher_identity(record).find() is not None:
        return f"still running (its launcher, pid {record.launcher_pid}, is alive); `tfl stop {record.run_id}` first"
    if record.state.is_terminal:
        return None
    live = registry.get(record.backend).inspect(record, ask=False)
    if any(t.alive for t in live.values()):
        return f"its launcher is gone but tasks of it still run; `tfl stop {record.run_id}` first"
    return None


def served(store: RunStore, record: RunRecord, boards: dict[str, int]) -> str | None:
    """Why the run must not be removed while ``tfl tensorboard`` serves it (``boards``: ``serving()``), or None."""
    pid = next((boards[d] for d in {os.path.realpath(record.run_dir), os.path.realpath(store.run_dir(record.run_id))}
                if d in boards), None)
    if pid is None:
        return None
    return (f"`tfl tensorboard {record.run_id}` serves its model dir (TensorBoard pid {pid}); stop it first (Ctrl-C "
            "in its terminal), then remove the run")


def to_prune(records: Sequence[RunRecord], *, older_than: float | None, keep: int | None,
             now: float | None = None) -> list[RunRecord]:
    """The runs ``tfl prune`` removes: of those not running, every one but the ``keep`` newest
    (by creation), and of those only the ones that ended more than ``older_than`` s ago."""
    now = time.time() if now is None else now
    done = sorted((r for r in records if still_running(r) is None), key=lambda r: r.created, reverse=True)
    candidates = done[keep:] if keep is not None else done
    if older_than is not None:
        candidates = [r for r in candidates if now - (r.ended or r.created) > older_than]
    return sorted(candidates, key=lambda r: r.created)


def remove(store: RunStore, record: RunRecord, *, force: bool = False) -> Removed:
    """Remove one run that is not running (see ``still_running``), on its hosts then here. When
    something of it stays on a host (unreachable, or a path it could not remove), its record stays
    too (``held``), unless ``force``: without it no later ``tfl rm`` could find what is left there."""
    run_dir = store.run_dir(record.run_id)  # this store's, whatever path the record names (a moved store)
    cleanup = registry.get(record.backend).clean_recorded(record)
    if cleanup.left and not force:
        return Removed(record.run_id, 0, cleanup.removed, cleanup.bytes_freed, list(cleanup.left), held=True)
    freed = disk_usage(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    mark_ended(store.home, record.run_id)  # the marker a lost run still had
    left = list(cleanup.left) + ([f"{run_dir}: could not be removed entirely"] if run_dir.exists() else [])
    kept = shared_model_dirs(record, cleanup.kept) + job_model_dir(record)
    return Removed(record.run_id, freed, cleanup.removed, cleanup.bytes_freed, left, kept)


NO_RECORD = "no record: a launch that ended before it recorded its run"


def remove_orphan(store: RunStore, run_id: str) -> Removed:
    """Remove a run dir that holds no record (see ``orphans.busy``)."""
    run_dir = store.run_dir(run_id)
    freed = disk_usage(run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)
    mark_ended(store.home, run_id)  # a launch killed while it prepared leaves its marker too
    left = [f"{run_dir}: could not be removed entirely"] if run_dir.exists() else []
    return Removed(run_id, freed, left=left, note=NO_RECORD)


def shared_model_dirs(record: RunRecord, seen: Sequence[str] = ()) -> list[str]:
    """The run's model dirs on shared storage that exist (here, or ``seen`` by its hosts): tfl rm
    leaves them, and says so. One the job never made is not named."""
    dirs = {t.get("env", {}).get(MODEL_DIR) for t in record.plan.get("tasks", [])}
    return [f"model dir {d} (shared storage)" for d in sorted(d for d in dirs if d and (d in seen or os.path.isdir(d)))]


def job_model_dir(record: RunRecord) -> list[str]:
    """The model dir given as the job's own ``--model-dir``: the user's, never removed, so named as kept,
    where it exists here or lies on the chief's host (one inside the run dir went with it)."""
    if not record.plan or model_dir_arg(record.job_args) is None:
        return []
    where = model_dir_of(record)
    if where.host is not None:
        return [f"model dir {where.path} on {where.host} (the job's --model-dir)"]
    inside = os.path.abspath(where.path).startswith(os.path.abspath(record.run_dir) + os.sep)
    there = "://" in where.path or os.path.isdir(where.path)
    return [f"model dir {where.path} (the job's --model-dir)"] if there and not inside else []


def disk_usage(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (what removing them gives back)."""
    total = 0
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                continue
    return total


def size_text(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            break
        value /= 1000
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


@dataclass
class Outcome:
    """What ``tfl rm`` / ``tfl prune`` did (or, on a dry run, would do)."""

    removed: list[Removed] = field(default_factory=list)
    held: list[Removed] = field(default_factory=list)  # record kept: something of the run stays on its hosts
    refused: list[tuple[str, str]] = field(default_factory=list)  # run id, why it stays
    would: list[tuple[str, int]] = field(default_factory=list)  # dry run: run id, bytes here
    would_orphans: list[tuple[str, int]] = field(default_factory=list)  # dry run: record-less run dirs, bytes
    unasked: int = 0  # dry run: of ``would``, the runs on SSH hosts, which a real prune asks (one down keeps its run)
    kept: int = 0  # runs prune left alone

    def render(self) -> str:
        lines = [line for done in self.removed for line in _removed_lines(done)]
        lines += [line for done in self.held for line in _held_lines(done)]
        lines += [f"would remove {run_id} ({size_text(size)})" for run_id, size in self.would]
        lines += [f"would remove {run_id} ({size_text(size)}; {NO_RECORD})" for run_id, size in self.would_orphans]
        lines += [f"kept {run_id}: {why}" for run_id, why in self.refused]
        here = sum(d.bytes_freed for d in self.removed)
        there = sum(d.bytes_elsewhere for d in self.removed)
        would = self.would + self.would_orphans
        if would:
            unasked = (f"; {self.unasked} of them ran on SSH hosts, not asked now: the real prune keeps a run whose "
                       "host does not answer" if self.unasked else "")
            lines.append(f"tfl: would remove {len(would)} run(s), {size_text(sum(s for _, s in would))} here "
                         f"(dry run: nothing removed{unasked})")
        elif self.removed:
            lines.append(f"tfl: removed {len(self.removed)} run(s), {size_text(here)} freed here"
                         + (f" and {size_text(there)} on SSH hosts" if there else ""))
        else:
            lines.append("tfl: no run removed" if self.held else "tfl: nothing to remove")
        if self.held:
            lines[-1] += f"; {len(self.held)} run(s) kept while their hosts still hold part of them"
        if self.kept:
            lines[-1] += f"; {self.kept} run(s) kept"
        return "\n".join(lines)


def _removed_lines(done: Removed) -> list[str]:
    head = f"removed {done.run_id} ({size_text(done.bytes_freed)}{'; ' + done.note if done.note else ''})"
    if done.elsewhere:
        head += f" and {', '.join(done.elsewhere)} ({size_text(done.bytes_elsewhere)})"
    return [head, *(f"  left: {why}" for why in done.left), *(f"  kept: {what}" for what in done.kept)]


def _held_lines(done: Removed) -> list[str]:
    run = done.run_id
    head = (f"kept {run}: part of it stays on its hosts (left: below); its record stays so that `tfl rm {run}` "
            f"again removes the rest once they answer (`tfl rm --force {run}` forgets it)")
    gone = [f"  removed: {', '.join(done.elsewhere)} ({size_text(done.bytes_elsewhere)})"] if done.elsewhere else []
    return [head, *(f"  left: {why}" for why in done.left), *gone]


def _done(outcome: Outcome, removed: Removed) -> None:
    (outcome.held if removed.held else outcome.removed).append(removed)


def rm_runs(store: RunStore, refs: Sequence[str], *, force: bool = False) -> Outcome:
    """``tfl rm RUN…``: every run named (id or unique prefix) that is not running, and every run dir
    without a record named that nothing makes any more. An unknown name raises before anything is removed.
    ``force``: also a run something of which stays on its hosts (one unreachable): its record goes, and
    tfl forgets what is left there."""
    found = list({_id_of(r): r for r in (_resolve(store, ref) for ref in refs)}.values())
    outcome = Outcome()
    boards = serving() if any(isinstance(one, RunRecord) for one in found) else {}
    for one in found:
        why = (still_running(one) or served(store, one, boards)) if isinstance(one, RunRecord) else orphans.busy(store, one)
        if why is not None:
            outcome.refused.append((_id_of(one), why))
        else:
            _done(outcome, remove(store, one, force=force) if isinstance(one, RunRecord) else remove_orphan(store, one))
    return outcome


def _resolve(store: RunStore, ref: str) -> RunRecord | str:
    """The recorded run ``ref`` names, else the name of the record-less run dir it names."""
    try:
        return store.resolve(ref)
    except RunNotFoundError:
        orphan = orphans.find_orphan(store, ref)
        if orphan is None:
            raise
        return orphan


def _id_of(found: RunRecord | str) -> str:
    return found.run_id if isinstance(found, RunRecord) else found


def prune_runs(store: RunStore, *, older_than: str | None, keep: int | None, dry_run: bool) -> Outcome:
    """``tfl prune``: finished runs older than ``older_than`` (default 7d when no ``keep``),
    beyond the ``keep`` newest."""
    if keep is not None and keep < 0:
        raise UsageError(f"--keep {keep}: give how many of the latest runs to keep, 0 or more")
    if older_than is None and keep is None:
        older_than = DEFAULT_AGE
    age = parse_age(older_than) if older_than is not None else None
    records = store.list()
    chosen = to_prune(records, older_than=age, keep=keep)
    outcome = Outcome(kept=len(records) - len(chosen))
    boards = serving() if chosen else {}
    for record in chosen:
        if (why := served(store, record, boards)) is not None:
            outcome.refused.append((record.run_id, why))
        elif dry_run:
            outcome.would.append((record.run_id, disk_usage(store.run_dir(record.run_id))))
            outcome.unasked += any(t.get("ssh") for t in record.plan.get("tasks", []))
        else:
            _done(outcome, remove(store, record))
    for orphan in _orphans_to_prune(store, age):
        if dry_run:
            outcome.would_orphans.append((orphan, disk_usage(store.run_dir(orphan))))
        else:
            outcome.removed.append(remove_orphan(store, orphan))
    return outcome


def _orphans_to_prune(store: RunStore, age: float | None) -> list[str]:
    """The record-less run dirs nothing makes any more, unchanged for longer than ``age`` (any, without it)."""
    now = time.time()
    old = [o for o in orphans.orphan_ids(store) if age is None or now - orphans.last_change(store.run_dir(o)) > age]
    return [o for o in old if orphans.busy(store, o, now) is None]  # the process scan only for those
