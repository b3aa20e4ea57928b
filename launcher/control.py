"""``tfl stop`` and ``tfl logs``: control a run from any terminal.

Stop asks the run's launcher to stop (SIGTERM: it tears its tasks down and records
STOPPED). When the launcher is gone (killed with -9, machine rebooted…) stop does the
teardown itself: every process carrying the run's ``TFL_RUN_ID`` marker, or matching a
recorded pid *and* create time, gets SIGTERM, a grace period, then SIGKILL. Idempotent.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Callable, TextIO

import psutil

from launcher.errors import UsageError
from launcher.logstream import LogFollower
from launcher.runstore import RunRecord, RunStore
from launcher.states import RunState, TaskState
from launcher.status import effective_state, find_process
from launcher.tfconfig import TaskId


def run_processes(record: RunRecord) -> list[psutil.Process]:
    """Every live local process of the run: recorded tasks and anything with its marker."""
    found = {p.pid: p for t in record.tasks if (p := find_process(t.pid, t.create_time))}
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get("TFL_RUN_ID") == record.run_id and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = proc
        except psutil.Error:
            continue
    return list(found.values())


def _signal_all(procs: list[psutil.Process], signum: int) -> None:
    for proc in procs:
        try:
            pgid = os.getpgid(proc.pid)
            if pgid == os.getpgid(0):
                proc.send_signal(signum)  # never signal our own group
            else:
                os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass


def _signal_all_direct(procs: list[psutil.Process], signum: int) -> None:
    for proc in procs:
        try:
            proc.send_signal(signum)
        except psutil.Error:
            pass


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return alive


def stop_run(store: RunStore, record: RunRecord, grace: float = 5.0) -> str:
    """Stop a run; returns what was done, in one line."""
    launcher = find_process(record.launcher_pid, record.launcher_create_time)
    if launcher is not None:
        _signal_all_direct([launcher], signal.SIGTERM)
        # A wedged launcher is killed; the teardown below then does its work.
        _signal_all_direct(_wait_gone([launcher], grace + 15.0), signal.SIGKILL)
    procs = run_processes(record)
    _signal_all(procs, signal.SIGTERM)
    remote = _stop_remote(store.load(record.run_id), grace)
    left = _wait_gone(procs, grace)
    _signal_all(left, signal.SIGKILL)
    _wait_gone(left, 5.0)
    record = store.load(record.run_id)
    if record.state.is_terminal:
        did = "stopped" if launcher or procs else f"already {record.state.value}; nothing to stop"
        return f"run {record.run_id}: {did}"
    _mark_stopped(store, record, "stopped by `tfl stop` (the launcher was gone)")
    return f"run {record.run_id}: stopped {len(procs) + remote} process(es) left by a launcher that was gone"


def _stop_remote(record: RunRecord, grace: float) -> int:
    """SIGTERM, grace, SIGKILL to the run's SSH tasks still alive on their hosts.

    Their agents also kill them on their own once the launcher's connection is gone;
    this makes it immediate. Returns how many were signalled.
    """
    if not any(t.backend == "ssh" and t.pid for t in record.tasks):
        return 0
    from launcher.remotestatus import remote_signal, remote_task_info  # fabric: only for SSH runs

    signalled = [task for task, answer in remote_signal(record, signal.SIGTERM).items() if answer == "signalled"]
    deadline = time.monotonic() + grace
    while signalled and time.monotonic() < deadline:
        time.sleep(0.2)
        if not any(info.get("alive") for info in remote_task_info(record).values()):
            return len(signalled)
    if signalled:
        remote_signal(record, signal.SIGKILL)
    return len(signalled)


def _mark_stopped(store: RunStore, record: RunRecord, message: str) -> None:
    now = time.time()
    for task in record.tasks:
        if not task.state.is_terminal:
            task.state, task.ended = TaskState.STOPPED, now
    record.state, record.message, record.ended, record.exit_code = RunState.STOPPED, message, now, 130
    store.save(record)


def _ended(store: RunStore, run_id: str) -> bool:
    return effective_state(store.load(run_id)) in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.LOST)


def show_logs(store: RunStore, record: RunRecord, out: TextIO, *, task: str | None = None, follow: bool = False,
              colour: bool = False, interval: float = 0.2, sleep: Callable[[float], None] = time.sleep) -> None:
    """Print the run's logs with task prefixes; ``follow`` keeps going until the run ends."""
    tasks = record.tasks
    if task is not None:
        try:
            wanted = str(TaskId.parse(task))
        except ValueError as exc:
            raise UsageError(f"--task {exc}") from None
        tasks = [t for t in tasks if t.task == wanted]
        if not tasks:
            raise UsageError(f"--task {task}: run {record.run_id} has no such task ({', '.join(t.task for t in record.tasks)})")
    follower = LogFollower([(t.task, t.log_path) for t in tasks], out, colour=colour)
    follower.poll_once()
    while follow and not _ended(store, record.run_id):
        sleep(interval)
        follower.poll_once()
    follower.poll_once(final=True)
