"""mypy strict, started when the session starts, its result read by ``test_mypy_strict``.

mypy is the suite's longest test on a fresh clone (no ``.mypy_cache``): 25–135 s of one CPU by
load, during which a worker that ran it did nothing else. Most other tests wait (on sshd, Slurm,
a cut host, a grace period) rather than compute, so mypy started in the background by the first
pytest process (before the xdist workers exist) runs in their waits, and the test only collects
its exit code and output. It is started only for a run that will hold the test: the whole
suite or ``-m "not slow"``, or a command line that names tests/test_architecture.py, without
``-k``; otherwise the test runs mypy itself, as before.

The controller's thread reaps the process, then writes its exit code (atomically): once the
code is there, the process is gone. The result dir is private (``tempfile.mkdtemp``), removed at
the end; a session that ends first (Ctrl-C, a deselected test) kills mypy by its process group.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.procs import kill_group

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "tests" / "test_architecture.py"
KEY = "tfl_mypy_dir"  # the result dir, in an xdist worker's workerinput


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str
    pid: int


@dataclass
class Background:
    """A command started in a new process group, its stdout and stderr in a private file; a
    thread reaps it and then writes its exit code, so a result on disk means the process is gone."""

    proc: subprocess.Popen[bytes]
    dir: Path
    reaper: threading.Thread

    @classmethod
    def start(cls, argv: list[str]) -> Background:
        directory = Path(tempfile.mkdtemp(prefix="tfl-mypy-"))
        with open(directory / "output", "wb") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        (directory / "pid").write_text(str(proc.pid))

        def reap() -> None:
            code = proc.wait()
            (directory / "returncode.tmp").write_text(str(code))
            os.replace(directory / "returncode.tmp", directory / "returncode")

        reaper = threading.Thread(target=reap, name="mypy-reaper", daemon=True)
        reaper.start()
        return cls(proc, directory, reaper)

    def stop(self) -> None:
        """Its group killed if it still runs, reaped, the dir removed. Idempotent."""
        kill_group(self.proc)
        self.reaper.join(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for_result(directory: Path, timeout: float) -> Result:
    """The exit code and output, once the process is reaped (hang guard: ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not (directory / "returncode").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the background mypy (pid {(directory / 'pid').read_text()}) gave no result in {timeout:.0f} s")
        time.sleep(0.5)
    return Result(int((directory / "returncode").read_text()), (directory / "output").read_text(errors="replace"),
                  int((directory / "pid").read_text()))


_STARTED = pytest.StashKey[Background]()


def wanted(config: pytest.Config) -> bool:
    """Whether this run will hold test_mypy_strict: the documented commands (no ``-k``, no marker
    expression but ``not slow``), over paths that include tests/test_architecture.py."""
    if config.option.keyword or (config.option.markexpr or "") not in ("", "not slow"):
        return False
    paths = [str(arg).split("::", 1)[0] for arg in config.args] or [str(ROOT / "tests")]
    for path in paths:
        target = (Path(config.invocation_params.dir) / path).resolve()
        if target == ARCHITECTURE or (target.is_dir() and ARCHITECTURE.is_relative_to(target)):
            return True
    return False


def start(config: pytest.Config, mypy: Path) -> None:
    config.stash[_STARTED] = Background.start([str(mypy)])


def result_dir(config: pytest.Config) -> Path | None:
    """Where this process finds the background run's result, if one was started for this session."""
    started = config.stash.get(_STARTED, None)
    if started is not None:
        return started.dir
    found = getattr(config, "workerinput", {}).get(KEY)
    return Path(found) if found else None


def stop(config: pytest.Config) -> None:
    """At the session's end (pytest_unconfigure)."""
    started = config.stash.get(_STARTED, None)
    if started is not None:
        started.stop()
        del config.stash[_STARTED]
