"""Jobs that misbehave, under a real `tfl launch --local`: what they do must not outlive the run.

Every test runs under the ``tfl_home`` fixture, which fails if any task of its runs is alive
afterwards (after a wait); the tests here assert it at once, as the launcher returns.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.procs import pid_alive, tfl_processes

# A daemon by the book (fork, setsid, fork) and a child in a process group of its own: neither
# is in the task's process group, which is what the launcher signals. Each writes its pid first,
# as <dir>/<task>.<pid>; the task waits for both (a hang guard: 60 s), then sleeps argv[2] s.
ESCAPES = """
    import os, subprocess, sys, time
    mark = os.path.join(sys.argv[1], os.environ["TFL_TASK"].replace(":", "-"))
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            open(f"{mark}.{os.getpid()}", "w").close()
            time.sleep(120)
        os._exit(0)
    subprocess.Popen([sys.executable, "-c", "import os, sys, time; open(f'{sys.argv[1]}.{os.getpid()}', 'w').close(); "
                      "time.sleep(120)", mark], process_group=0)
    deadline = time.monotonic() + 60
    while len([f for f in os.listdir(sys.argv[1]) if f.startswith(os.path.basename(mark) + ".")]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    print("escaped", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def _escaped(pids: Path) -> list[int]:
    return [int(p.name.rsplit(".", 1)[1]) for p in pids.iterdir()]


def _launch(tmp_path: Path, env: dict[str, str], seconds: float) -> tuple[subprocess.Popen[str], Path]:
    job, pids = tmp_path / "escapes.py", tmp_path / "pids"
    job.write_text(textwrap.dedent(ESCAPES))
    pids.mkdir()
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--local", "2", "--grace-period", "5",
                                 "--", str(pids), str(seconds)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return launcher, pids


def test_a_daemon_a_task_left_ends_with_the_run(tmp_path: Path, child_env: dict[str, str], tfl_home: Path) -> None:
    launcher, pids = _launch(tmp_path, child_env, 0)
    out, err = launcher.communicate(timeout=120)
    escaped = _escaped(pids)
    assert launcher.returncode == 0 and "succeeded" in err, err
    assert len(escaped) == 4 and out.count("escaped") == 2
    assert [p for p in escaped if pid_alive(p)] == [] and tfl_processes(home=str(tfl_home)) == []
    assert "tfl: ending 4 process(es) the tasks left outside their process groups" in err


def test_ctrl_c_ends_what_the_tasks_started_outside_their_groups(tmp_path: Path, child_env: dict[str, str],
                                                                 tfl_home: Path) -> None:
    launcher, pids = _launch(tmp_path, child_env, 120)
    deadline = time.monotonic() + 120  # a hang guard
    while len(_escaped(pids)) < 4:
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.05)
    launcher.send_signal(signal.SIGINT)
    out, err = launcher.communicate(timeout=60)
    escaped = _escaped(pids)
    assert launcher.returncode == 130 and "stopped by the user" in err, err
    assert len(escaped) == 4 and [p for p in escaped if pid_alive(p)] == [] and tfl_processes(home=str(tfl_home)) == []
