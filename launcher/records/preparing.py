"""A detached launch whose hosts are being made ready, before its run record exists.

``tfl launch --detach`` starts a background launcher, which records the run only once its
hosts passed their checks and the code is shipped (``runs.detach``): seconds, or minutes
with many hosts or a large ``--sync``. Meanwhile that launcher keeps ``preparing.json`` in the
run dir (who it is, the job, the tasks and their hosts) and the run's active marker
(``records.index``), so ``tfl status`` lists the run as preparing and ``tfl stop`` can call it
off. The note goes once the record exists; a launch that ends without one drops the marker too.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.errors import RunNotFoundError
from launcher.files import write_atomic
from launcher.records.identity import ProcessIdentity
from launcher.records.index import active_ids, mark_active, mark_ended
from launcher.records.store import STATE_FILE, RunRecord, RunStore

PREPARING_FILE = "preparing.json"  # a run dir that holds a record (STATE_FILE) is no longer preparing


@dataclass(frozen=True)
class Preparing:
    run_id: str
    run_dir: str
    job: str
    created: float
    launcher: ProcessIdentity  # the background launcher making the hosts ready
    waiting: ProcessIdentity | None = None  # the `tfl launch --detach` that waits for it, if any
    tasks: list[tuple[str, str]] = field(default_factory=list)  # (task, host)
    network: str = "host"


def waiting_parent() -> ProcessIdentity | None:
    """The `tfl launch --detach` that started this launcher and waits for its record, if still there."""
    import psutil

    try:
        return ProcessIdentity.of(os.getppid())
    except psutil.Error:  # gone already
        return None


def note_preparing(home: Path, preparing: Preparing) -> None:
    """Said by the background launcher as it starts making the hosts ready."""
    mark_active(home, preparing.run_id)
    write_atomic(Path(preparing.run_dir) / PREPARING_FILE, json.dumps(asdict(preparing)))


def forget_preparing(run_dir: str) -> None:
    """The run is recorded: its record says the rest."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(run_dir) / PREPARING_FILE)


def end_preparing(home: Path, run_id: str, run_dir: str) -> None:
    """The launch ended before its run was recorded (refused, called off, crashed)."""
    forget_preparing(run_dir)
    if not (Path(run_dir) / STATE_FILE).exists():
        mark_ended(home, run_id)


def read_preparing(run_dir: Path) -> Preparing | None:
    """The note of a run dir that holds no record yet, or None."""
    if (run_dir / STATE_FILE).exists():
        return None
    try:
        data = json.loads((run_dir / PREPARING_FILE).read_text())
        waiting = data.get("waiting")
        return Preparing(run_id=data["run_id"], run_dir=data["run_dir"], job=data["job"], created=float(data["created"]),
                         launcher=ProcessIdentity(**data["launcher"]), waiting=ProcessIdentity(**waiting) if waiting else None,
                         tasks=[(str(t), str(h)) for t, h in data.get("tasks", [])], network=str(data.get("network", "host")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def preparing_runs(home: Path) -> list[Preparing]:
    """The launches being prepared (among the active runs: no record read), oldest first."""
    found = [read_preparing(home / "runs" / run_id) for run_id in active_ids(home)]
    return sorted((p for p in found if p is not None), key=lambda p: p.created)


def find_preparing(home: Path, ref: str | None) -> Preparing | None:
    """The launch being prepared that ``ref`` names (its id or a unique prefix; None: the latest)."""
    runs = preparing_runs(home)
    if ref is None:
        return runs[-1] if runs else None
    if "/" in ref:
        return None
    exact = [p for p in runs if p.run_id == ref]
    matches = exact or [p for p in runs if p.run_id.startswith(ref)]
    return matches[0] if len(matches) == 1 else None


def resolve_run(store: RunStore, ref: str | None) -> RunRecord | Preparing:
    """What ``tfl status RUN`` and ``tfl stop RUN`` act on: the recorded run ``ref`` names (as
    ``RunStore.resolve``), else the launch being prepared it names; without ``ref``, the latest
    of them."""
    preparing = find_preparing(store.home, ref)
    try:
        record = store.resolve(ref)
    except RunNotFoundError:
        if preparing is None:
            raise
        return preparing
    if ref is None and preparing is not None and preparing.created > record.created:
        return preparing
    return record
