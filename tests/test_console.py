"""Colour only on a terminal (a real pty here) and never with NO_COLOR; plain text when piped."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.records.states import RunState, TaskState
from launcher.records.store import RunRecord, RunStore, TaskRecord
from tests.conftest import ROOT

ESC = b"\x1b"
COLOURED_PREFIX = b"\x1b[36m[chief:0]\x1b[0m "


def on_pty(args: list[str], env: dict[str, str], timeout: float = 120) -> tuple[int, bytes]:
    """Run ``tfl ARGS`` with stdout and stderr on a new pseudo-terminal; its exit code and output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: every writer of the pty is gone
            break
        if not data:
            break
        out += data
    os.close(master)
    return proc.wait(timeout=timeout), out


def piped(args: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    done = subprocess.run([sys.executable, "-m", "launcher", *args], env=env, cwd=ROOT, capture_output=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def finished_run(tfl_home: Path) -> str:
    store = RunStore(tfl_home)
    run_dir = store.run_dir("job-1")
    log = run_dir / "logs" / "chief-0.log"
    store.create(RunRecord(run_id="job-1", job="job.py", job_args=[], run_dir=str(run_dir), created=1.0,
                           state=RunState.SUCCEEDED, ended=2.0, exit_code=0, tasks=[TaskRecord(
                               task="chief:0", host="localhost", backend="local", log_path=str(log),
                               progress_path=str(run_dir / "progress" / "chief-0.json"), state=TaskState.SUCCEEDED)]))
    log.write_text("hello from the job\n")
    return "job-1"


def test_logs_are_coloured_on_a_terminal_only(finished_run: str, child_env: dict[str, str]) -> None:
    code, out = on_pty(["logs", finished_run], child_env)
    assert code == 0 and COLOURED_PREFIX + b"hello from the job" in out
    code, out = on_pty(["logs", finished_run], {**child_env, "NO_COLOR": ""})  # set but empty: no effect (no-color.org)
    assert code == 0 and COLOURED_PREFIX in out
    for run in (lambda: on_pty(["logs", finished_run], {**child_env, "NO_COLOR": "1"}),
                lambda: piped(["logs", finished_run], child_env)):
        code, out = run()
        assert code == 0 and b"[chief:0] hello from the job" in out and ESC not in out


def test_launch_console_honours_no_color(tmp_path: Path, child_env: dict[str, str]) -> None:
    job = tmp_path / "job.py"
    job.write_text("print('hello from the job')\n")
    code, out = on_pty(["launch", str(job), "--local", "1"], child_env)
    assert code == 0 and COLOURED_PREFIX + b"hello from the job" in out, out
    code, out = on_pty(["launch", str(job), "--local", "1"], {**child_env, "NO_COLOR": "1"})
    assert code == 0 and b"[chief:0] hello from the job" in out and ESC not in out, out


def test_other_output_is_plain_on_a_terminal(finished_run: str, child_env: dict[str, str]) -> None:
    env = {**child_env, "NO_COLOR": "1"}
    for args, expected_code in ((["--help"], 0), (["status"], 0), (["status", finished_run], 0),
                                (["status", "nope"], 2), (["status", "--bogus"], 2), (["logs", "--task", "x"], 2)):
        code, out = on_pty(args, env)
        assert code == expected_code and ESC not in out, (args, out)


def test_watch_clears_the_screen_only_on_a_terminal(finished_run: str, child_env: dict[str, str]) -> None:
    code, out = on_pty(["status", finished_run, "--watch"], child_env)  # a finished run: one frame
    assert code == 0 and out.startswith(b"\x1b[H\x1b[2J") and b"run job-1  succeeded" in out
    code, out = piped(["status", finished_run, "--watch"], child_env)
    assert code == 0 and ESC not in out and b"run job-1  succeeded" in out
