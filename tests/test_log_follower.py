"""The console follower (``views.logs``) looks at a log's size before opening it: idle logs are
never reopened, growing ones stay open (at most ``FOLLOW_OPEN`` at once), and a log truncated or
replaced at its path is read again from its start (issue 29). ``tfl logs --tail N``."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest

from launcher.limits import FOLLOW_OPEN
from launcher.views import logs
from launcher.views.logs import LogFollower


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every log the follower opens, by path."""
    seen: list[str] = []

    def counting(path: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(logs, "open", counting, raising=False)
    return seen


def follower_of(tmp_path: Path, count: int, tail: int | None = None) -> tuple[LogFollower, list[Path], io.StringIO]:
    paths = [tmp_path / f"worker-{i}.log" for i in range(count)]
    for path in paths:
        path.write_text("")
    out = io.StringIO()
    return LogFollower([(f"worker:{i}", str(p)) for i, p in enumerate(paths)], out, tail=tail), paths, out


def own_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_idle_logs_are_not_opened_and_a_growing_one_once(tmp_path: Path, opened: list[str]) -> None:
    follower, paths, out = follower_of(tmp_path, 5)
    for _ in range(50):
        follower.poll_once()
    assert opened == []  # five idle logs, fifty polls: nothing opened (was 250 opens)
    for i in range(20):
        with paths[2].open("a") as f:
            f.write(f"line {i}\n")
        follower.poll_once()
    assert opened == [str(paths[2])]  # kept open, read on
    assert out.getvalue().splitlines() == [f"[worker:2] line {i}" for i in range(20)]
    before = own_fds()
    for _ in range(logs.IDLE_CLOSE):
        follower.poll_once()
    assert own_fds() == before - 1  # idle long enough: closed, its slot free
    with paths[2].open("a") as f:
        f.write("more\n")
    follower.poll_once()
    assert opened == [str(paths[2])] * 2 and out.getvalue().splitlines()[-1] == "[worker:2] more"
    follower.stop()


def test_no_more_than_follow_open_logs_stay_open(tmp_path: Path, opened: list[str]) -> None:
    count = FOLLOW_OPEN * 2 + 3
    follower, paths, out = follower_of(tmp_path, count)
    before = own_fds()
    for round_ in range(3):
        for i, path in enumerate(paths):
            with path.open("a") as f:
                f.write(f"{i}.{round_}\n")
        follower.poll_once()
        assert own_fds() - before <= FOLLOW_OPEN
    lines = out.getvalue().splitlines()
    assert len(lines) == count * 3 and lines[-1].split() == [f"[worker:{count - 1}]", f"{count - 1}.2"]
    assert len(opened) == FOLLOW_OPEN + (count - FOLLOW_OPEN) * 3  # the rest opened only when they grew
    follower.stop()
    assert own_fds() == before


def test_a_truncated_log_is_read_from_its_start(tmp_path: Path, opened: list[str]) -> None:
    follower, (path,), out = follower_of(tmp_path, 1)
    path.write_text("first\nsecond\n")
    follower.poll_once()
    with path.open("r+") as f:  # truncated in place (the same file)
        f.truncate(0)
        f.write("again\n")
    follower.poll_once()
    follower.stop()
    assert out.getvalue().splitlines() == ["[worker:0] first", "[worker:0] second", "[worker:0] again"]


def test_a_rotated_log_is_read_to_its_end_then_the_new_one(tmp_path: Path, opened: list[str]) -> None:
    follower, (path,), out = follower_of(tmp_path, 1)
    path.write_text("one\n")
    follower.poll_once()
    with path.open("a") as f:
        f.write("two\n")  # not yet read when it moves away
    path.rename(tmp_path / "worker-0.log.1")
    path.write_text("three\n")
    follower.poll_once()
    follower.stop()
    assert out.getvalue().splitlines() == ["[worker:0] one", "[worker:0] two", "[worker:0] three"]
    assert opened == [str(path), str(path)]


def test_a_log_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    path = tmp_path / "late.log"
    out = io.StringIO()
    follower = LogFollower([("chief:0", str(path))], out, from_end=True)
    follower.poll_once()
    path.write_text("hello\n")
    follower.poll_once()
    follower.stop()
    assert out.getvalue() == "[chief:0] hello\n"


def test_tail_shows_each_task_s_last_lines_then_every_new_one(tmp_path: Path) -> None:
    follower, paths, out = follower_of(tmp_path, 2, tail=2)
    paths[0].write_text("".join(f"a{i}\n" for i in range(5)) + "a5 unended")  # a last line without its newline counts
    paths[1].write_text("b0\n")
    follower.poll_once(final=True)
    assert out.getvalue().splitlines() == ["[worker:0] a4", "[worker:0] a5 unended", "[worker:1] b0"]
    with paths[0].open("a") as f:
        f.write("\n".join(f"later {i}" for i in range(4)) + "\n")
    follower.poll_once()  # what came after the first look is shown whole
    assert out.getvalue().splitlines()[3:] == [f"[worker:0] later {i}" for i in range(4)]


def test_tfl_logs_tail_and_its_bad_value(tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    import subprocess
    import sys

    from launcher.records.states import RunState, TaskState
    from launcher.records.store import RunRecord, RunStore, TaskRecord
    from tests.conftest import ROOT

    store = RunStore(tfl_home)
    run_dir = store.run_dir("job-1")
    tasks = []
    for name in ("chief:0", "worker:0"):
        log = run_dir / "logs" / f"{name.replace(':', '-')}.log"
        tasks.append(TaskRecord(task=name, host="localhost", backend="local", log_path=str(log),
                                progress_path=str(run_dir / "progress" / f"{name.replace(':', '-')}.json"),
                                state=TaskState.SUCCEEDED))
    store.create(RunRecord(run_id="job-1", job="job.py", job_args=[], run_dir=str(run_dir), created=1.0,
                           state=RunState.SUCCEEDED, ended=2.0, exit_code=0, tasks=tasks))
    (run_dir / "logs" / "chief-0.log").write_text("".join(f"step {i}\n" for i in range(30)))
    (run_dir / "logs" / "worker-0.log").write_text("only line\n")

    def tfl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "launcher", *args], env=child_env, cwd=ROOT, capture_output=True,
                              text=True, timeout=120)

    done = tfl("logs", "job-1", "-n", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[chief:0]  step 27", "[chief:0]  step 28", "[chief:0]  step 29",
                                        "[worker:0] only line"]
    done = tfl("logs", "job-1", "--tail", "0", "--task", "chief:0")
    assert done.returncode == 0 and done.stdout == ""
    done = tfl("logs", "job-1", "--tail", "-1")
    assert done.returncode == 2 and "Traceback" not in done.stderr and "--tail" in done.stderr, done.stderr
