"""A process group is signalled only while its leader is still the process tfl started.

pids wrap around (pid_max is 32768 by default, and every thread takes one), so a task's
number can be handed to an unrelated process once the task is reaped. These tests hand it
over for real: writing ``/proc/sys/kernel/ns_last_pid`` (root only) makes the next fork
get the number we choose, when it is free. The "bystander" that takes it leads a group of
its own; tfl must never signal it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from launcher.describe.spec import local_cluster
from launcher.engines.local.backend import LocalBackend
from launcher.plan.build import build_plan
from launcher.plan.launch_plan import TaskLaunch
from launcher.records.identity import signal_group

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
BYSTANDER = [sys.executable, "-c", "import time; time.sleep(60)"]


def can_choose_pids() -> bool:
    try:
        with open(NS_LAST_PID, "r+") as f:
            f.write(f.read().strip())
        return True
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not can_choose_pids(), reason=f"choosing a pid needs write access to {NS_LAST_PID} (root)")


class Bystanders:
    """Unrelated processes, each the leader of its own group, on pids of our choosing."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def take(self, pid: int) -> subprocess.Popen[bytes] | None:
        """A bystander on ``pid``, or None when the kernel keeps that pid for its holder."""
        if os.path.exists(f"/proc/{pid}"):
            return None  # in use (a zombie too): the kernel skips it
        for _ in range(50):
            with open(NS_LAST_PID, "w") as f:
                f.write(str(pid - 1))
            proc = subprocess.Popen(BYSTANDER, start_new_session=True)
            self.procs.append(proc)
            if proc.pid == pid:
                return proc
            proc.kill()  # another process on the machine forked in between: try again
            proc.wait()
            # That fork may have got ``pid`` itself (it is the next fork's after our write): it is not the
            # holder this test asks about, only a stranger of the machine (a sleep of a fake script, a cat).
            # Once it has ended, the pid is free again; taking it for the kernel's keeping was a flake.
            deadline = time.monotonic() + 30  # a hang guard: the machine's forks are mostly short-lived
            while os.path.exists(f"/proc/{pid}"):
                assert time.monotonic() < deadline, f"pid {pid} went to another process of the machine, which still runs"
                time.sleep(0.01)
        raise AssertionError(f"could not get pid {pid} in 50 tries")

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _one_worker() -> None:
    """Module-scoped, so conftest puts this file's tests on one xdist worker, one at a time: each
    writes ns_last_pid, which steers the next fork of the whole machine. Two on two workers could
    hand each other's forks the pid one of them waits to take (seen once: `bystander is None`)."""


@pytest.fixture
def bystanders() -> Iterator[Bystanders]:
    found = Bystanders()
    yield found
    found.kill_all()


def quick_task(tmp_path: Path) -> TaskLaunch:
    job = tmp_path / "quick.py"
    job.write_text("print('done')\n")
    plan = build_plan(local_cluster(1), str(job), (), run_id="quick", run_dir=str(tmp_path / "run"), python=sys.executable,
                      cwd=str(tmp_path))
    (tmp_path / "run" / "logs").mkdir(parents=True)
    return plan.tasks[0]


def test_local_backend_never_signals_a_group_whose_number_was_handed_on(tmp_path: Path, bystanders: Bystanders) -> None:
    backend = LocalBackend()
    proc = backend.start(quick_task(tmp_path), 0)
    deadline = time.monotonic() + 30
    while backend.poll(proc) is None:  # what the supervisor does while the task runs
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert backend.poll(proc) == 0
    # The task has exited, and the supervisor may still tear its group down: its number must
    # not have gone to anyone else.
    early = bystanders.take(proc.pid)
    backend.signal(proc, signal.SIGKILL)
    time.sleep(0.2)
    assert early is None or early.poll() is None, "the backend killed a process group that had taken the task's number"
    assert backend.alive(proc) is False and backend.poll(proc) == 0
    assert early is None, "the task's pid was free for another process while its group could still be signalled"
    # Once its group is found empty the task is reaped and its group never signalled again.
    late = bystanders.take(proc.pid)
    assert late is not None
    backend.signal(proc, signal.SIGTERM)
    assert backend.alive(proc) is False
    time.sleep(0.2)
    assert late.poll() is None, "the backend signalled a group after its task had been reaped"


def test_a_child_left_in_the_group_keeps_it_alive_and_is_torn_down(tmp_path: Path) -> None:
    job = tmp_path / "forks.py"
    job.write_text("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n")
    plan = build_plan(local_cluster(1), str(job), (), run_id="forks", run_dir=str(tmp_path / "run"), python=sys.executable,
                      cwd=str(tmp_path))
    (tmp_path / "run" / "logs").mkdir(parents=True)
    backend = LocalBackend()
    proc = backend.start(plan.tasks[0], 0)
    deadline = time.monotonic() + 30
    while backend.poll(proc) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    orphans = [p for p in psutil.process_iter() if _pgid(p.pid) == proc.pid and p.pid != proc.pid]
    assert len(orphans) == 1 and backend.alive(proc) is True  # its leader exited; the child it started did not
    backend.signal(proc, signal.SIGKILL)
    orphans[0].wait(10)
    deadline = time.monotonic() + 10
    while backend.alive(proc):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_stop_never_signals_a_process_that_took_a_dead_tasks_pid(bystanders: Bystanders) -> None:
    task = subprocess.Popen(BYSTANDER, start_new_session=True)
    recorded = psutil.Process(task.pid)  # as `tfl stop` found it
    task.kill()
    task.wait()
    # A pid comes back only after the kernel wraps around (tens of thousands of forks later); a
    # process started within the same clock tick (10 ms) as the dead one cannot be told from it.
    time.sleep(0.05)
    bystander = bystanders.take(task.pid)
    assert bystander is not None
    signal_group(recorded, signal.SIGKILL)
    time.sleep(0.2)
    assert bystander.poll() is None, "tfl stop killed the process group that took a dead task's pid"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None
