"""Jobs that misbehave, under a real `tfl launch --local`: what they do must not outlive the run.

Every test runs under the ``tfl_home`` fixture, which fails if any task of its runs is alive
afterwards (after a wait); the tests here assert it at once, as the launcher returns.
"""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest

from launcher.records.store import RunStore
from launcher.views.logs import LogFollower
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


# Attempt 0 leaves a daemon (fork, setsid, fork; its pid in <dir>/<task>.<pid>) and fails; attempt 1
# says whether its task's daemon is still there, as a restarted job would meet it (its port, its files).
RESTARTED = """
    import os, sys, time
    folder, task = sys.argv[1], os.environ["TFL_TASK"].replace(":", "-")
    if os.environ["TFL_ATTEMPT"] == "0":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open(os.path.join(folder, f"{task}.{os.getpid()}"), "w").close()
                time.sleep(120)
            os._exit(0)
        deadline = time.monotonic() + 60  # a hang guard
        while not [f for f in os.listdir(folder) if f.startswith(task + ".")]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sys.exit(1)

    def running(pid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    mine = [f for f in os.listdir(folder) if f.startswith(task + ".")]
    print("attempt 0's daemon:", "alive" if any(running(f.rsplit(".", 1)[1]) for f in mine) else "gone", flush=True)
"""


def test_a_restart_begins_without_what_the_last_attempt_left(tmp_path: Path, child_env: dict[str, str],
                                                            tfl_home: Path) -> None:
    job, pids = tmp_path / "restarted.py", tmp_path / "pids"
    job.write_text(textwrap.dedent(RESTARTED))
    pids.mkdir()
    done = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--local", "1", "--max-restarts", "1",
                           "--", str(pids)], env=child_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "1 restart(s)" in done.stderr, done.stderr
    assert "attempt 0's daemon: gone" in done.stdout, done.stdout
    assert "the tasks left outside their process groups" in done.stderr and "before attempt 1" in done.stderr
    assert [p for p in _escaped(pids) if pid_alive(p)] == []


# Prints for about 4 s: the console's reader goes away while the tasks still print.
CHATTY = """
    import time
    for i in range(40):
        print("line", i, flush=True)
        time.sleep(0.1)
"""


def _launch_closing_stdout(tmp_path: Path, env: dict[str, str], stderr: int) -> tuple[int, str]:
    """`tfl launch … | head -1` (``stderr`` STDOUT: `2>&1 | head -1`): the launcher's exit code and its stderr."""
    job, err_file = tmp_path / "chatty.py", tmp_path / "stderr.txt"
    job.write_text(textwrap.dedent(CHATTY))
    with open(err_file, "w") as err:
        launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--local", "2"], env=env,
                                    stdout=subprocess.PIPE, stderr=err if stderr == subprocess.PIPE else stderr, text=True)
        assert launcher.stdout is not None
        while "line 0" not in launcher.stdout.readline():  # head -1, then its end
            assert launcher.poll() is None
        launcher.stdout.close()
        code = launcher.wait(timeout=120)
    return code, err_file.read_text()


def test_a_console_that_goes_away_leaves_the_run_and_its_exit_code(tmp_path: Path, child_env: dict[str, str],
                                                                   tfl_home: Path) -> None:
    code, err = _launch_closing_stdout(tmp_path, child_env, subprocess.PIPE)
    assert code == 0 and "Traceback" not in err and "BrokenPipeError" not in err, err
    assert "tfl: the console's reader is gone (stdout closed); run chatty-" in err
    assert "succeeded in" in err  # the summary, on stderr, still said
    run = next((tfl_home / "runs").iterdir())
    assert (run / "logs" / "worker-0.log").read_text().count("line") == 40  # the tasks ran to their end
    assert json.loads((run / "state.json").read_text())["state"] == "succeeded"


def test_a_closed_pipe_for_stdout_and_stderr_keeps_the_runs_exit_code(tmp_path: Path, child_env: dict[str, str],
                                                                      tfl_home: Path) -> None:
    code, _ = _launch_closing_stdout(tmp_path, child_env, subprocess.STDOUT)
    run = next((tfl_home / "runs").iterdir())
    assert code == 0 and json.loads((run / "state.json").read_text())["state"] == "succeeded"


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_the_follower_stops_writing_once_its_reader_is_gone(tmp_path: Path) -> None:
    log = tmp_path / "chief-0.log"
    log.write_text("one\ntwo\n")
    gone: list[bool] = []
    follower = LogFollower([("chief:0", str(log))], _ClosedPipe(), on_gone=lambda: gone.append(True))
    assert follower.poll_once() == 0 and follower.gone and gone == [True]
    log.write_text("one\ntwo\nthree\n")
    assert follower.poll_once() == 0 and gone == [True]  # said once; nothing written again
    follower.stop()


def _drained_peak(follower: LogFollower) -> int:
    """The most memory (bytes, tracemalloc) held at once while ``follower`` shows its log whole."""
    tracemalloc.start()
    try:
        while follower.poll_once():
            pass
        follower.stop()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class _Counting(io.StringIO):
    """Counts lines and keeps only the last: what a terminal shows is not held here."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.count = 0

    def write(self, text: str) -> int:
        parts = text.splitlines()
        self.count += len(parts)
        self.lines = parts[-1:] or self.lines
        return len(text)


def test_a_log_far_bigger_than_a_poll_never_sits_in_memory_whole(tmp_path: Path) -> None:
    """A task that prints faster than the console shows: 32 MiB of log and a last line without its
    newline are followed (one poll each chunk) and shown whole, in order, never all in memory at once
    (the follower read every new byte at once: a task printing 500 MB/s took tfl past 3 GB)."""
    log = tmp_path / "chief-0.log"
    line = "y" * 199 + "\n"
    with open(log, "w") as f:
        for _ in range(32):
            f.write(line * ((1 << 20) // len(line)))
        f.write("the end, no newline")
    written = 32 * ((1 << 20) // len(line)) + 1
    out = _Counting()
    peak = _drained_peak(LogFollower([("chief:0", str(log))], out))
    assert out.count == written and out.lines == ["[chief:0] the end, no newline"]
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held at once for a 32 MiB log"


def test_a_tail_of_a_log_bigger_than_a_chunk_is_its_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "chief-0.log"
    log.write_text("".join(f"line {i:07d} {'z' * 100}\n" for i in range(30000)))  # 3.3 MiB
    out = _Counting()
    follower = LogFollower([("chief:0", str(log))], out, tail=2)
    assert follower.poll_once(final=True) == 2 and out.count == 2 and out.lines[0].startswith("[chief:0] line 0029999 ")
    follower.stop()


# Removes its own run dir (as a stray `rm -r` or a prune from another machine would), then ends.
# The chief removes the whole run dir; the launcher may write a file in it meanwhile (rmtree then
# finds it not empty: seen once in CI), so it tries again until the dir is gone (a hang guard: 60 s).
REMOVES_ITS_RUN = """
    import os, shutil, time
    if os.environ["TFL_TASK"] == "chief:0":
        deadline = time.monotonic() + 60
        while os.path.exists(os.environ["TFL_RUN_DIR"]):
            assert time.monotonic() < deadline
            shutil.rmtree(os.environ["TFL_RUN_DIR"], ignore_errors=True)
    time.sleep(1)
"""


def test_a_run_dir_removed_under_the_run_is_said_as_such(tmp_path: Path, child_env: dict[str, str], tfl_home: Path) -> None:
    job = tmp_path / "removes.py"
    job.write_text(textwrap.dedent(REMOVES_ITS_RUN))
    result = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--local", "2"], env=child_env,
                            capture_output=True, text=True, timeout=120)
    run_id = result.stderr.split("tfl: run ", 1)[1].split(":", 1)[0]
    assert result.returncode == 2 and f"was removed while run {run_id} ran" in result.stderr, result.stderr
    assert "free space" not in result.stderr
    assert not (tfl_home / "active" / run_id).exists()  # no marker left behind for a run that is gone
    assert tfl_processes(home=str(tfl_home)) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_store_another_user_owns_is_refused_before_the_run(tmp_path: Path, child_env: dict[str, str],
                                                              tfl_home: Path) -> None:
    (tfl_home / "runs").mkdir(parents=True)
    os.chown(tfl_home / "runs", 65534, -1)
    os.chmod(tfl_home / "runs", 0o777)  # theirs, open: they could swap a record `tfl stop` then acts on
    job = tmp_path / "ok.py"
    job.write_text("print('ran')\n")
    result = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--local", "2"], env=child_env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "ran" not in result.stdout
    assert result.stderr.startswith(f"tfl: error: {tfl_home / 'runs'} is owned by uid 65534, not by you"), result.stderr
    assert result.stderr.count("\n") == 1  # one line, naming no run: none was made
    assert "set TFL_HOME to a directory of your own" in result.stderr
    assert list((tfl_home / "runs").iterdir()) == []


def test_a_store_of_ones_own_left_open_to_others_is_made_private(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for sub in ("runs", "active"):
        (home / sub).mkdir(parents=True)
        os.chmod(home / sub, 0o777)
    store = RunStore(home)
    store.reserve(store.run_dir("r"))
    assert [stat.S_IMODE(os.stat(home / sub).st_mode) for sub in ("runs", "active", "runs/r")] == [0o700] * 3


def test_a_line_that_never_ends_is_shown_in_pieces_not_held(tmp_path: Path) -> None:
    """32 MiB without a newline (a progress bar drawn with \\r, a runaway print): shown as it comes, in
    pieces of at most a chunk, never gathered whole (it was, copied again at each chunk: 300 MB of it
    took tfl launch to 960 MB and 38 s)."""
    log = tmp_path / "chief-0.log"
    with open(log, "wb") as f:
        for _ in range(32):
            f.write(b"z" * (1 << 20))
    out = _Sizes()
    peak = _drained_peak(LogFollower([("chief:0", str(log))], out))
    assert out.chars == 32 << 20 and out.longest <= 1 << 20
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB held at once for a 32 MiB line"


class _Sizes(io.StringIO):
    """How many characters of the job's own lines were written, and the longest line."""

    def __init__(self) -> None:
        super().__init__()
        self.chars = self.longest = 0

    def write(self, text: str) -> int:
        for line in text.splitlines():
            body = line.removeprefix("[chief:0] ")
            self.chars += len(body)
            self.longest = max(self.longest, len(body))
        return len(text)


@pytest.mark.parametrize(("text", "why"), [("", "it is empty"), ('{"run_id": "r", ', "Expecting")])
def test_a_damaged_record_says_why_and_how_to_remove_it(tmp_path: Path, text: str, why: str) -> None:
    home = tmp_path / "my home"
    (home / "runs" / "r").mkdir(parents=True)
    (home / "runs" / "r" / "state.json").write_text(text)
    result = subprocess.run([sys.executable, "-m", "launcher", "rm", "r"], env={**os.environ, "TFL_HOME": str(home)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert f"written by another version: {why}" in result.stderr
    assert result.stderr.rstrip().endswith(f"remove it by hand: rm -r '{home / 'runs' / 'r'}'")


def test_a_log_replaced_while_far_behind_is_shown_whole_then_the_new_one(tmp_path: Path) -> None:
    log = tmp_path / "chief-0.log"
    log.write_text("".join(f"old {i:07d} {'o' * 100}\n" for i in range(30000)))  # 3.3 MiB: a few chunks
    out = _Counting()
    follower = LogFollower([("chief:0", str(log))], out)
    assert follower.poll_once() > 0 and follower.behind  # one chunk of it shown; the rest waits
    (tmp_path / "new.log").write_text("new\n")
    os.replace(tmp_path / "new.log", log)  # a restarted task's log made anew at the path
    while follower.poll_once():
        pass
    follower.stop()
    assert out.count == 30001 and out.lines == ["[chief:0] new"]
