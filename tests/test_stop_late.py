"""A `tfl stop` in a run's last milliseconds: the run that ended on its own is said as it ended,
and its launcher still says its summary and exits with the run's code (not 143).

The interleavings are injected, never raced: the record is saved as ended between `tfl stop`'s
read and its signal, and the launcher is sent SIGTERM just after its run has ended."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from launcher.records.identity import ProcessIdentity
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord, RunStore, TaskRecord
from launcher.runs import stop as control

# Stands in for a launcher whose run has just ended: a SIGTERM now only makes it exit with the run's code.
ENDING_LAUNCHER = ("import signal, sys, time\n"
                   "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
                   "print('ready', flush=True)\n"
                   "time.sleep(600)\n")


def started(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # its handler is in place
    return proc


def recorded(store: RunStore, launcher: subprocess.Popen[str], state: RunState) -> RunRecord:
    me = ProcessIdentity.of(launcher.pid)
    done = state.is_terminal
    task = TaskRecord(task="chief:0", host="localhost", backend="local", log_path="l", progress_path="p",
                      state=TaskState.SUCCEEDED if done else TaskState.RUNNING, exit_code=0 if done else None)
    record = RunRecord(run_id="r", job="j.py", job_args=[], run_dir=str(store.run_dir("r")), created=1.0, state=state,
                       tasks=[task], exit_code=0 if done else None, launcher_pid=me.pid, launcher_create_time=me.create_time,
                       launcher_start_ticks=me.start_ticks, launcher_boot_id=me.boot_id, launcher_host=me.host,
                       grace_period=5.0)
    store.create(record)
    return record


def end(proc: subprocess.Popen[str]) -> int | None:
    """Its exit code if it had exited by itself; then it is gone either way."""
    code = proc.poll()
    if code is None:
        proc.kill()
    proc.wait(timeout=60)
    return code


def test_stop_does_not_signal_a_launcher_whose_run_has_ended(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    launcher = started("import time; print('ready', flush=True); time.sleep(600)")  # SIGTERM would end it
    try:
        said = control.stop_run(store, recorded(store, launcher, RunState.SUCCEEDED), grace=0.0)
        assert said == "run r: already succeeded; nothing to stop"
        assert launcher.poll() is None, f"the launcher of a run that had ended got a signal: exit {launcher.returncode}"
    finally:
        end(launcher)
    assert store.load("r").state is RunState.SUCCEEDED


def test_a_run_that_ends_as_the_stop_comes_is_said_as_it_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = RunStore(tmp_path)
    launcher = started(ENDING_LAUNCHER)
    record = recorded(store, launcher, RunState.RUNNING)
    real_teardown = control.teardown

    def run_ends_first(*args: Any, **kwargs: Any) -> None:
        ended = store.load("r")  # the run succeeds between `tfl stop`'s read of its record and its SIGTERM
        ended.state, ended.exit_code, ended.tasks[0].state = RunState.SUCCEEDED, 0, TaskState.SUCCEEDED
        store.save(ended)
        real_teardown(*args, **kwargs)

    monkeypatch.setattr(control, "teardown", run_ends_first)
    try:
        said = control.stop_run(store, record, grace=0.0)
    finally:
        code = end(launcher)
    assert code == 0  # it got the SIGTERM and exited as a launcher whose run had ended
    assert said == "run r: already succeeded; nothing to stop"
    assert store.load("r").state is RunState.SUCCEEDED


LATE_SIGTERM = textwrap.dedent("""
    import os, signal, sys
    import launcher.views.report as report
    real = report.summary

    def late(record):  # `tfl stop`'s SIGTERM lands once the run has ended, before its summary
        os.kill(os.getpid(), signal.SIGTERM)
        return real(record)

    report.summary = late
    sys.argv = ["tfl", *sys.argv[1:]]
    from launcher.cli import main
    main()
""")


def test_a_sigterm_after_the_run_ended_keeps_its_summary_and_exit_code(tmp_path: Path, child_env: dict[str, str]) -> None:
    job = tmp_path / "quick.py"
    job.write_text("print('trained', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", LATE_SIGTERM, "launch", str(job), "--local", "1"], env=child_env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"exit {done.returncode} (-{signal.SIGTERM.value}: killed by it): {done.stderr[-2000:]}"
    assert " succeeded in " in done.stderr, done.stderr[-2000:]


class _Ended:
    """A supervisor whose run has ended: all ``_stop_on_signals`` asks of it."""

    class record:  # noqa: N801  # the attribute the context reads
        state = RunState.SUCCEEDED


def test_a_run_ended_in_this_process_leaves_no_ignored_signal_to_the_processes_it_starts_later() -> None:
    """An in-process launch (CliRunner's, a test's) whose run ended: the SIGTERM and SIGHUP it no longer
    dies of are held by a handler of its own, never SIG_IGN, which every process it starts later would
    inherit (a launcher started after it took SIGHUP for `nohup` and kept running: fc58 failed on it)."""
    from launcher.runs.launch import _stop_on_signals

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with _stop_on_signals(_Ended(), exits_after=True):  # type: ignore[arg-type]
            pass
        assert all(signal.getsignal(s) not in (signal.SIG_IGN, signal.SIG_DFL) for s in before)  # still not fatal here
        child = subprocess.run([sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGHUP) == signal.SIG_DFL, "
                                "signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)"], capture_output=True, text=True, timeout=60)
        assert child.stdout.split() == ["True", "True"], child.stdout + child.stderr  # SIG_IGN would be inherited
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
