"""A backend that implements the whole protocol with no processes at all.

Its tasks are entries in a dict: each writes two lines to its log when started and exits
with the code in ``EXIT_CODES`` (default 0) on its first poll. Every call is recorded in
``CALLS`` so tests can see which parts of the protocol the commands used.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Callable

from launcher.engines.base import Cleanup, Stopped, TaskLive, TaskProcess
from launcher.engines.preflight import Check, HostTasks, host_tasks
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.records.states import TaskState
from launcher.records.store import RunRecord

CALLS: list[str] = []
EXIT_CODES: dict[str, int] = {}
_PIDS = itertools.count(900_000)


class FakeBackend:
    name = "fake"
    concurrent_start = False

    def __init__(self, notify: Callable[[], None] = lambda: None) -> None:
        self._notify = notify
        self._exited: dict[int, int] = {}

    def probe(self, hosts: Sequence[HostTasks], *, quick: bool) -> list[Check]:
        CALLS.append(f"probe quick={quick}")
        return [Check(h.host, "fake", "ok", "ready") for h in hosts]

    def prepare(self, plan: LaunchPlan) -> list[Check]:
        CALLS.append("prepare")
        return self.probe(host_tasks(plan), quick=True)

    def resolve(self, plan: LaunchPlan) -> LaunchPlan:
        return plan

    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        CALLS.append(f"start {launch.name}")
        with open(launch.log_path, "a") as log:
            log.write(f"hello from {launch.name}\nbye from {launch.name}\n")
        self._notify()
        return TaskProcess(launch=launch, attempt=attempt, pid=next(_PIDS), create_time=1.0, pgid=None)

    def poll(self, proc: TaskProcess) -> int | None:
        code = self._exited.setdefault(proc.pid, EXIT_CODES.get(proc.launch.name, 0))
        return code

    def signal(self, proc: TaskProcess, signum: int) -> None:
        CALLS.append(f"signal {proc.launch.name} {signum}")
        self._exited.setdefault(proc.pid, -signum)

    def alive(self, proc: TaskProcess) -> bool:
        return proc.pid not in self._exited

    def close(self) -> None:
        CALLS.append("close")

    def inspect(self, record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
        CALLS.append(f"inspect ask={ask}")
        return {t.task: TaskLive(alive=t.state == TaskState.RUNNING, cpu_percent=12.5 if ask else None, rss_mb=64.0)
                for t in record.tasks}

    def stop_recorded(self, record: RunRecord, grace: float) -> Stopped:
        running = [t for t in record.tasks if t.state == TaskState.RUNNING]
        CALLS.append(f"stop_recorded {len(running)}")
        return Stopped(len(running))

    def clean_recorded(self, record: RunRecord) -> Cleanup:
        CALLS.append("clean_recorded")
        return Cleanup()
