"""Signals to the launcher and `tfl stop`: real launchers of tiny jobs, plus the Waker alone.

Every test that starts a launcher runs under ``tfl_home``, which fails it if any task of
its runs outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from launcher.contract import PREEMPTED_EXIT_CODE
from launcher.records.store import RunStore
from launcher.runs import stop as control
from launcher.supervise.waker import Waker
from tests.procs import tfl_processes

SLEEP_IGNORING_TERM = """
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopped only by the SIGKILL after the grace
    print("ready", os.environ["TFL_TASK"], flush=True)
    time.sleep(600)
"""


@pytest.fixture
def sleeper(tmp_path: Path) -> str:
    path = tmp_path / "sleeper.py"
    path.write_text(textwrap.dedent(SLEEP_IGNORING_TERM))
    return str(path)


def start_launcher(job: str, env: dict[str, str], home: Path, *args: str, tasks: int = 2,
                   ignore_hup: bool = False) -> subprocess.Popen[str]:
    def keep_sighup_ignored() -> None:  # what `nohup` does before it runs the command
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", job, "--local", str(tasks), *args],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=keep_sighup_ignored if ignore_hup else None)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = list(home.glob("runs/*/logs/*.log"))
        if len(logs) == tasks and all("ready" in p.read_text() for p in logs):
            return launcher
        assert launcher.poll() is None, launcher.communicate()[1]
        time.sleep(0.05)
    launcher.kill()
    raise AssertionError("the tasks never became ready")


def only_run(home: Path) -> str:
    (run,) = [p.name for p in (home / "runs").iterdir()]
    return run


# --- the Waker ----------------------------------------------------------------------------
def test_waker_wait_times_out_then_a_wake_from_another_thread_ends_it() -> None:
    waker = Waker()
    start = time.monotonic()
    assert waker.wait(0.05) is False and time.monotonic() - start >= 0.04
    threading.Timer(0.05, waker.wake).start()
    start = time.monotonic()
    assert waker.wait(10) is True  # woken, not timed out


def test_waker_wakes_before_the_wait_count_once_and_never_block() -> None:
    waker = Waker()
    for _ in range(200_000):  # more than a pipe holds: a full pipe is a pending wake, not an error
        waker.wake()
    assert waker.wait(0) is True
    assert waker.wait(0) is False  # every pending wake was consumed by that one wait


def test_waker_wake_from_a_signal_handler_ends_the_wait() -> None:
    waker = Waker()
    previous = signal.signal(signal.SIGUSR1, lambda *_: waker.wake())
    try:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        assert waker.wait(10) is True  # woken, not timed out
    finally:
        signal.signal(signal.SIGUSR1, previous)


# --- signals to a real launcher -----------------------------------------------------------
def test_a_storm_of_sigterm_neither_hangs_nor_crashes_nor_cuts_the_grace(sleeper: str, child_env: dict[str, str],
                                                                          tfl_home: Path) -> None:
    """The handler used to call Event.set(): a signal landing while the main thread held the
    Event's lock hung the launcher (or, signal upon signal, crashed it with RecursionError)."""
    grace = 3.0
    launcher = start_launcher(sleeper, child_env, tfl_home, "--grace-period", str(grace))
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < grace / 2 and launcher.poll() is None:
        os.kill(launcher.pid, signal.SIGTERM)
        sent += 1
    _, err = launcher.communicate(timeout=30)
    took = time.monotonic() - start
    # The launcher's own SIGTERM (not `tfl stop`'s) is its machine going away: a preemption.
    assert launcher.returncode == PREEMPTED_EXIT_CODE, err[-2000:]
    assert "preempted after" in err and "tfl got SIGTERM" in err and "Traceback" not in err
    assert f"tfl resume {only_run(tfl_home)}" in err
    assert took >= grace * 0.9, f"SIGTERM forced the kill: ended after {took:.1f} s of a {grace} s grace ({sent} signals)"
    assert tfl_processes(home=str(tfl_home)) == []


def test_nohup_launch_keeps_running_through_sighup(sleeper: str, child_env: dict[str, str], tfl_home: Path) -> None:
    launcher = start_launcher(sleeper, child_env, tfl_home, "--grace-period", "0", ignore_hup=True)
    try:
        launcher.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert launcher.poll() is None and len(tfl_processes(home=str(tfl_home))) == 2
    finally:
        launcher.send_signal(signal.SIGINT)
        _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, err[-2000:]


def test_sighup_without_nohup_still_stops_the_run(sleeper: str, child_env: dict[str, str], tfl_home: Path) -> None:
    launcher = start_launcher(sleeper, child_env, tfl_home, "--grace-period", "0")
    launcher.send_signal(signal.SIGHUP)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130 and "stopped by the user" in err


def test_one_ctrl_c_relayed_by_uv_run_keeps_the_grace(sleeper: str, child_env: dict[str, str], tfl_home: Path) -> None:
    """`uv run tfl launch` passes the terminal's SIGINT on to tfl, which got it from the terminal
    too: one Ctrl-C arrives twice, milliseconds apart. It used to count as Ctrl-C twice and
    SIGKILL the tasks at once, with no time to save the agreed checkpoint."""
    grace = 3.0
    launcher = start_launcher(sleeper, child_env, tfl_home, "--grace-period", str(grace))
    start = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    time.sleep(0.1)  # two signals sent at once are one pending signal; uv's copy comes once tfl took the first
    launcher.send_signal(signal.SIGINT)  # uv's copy of the same press
    _, err = launcher.communicate(timeout=30)
    took = time.monotonic() - start
    assert launcher.returncode == 130 and "stopped by the user" in err, err[-2000:]
    assert took >= grace * 0.9, f"one relayed Ctrl-C forced the kill: ended after {took:.1f} s of a {grace} s grace"


def test_a_second_ctrl_c_kills_at_once(sleeper: str, child_env: dict[str, str], tfl_home: Path) -> None:
    grace = 30.0
    launcher = start_launcher(sleeper, child_env, tfl_home, "--grace-period", str(grace))
    start = time.monotonic()
    launcher.send_signal(signal.SIGINT)
    time.sleep(1.0)  # a person's second press
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=30)
    took = time.monotonic() - start
    assert launcher.returncode == 130 and "stopped by the user" in err, err[-2000:]
    assert took < grace / 2, f"the second Ctrl-C did not kill at once: ended after {took:.1f} s"


def test_tfl_stop_twice_keeps_the_grace(sleeper: str, child_env: dict[str, str], tfl_home: Path) -> None:
    """docs/commands.md says stopping twice is fine: the second `tfl stop` must not be taken for a
    second Ctrl-C (which kills at once)."""
    grace = 4.0
    launcher = start_launcher(sleeper, child_env, tfl_home, "--grace-period", str(grace))
    run = only_run(tfl_home)
    stop = [sys.executable, "-m", "launcher", "stop", run]
    first = subprocess.Popen(stop, env=child_env, stdout=subprocess.PIPE, text=True)
    state = tfl_home / "runs" / run / "state.json"
    while json.loads(state.read_text())["state"] != "stopping":  # the first stop's SIGTERM has landed
        assert first.poll() is None and launcher.poll() is None
        time.sleep(0.02)
    stopping = time.monotonic()
    second = subprocess.run(stop, env=child_env, capture_output=True, text=True, timeout=60)
    _, err = launcher.communicate(timeout=30)
    took = time.monotonic() - stopping
    out, _ = first.communicate(timeout=60)
    assert first.returncode == 0 and second.returncode == 0 and out.strip() == f"run {run}: stopped"
    assert launcher.returncode == 130, err[-2000:]
    assert took >= grace * 0.9, f"the second stop cut the {grace} s grace short: the run ended {took:.1f} s after the first"
    assert RunStore(tfl_home).load(run).state.value == "stopped"


def test_tfl_stop_waits_for_a_launcher_with_a_longer_grace(sleeper: str, child_env: dict[str, str], tfl_home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`tfl stop` waits for the launcher's own grace (recorded with the run), not its own,
    before it takes the launcher for wedged and kills it."""
    # The task ignores SIGTERM, so the launcher's teardown lasts its whole 6 s grace. A stop that waited
    # its own 0.5 s + 5 would kill the launcher at 5.5 s, always; the launcher's 6 + 5 leaves it 5 s for
    # its SIGKILL and last save (2 s were too few at load 30-50).
    monkeypatch.setattr(control, "LAUNCHER_EXTRA_GRACE", 5.0)
    launcher = start_launcher(sleeper, child_env, tfl_home, "--grace-period", "6", tasks=1)
    store = RunStore(tfl_home)
    said = control.stop_run(store, store.load(only_run(tfl_home)), grace=0.5)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130, f"the launcher was killed in its teardown ({launcher.returncode}): {err[-1000:]}"
    assert said == f"run {only_run(tfl_home)}: stopped"
    record = store.load(only_run(tfl_home))
    assert record.grace_period == 6.0 and record.message == "stopped by the user"
