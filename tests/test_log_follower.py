"""The console follower (``views.logs``) looks at a log's size before opening it: idle logs are
never reopened, growing ones stay open (at most ``FOLLOW_OPEN`` at once), and a log truncated or
replaced at its path is read again from its start (issue 29)."""

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


def follower_of(tmp_path: Path, count: int) -> tuple[LogFollower, list[Path], io.StringIO]:
    paths = [tmp_path / f"worker-{i}.log" for i in range(count)]
    for path in paths:
        path.write_text("")
    out = io.StringIO()
    return LogFollower([(f"worker:{i}", str(p)) for i, p in enumerate(paths)], out), paths, out


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
