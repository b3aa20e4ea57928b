"""``tfl stop`` and ``tfl logs``: control a run from any terminal.

Stop asks the run's launcher to stop (SIGTERM, after a note in the run dir that says it is
the user's and not a preemption): it gives every task the notice (SIGTERM), the grace to
save the agreed checkpoint, then SIGKILL, and records STOPPED. Then the run's backend stops
whatever is left (``Backend.stop_recorded``, the same notice and grace): all of it when the
launcher is gone (killed with -9, machine rebooted…). Idempotent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Callable, TextIO

import psutil

from launcher.console import say
from launcher.engines import registry
from launcher.engines.base import Stopped
from launcher.engines.teardown import teardown
from launcher.errors import RunNotFoundError, UsageError
from launcher.files import write_atomic
from launcher.records.identity import is_running, launcher_identity
from launcher.records.index import active_ids
from launcher.records.preparing import Preparing, end_preparing, preparing_runs, resolve_run
from launcher.records.states import RunState, TaskState
from launcher.records.store import STATE_FILE, STOP_REQUEST, RunRecord, RunStore
from launcher.tasks import TaskId
from launcher.views.logs import LogFollower
from launcher.views.status import effective_state

SHOWN = 8  # hosts not reached, named one by one; the rest counted
LAUNCHER_EXTRA_GRACE = 15.0  # beyond its grace: the launcher's SIGKILL of its tasks (teardown.KILL_WAIT) and last save


def stop_run(store: RunStore, record: RunRecord, grace: float | None = None) -> str:
    """Stop a run; returns what was done, in one line. ``grace``: for what the launcher left
    (default: the run's own, as its launcher would give)."""
    grace = record.grace_period if grace is None else grace
    identity = launcher_identity(record)
    if identity.elsewhere and not record.state.is_terminal:
        raise UsageError(f"run {record.run_id}: its launcher runs on host {identity.elsewhere}, not on this one; "
                         f"run `tfl stop {record.run_id}` there")
    # A launcher whose record says the run ended is only saying so and exiting: nothing of it to stop.
    launcher = identity.find() if not record.state.is_terminal else None
    if launcher is not None:
        # SIGTERM, never repeated (the launcher's handler takes only a second SIGINT for "kill
        # now"). It tears its tasks down with the run's own grace, however long; only a launcher
        # still there after that is taken for wedged and killed, and the backend's stop below
        # then does its work.
        wait = max(grace, record.grace_period) + LAUNCHER_EXTRA_GRACE
        store.request_stop(record)  # this SIGTERM is the user's: the run ends STOPPED, not PREEMPTED
        teardown([launcher], signal=_send, alive=is_running, grace=wait, kill_wait=5.0)
    stopped = registry.get(record.backend).stop_recorded(store.load(record.run_id), grace)
    record = store.load(record.run_id)
    if record.state.is_terminal:
        # The run may have ended on its own as the stop came (its record saved before the SIGTERM landed):
        # only a run that ended STOPPED was stopped by this; the others are said as they ended.
        if record.state == RunState.STOPPED and (launcher or stopped.alive):
            did = "stopped"
        elif stopped.alive:
            did = f"already {record.state.value}; stopped {stopped.alive} process(es) it left"
        else:
            did = f"already {record.state.value}; nothing to stop"
        return f"run {record.run_id}: {did}" + _unreached(stopped)
    _mark_stopped(store, record, "stopped by `tfl stop` (the launcher was gone)")
    return f"run {record.run_id}: stopped {stopped.alive} process(es) left by a launcher that was gone" + _unreached(stopped)


def stop_ref(store: RunStore, ref: str | None, grace: float | None = None) -> str:
    """``tfl stop [RUN]``: a recorded run (``stop_run``), or a detached launch being prepared (``call_off``);
    without RUN, the latest active run (``active_runs``), the others still active named after it."""
    if ref is not None:
        found: RunRecord | Preparing = resolve_run(store, ref)
        return call_off(store, found, grace) if isinstance(found, Preparing) else stop_run(store, found, grace)
    live = active_runs(store)
    if not live:
        return "no run is active; nothing to stop (`tfl status` lists the runs; `tfl stop RUN` names one)"
    found, others = live[0], [run.run_id for run in live[1:]]
    said = call_off(store, found, grace) if isinstance(found, Preparing) else stop_run(store, found, grace)
    if others:
        shown = ", ".join(others[:SHOWN]) + (f", and {len(others) - SHOWN} more" if len(others) > SHOWN else "")
        said += f"\n{len(others)} other run(s) still active: {shown} (`tfl stop RUN` stops one)"
    return said


def active_runs(store: RunStore) -> list[RunRecord | Preparing]:
    """What ``tfl stop`` without RUN looks at: the runs that are active (recorded and not ended, a lost
    one included, or a detached launch being prepared), the latest first: as ``kill %%`` means the
    current job, never a finished run that happens to be the latest. An active run whose record
    cannot be read is refused, naming it (a newer tfl's record: stop it by name with that tfl)."""
    with contextlib.suppress(RunNotFoundError):  # none recorded yet: one being prepared may still be there
        store.resolve(None)  # the latest record unreadable (a newer tfl's): refused as `tfl logs` refuses it
    records, unreadable = store.scan(active_ids(store.home))
    if unreadable:
        raise UsageError(f"the active run {unreadable[0].run_id} is unreadable: {unreadable[0].reason}; "
                         "name a RUN to stop: `tfl stop RUN`")
    live: list[RunRecord | Preparing] = [r for r in records if not r.state.is_terminal]
    live += preparing_runs(store.home)
    return sorted(live, key=lambda run: run.created, reverse=True)


def call_off(store: RunStore, preparing: Preparing, grace: float | None = None) -> str:
    """Call off a detached launch whose hosts are being made ready: its launcher gets SIGTERM with
    `tfl stop`'s note, removes what it shipped and exits; a run it recorded meanwhile is stopped as
    any run. Its run dir goes with it, unless the `tfl launch --detach` waiting for it is still
    there (that one says the launcher's last line and removes it)."""
    launcher = preparing.launcher.find()
    if launcher is None:
        end_preparing(store.home, preparing.run_id, preparing.run_dir)
        return (f"run {preparing.run_id}: its background launcher (pid {preparing.launcher.pid}) ended before it recorded "
                f"the run; nothing to stop (its log: {preparing.run_dir}/launcher.log; `tfl rm {preparing.run_id}` "
                "removes its dir)")
    run_dir = Path(preparing.run_dir)
    write_atomic(run_dir / STOP_REQUEST, "")
    teardown([launcher], signal=_send, alive=is_running, grace=(grace or 0.0) + LAUNCHER_EXTRA_GRACE, kill_wait=5.0)
    if (run_dir / STATE_FILE).exists():  # recorded before the SIGTERM came: a run, stopped as one
        return stop_run(store, store.load(preparing.run_id), grace)
    end_preparing(store.home, preparing.run_id, preparing.run_dir)
    if preparing.waiting is None or not preparing.waiting.alive():
        shutil.rmtree(run_dir, ignore_errors=True)
    return (f"run {preparing.run_id}: called off while its hosts were being made ready: no task started, and what was "
            "shipped to them is removed")


def _unreached(stopped: Stopped) -> str:
    """The hosts the stop could not ask, one line each (the first ``SHOWN``)."""
    lines = [f"\n  not reached: {why}" for why in stopped.unreached[:SHOWN]]
    more = len(stopped.unreached) - SHOWN
    return "".join(lines) + (f"\n  not reached: {more} more host(s)" if more > 0 else "")


def _send(proc: psutil.Process, signum: int) -> None:
    try:
        proc.send_signal(signum)
    except psutil.Error:
        pass


def _mark_stopped(store: RunStore, record: RunRecord, message: str) -> None:
    now = time.time()
    for task in record.tasks:
        if not task.state.is_terminal:
            task.state, task.ended = TaskState.STOPPED, now
    record.state, record.message, record.ended, record.exit_code = RunState.STOPPED, message, now, 130
    store.save(record)


def _ended(store: RunStore, run_id: str) -> bool:
    state = effective_state(store.load(run_id))
    return state.is_terminal or state == RunState.LOST


def logs_of(store: RunStore, ref: str | None) -> RunRecord:
    """The run ``tfl logs`` shows (as ``tfl stop`` finds it); a detached launch not recorded yet has
    no task logs: said in one line with its launcher's log, never "not found" nor an older run's logs."""
    found = resolve_run(store, ref)
    if not isinstance(found, Preparing):
        return found
    log = f"{found.run_dir}/launcher.log"
    if found.launcher.alive():
        raise RunNotFoundError(f"run {found.run_id} is being prepared (its hosts made ready): no task has started, so no "
                               f"task logs yet; its background launcher's log: {log}")
    raise RunNotFoundError(f"run {found.run_id}: its background launcher (pid {found.launcher.pid}) ended before it recorded "
                           f"the run; no task ran (its log: {log}; `tfl rm {found.run_id}` removes its dir)")


def show_logs(store: RunStore, record: RunRecord, out: TextIO, *, task: str | None = None, follow: bool = False,
              colour: bool = False, verbose: bool = False, tail: int | None = None, interval: float = 0.2,
              sleep: Callable[[float], None] = time.sleep) -> None:
    """Print the run's logs with task prefixes; ``follow`` keeps going until the run ends.
    TensorFlow's known start-up noise is hidden (and counted) unless ``verbose``. ``tail``: each
    task's last ``tail`` lines of what its log holds now, then (with ``follow``) every new one."""
    tasks = record.tasks
    if task is not None:
        try:
            wanted = str(TaskId.parse(task))
        except ValueError as exc:
            raise UsageError(f"--task {exc}") from None
        tasks = [t for t in tasks if t.task == wanted]
        if not tasks:
            raise UsageError(f"--task {task}: run {record.run_id} has no such task ({', '.join(t.task for t in record.tasks)})")
    follower = LogFollower([(t.task, t.log_path) for t in tasks], out, colour=colour, hide_noise=not verbose, tail=tail)
    follower.poll_once(final=not follow)  # a log's last line without its newline counts as a line of the tail
    while follow and not follower.gone and not _ended(store, record.run_id):  # gone: `tfl logs -f | head` ended
        sleep(interval)
        follower.poll_once()
    follower.stop()
    if follow and not follower.gone and effective_state(store.load(record.run_id)) == RunState.LOST:
        # The launcher is gone but its record is not finished: tasks it left may still write their logs.
        say(f"tfl: run {record.run_id} is lost (its launcher is gone): --follow stops here; tasks it left may still "
            f"run and write their logs: `tfl status {record.run_id}` shows them, `tfl stop {record.run_id}` ends them")
    for one in tasks:  # a log that is not there shows nothing: say so rather than look like an empty one
        if not os.path.exists(one.log_path):
            say(f"tfl: {one.task} has no log at {one.log_path} (not started yet, or the file was removed)")
