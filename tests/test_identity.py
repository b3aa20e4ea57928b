"""Process identity: a live launcher is never taken for dead, a recorded pid never for another process.

`tfl status` and `tfl stop` run here in a process of their own that sees the world changed
(a clock step, another host name) while a real detached launcher runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from launcher.records.identity import ProcessIdentity, find_process, start_ticks
from launcher.records.states import RunState
from launcher.records.store import RunStore
from tests.procs import tfl_processes

SLEEP = """
    import os, time
    print("ready", os.environ["TFL_TASK"], flush=True)
    time.sleep(600)
"""


def tfl_seen_from(args: list[str], env: dict[str, str], *, clock_step: float = 0.0,
                  host: str | None = None) -> subprocess.CompletedProcess[str]:
    """`tfl ARGS` in a process whose wall clock was stepped by ``clock_step`` s since boot
    (psutil reads the boot time anew at each call: a step moves every create time), or
    that runs on a machine called ``host`` (another machine sharing TFL_HOME)."""
    code = textwrap.dedent(f"""
        import socket, sys
        import psutil._pslinux as pslinux
        booted = pslinux.boot_time
        pslinux.boot_time = lambda: booted() + {clock_step!r}
        host = {host!r}
        if host is not None:
            socket.gethostname = lambda: host
        from launcher.cli import main
        sys.argv = ["tfl", *{args!r}]
        main()
    """)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def detached_run(tmp_path: Path, child_env: dict[str, str], tfl_home: Path) -> str:
    job = tmp_path / "sleep.py"
    job.write_text(textwrap.dedent(SLEEP))
    started = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--local", "1", "--detach",
                              "--grace-period", "1"], env=child_env, capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    run = started.stdout.strip()
    # Its task running *and* recorded, as the tests' first look expects ("running", alive 1): the task's
    # process exists a moment before the launcher saves its pid and then the run's "running" (a loaded
    # machine: longer than a `tfl status` takes to start, which then said "starting").
    deadline = time.monotonic() + 30  # a hang guard
    while not _running_and_recorded(tfl_home, run) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield run
    stopped = subprocess.run([sys.executable, "-m", "launcher", "stop", run], env=child_env, capture_output=True,
                             text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr


def _running_and_recorded(home: Path, run: str) -> bool:
    record = RunStore(home).load(run)
    return (record.state == RunState.RUNNING and all(t.pid for t in record.tasks)
            and len(tfl_processes(run_id=run)) == 1)


def status(run: str, env: dict[str, str], **seen: object) -> dict[str, object]:
    result = tfl_seen_from(["status", run, "--json"], env, **seen)  # type: ignore[arg-type]
    assert result.returncode == 0, result.stderr
    view: dict[str, object] = json.loads(result.stdout)
    return view


def test_a_clock_step_does_not_make_a_live_launcher_lost(detached_run: str, child_env: dict[str, str]) -> None:
    assert status(detached_run, child_env)["state"] == "running"
    for step in (-3600.0, 0.5, 86400.0):
        view = status(detached_run, child_env, clock_step=step)
        assert view["state"] == "running", f"a clock step of {step} s made the live launcher {view['state']}"
        assert view["alive"] == 1, f"a clock step of {step} s made the live task gone"


def test_status_and_stop_from_another_machine_name_the_launchers_host(detached_run: str, child_env: dict[str, str]) -> None:
    here = os.uname().nodename
    view = status(detached_run, child_env, host="elsewhere")
    assert view["state"] == "running" and view["elsewhere"] == here  # not "lost": only its host can tell
    listed = tfl_seen_from(["status"], child_env, host="elsewhere")
    assert f"running on {here}" in listed.stdout
    detail = tfl_seen_from(["status", detached_run], child_env, host="elsewhere").stdout
    assert f"its launcher runs on host {here}" in detail
    stop = tfl_seen_from(["stop", detached_run], child_env, host="elsewhere")
    assert stop.returncode == 2 and "Traceback" not in stop.stderr
    assert stop.stderr.strip() == (f"tfl: error: run {detached_run}: its launcher runs on host {here}, not on this one; "
                                   f"run `tfl stop {detached_run}` there")
    assert len(tfl_processes(run_id=detached_run)) == 1  # refused: nothing was stopped from the wrong machine
    assert status(detached_run, child_env)["state"] == "running"


def test_identity_is_exact_in_ticks_and_never_matches_another_boot_or_host() -> None:
    me = ProcessIdentity.of(os.getpid())
    assert me.start_ticks is not None and me.find() is not None
    assert find_process(os.getpid(), None, me.start_ticks) is not None
    assert find_process(os.getpid(), me.create_time, me.start_ticks - 1) is None  # started one tick apart: another process
    assert find_process(os.getpid(), me.create_time + 1.0, None) is None  # an old record: create time alone, 10 ms
    assert ProcessIdentity(me.pid, me.create_time, me.start_ticks, "another-boot", me.host).find() is None
    other_host = ProcessIdentity(me.pid, me.create_time, me.start_ticks, me.boot_id, "elsewhere")
    assert other_host.find() is None and other_host.elsewhere == "elsewhere"
    parent = psutil.Process().parent()
    assert parent is not None and start_ticks(parent.pid) is not None and start_ticks(parent.pid) <= me.start_ticks


def test_the_ssh_agent_knows_its_tasks_by_ticks_across_a_clock_step() -> None:
    from launcher.engines.ssh.node import agent

    me = ProcessIdentity.of(os.getpid())
    stepped = {"name": "t", "pid": me.pid, "create_time": me.create_time + 5.0, "start_ticks": me.start_ticks}
    assert agent._find(stepped) is not None  # the recorded create time is off by a clock step; the ticks match
    assert agent._find({**stepped, "start_ticks": me.start_ticks - 1}) is None
    assert agent._find({**stepped, "start_ticks": None}) is None  # an old record: create time alone


def test_a_run_of_the_same_id_in_another_store_is_not_this_runs(tmp_path: Path) -> None:
    """`tfl stop` finds a run's unnamed processes by their TFL_RUN_ID marker; one that names
    another run dir (the same id in another store: a copied record resumed there) is left alone.
    Two tests resuming the same recorded run in two stores at once once stopped each other's."""
    from launcher.contract import RUN_DIR, RUN_ID
    from launcher.records.identity import marked_processes

    sleep = [sys.executable, "-c", "import time; time.sleep(600)"]
    procs = {name: subprocess.Popen(sleep, env={**os.environ, RUN_ID: "r1", RUN_DIR: str(tmp_path / name / "runs" / "r1")})
             for name in ("mine", "other")}
    unmarked = subprocess.Popen(sleep, env={k: v for k, v in os.environ.items() if k != RUN_DIR} | {RUN_ID: "r1"})
    try:
        found = {p.pid for p in marked_processes("r1", {}, str(tmp_path / "mine" / "runs" / "r1"))}
        assert procs["mine"].pid in found and unmarked.pid in found  # no run dir named: the marker decides
        assert procs["other"].pid not in found
        assert {procs["mine"].pid, procs["other"].pid} <= {p.pid for p in marked_processes("r1", {})}
    finally:
        for proc in (*procs.values(), unmarked):
            proc.kill()
            proc.wait()
