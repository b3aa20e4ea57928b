"""The suite's own machinery (tests/conftest.py, tests/mypy_background.py): how many xdist workers
``-n auto`` gives, when mypy starts in the background, and that its result means it is gone."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from tests.conftest import MAX_WORKERS, workers
from tests.mypy_background import ROOT, Background, wait_for_result, wanted
from tests.procs import pid_alive


@pytest.mark.parametrize(("cores", "inner_loop", "expected"), [
    (2, True, 4), (2, False, 3),  # CI's machine: -m "not slow", the full suite
    (1, True, 2), (1, False, 2),
    (16, True, MAX_WORKERS), (16, False, MAX_WORKERS),
])
def test_workers_per_core(cores: int, inner_loop: bool, expected: int) -> None:
    assert workers(cores, inner_loop) == expected


def _config(*args: str, markexpr: str = "", keyword: str = "", invoked_in: Path = ROOT) -> Any:
    return SimpleNamespace(args=list(args), option=SimpleNamespace(markexpr=markexpr, keyword=keyword),
                           invocation_params=SimpleNamespace(dir=invoked_in))


@pytest.mark.parametrize(("config", "expected"), [
    (_config(), True),  # `pytest`: testpaths
    (_config(markexpr="not slow"), True),
    (_config("tests"), True),
    (_config("tests/test_architecture.py"), True),
    (_config("test_architecture.py::test_mypy_strict", invoked_in=ROOT / "tests"), True),
    (_config("tests/test_spec.py"), False),
    (_config("tests/test_spec.py", "tests/test_plan.py"), False),
    (_config(markexpr="slow"), False),  # test_mypy_strict is not marked slow: deselected
    (_config(keyword="ssh"), False),  # -k: the test, if selected, runs mypy itself
])
def test_mypy_starts_in_the_background_only_for_a_run_that_holds_its_test(config: Any, expected: bool) -> None:
    assert wanted(config) is expected


def test_a_background_result_is_the_exit_code_and_output_of_a_process_that_is_gone() -> None:
    started = Background.start([sys.executable, "-c", "import sys; print('found 2 errors'); sys.exit(3)"])
    try:
        result = wait_for_result(started.dir, timeout=120)
        assert (result.returncode, result.pid) == (3, started.proc.pid)
        assert "found 2 errors" in result.output
        assert not pid_alive(result.pid)
    finally:
        started.stop()
    assert not started.dir.exists()
    started.stop()  # idempotent


def test_stop_kills_a_command_still_running_with_its_group() -> None:
    started = Background.start([sys.executable, "-c", "import subprocess, time; "
                                "[subprocess.Popen(['sleep', '300']) for _ in range(2)]; time.sleep(300)"])
    try:
        parent = psutil.Process(started.proc.pid)
        for _ in range(600):  # its two sleeps started (hang guard: 60 s)
            if len(parent.children()) == 2:
                break
            time.sleep(0.1)
        group = [parent.pid, *(c.pid for c in parent.children())]
        assert len(group) == 3
    finally:
        started.stop()
    assert started.proc.returncode == -9
    # The parent is reaped; its two sleeps got the same SIGKILL but die only once the machine schedules
    # them (still alive at the first look at load 4-13): a hang guard far above that, not a time limit.
    deadline = time.monotonic() + 30
    while (alive := [pid for pid in group if pid_alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == []
    assert not started.dir.exists()
