"""The one narrow interface every backend implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from launcher.plan import TaskLaunch


@dataclass
class TaskProcess:
    """A started task: enough to poll it, signal its process group and record it."""

    launch: TaskLaunch
    attempt: int
    pid: int
    create_time: float | None
    pgid: int | None
    handle: Any = field(default=None, repr=False)  # backend-private (a Popen, a channel…)


class Backend(Protocol):
    # True when ``start`` is mostly waiting (a round trip to a host): the supervisor then
    # starts the group's tasks at once, from threads. A local fork is quicker one by one.
    concurrent_start: bool

    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        """Start the task in its own process group; output goes to ``launch.log_path``.

        Raises ``LaunchError`` when it cannot be started. Calls the ``notify`` given at
        construction whenever one of its tasks may have exited.
        """
        ...

    def poll(self, proc: TaskProcess) -> int | None:
        """Exit code (negative: killed by that signal) once the task has exited, else None."""
        ...

    def signal(self, proc: TaskProcess, signum: int) -> None:
        """Send ``signum`` to the task's whole process group; a group already gone is fine."""
        ...

    def alive(self, proc: TaskProcess) -> bool:
        """Whether any process of the task's group is still alive."""
        ...

    def close(self) -> None:
        """Release connections and threads; idempotent."""
        ...
