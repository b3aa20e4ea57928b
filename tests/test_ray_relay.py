"""A task restarted on the same Ray actor: its log gets each line of the new attempt once.

The supervisor starts the next attempt once the last one's tasks are gone, which it may learn from
the actor (``alive``) before the task's relay has read its exit. That relay then went on reading
from its own offset, now the new attempt's output, and appended it to the log a second time (seen
with `--max-restarts 1` and a killed chief: the worker's "attempt 1" lines twice). A fake actor and
Ray stand in for the cluster.
"""

from __future__ import annotations

import re
import time
import types
from pathlib import Path
from typing import Any

from launcher.engines.ray.backend import RayBackend
from launcher.engines.ray.relay import INTERVAL
from launcher.plan.launch_plan import TaskLaunch
from launcher.tasks import TaskId
from tests.test_ssh import wait_for


class _Call:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


class FakeActor:
    """The task runner's calls: one output file over its starts, the exit of its latest process."""

    def __init__(self) -> None:
        self.output: bytes = b""
        self.exit: int | None = None
        self.start = _Call(self._start)
        self.read = _Call(lambda offset: {"data": self.output[offset:], "progress": None, "exit": self.exit})

    def _start(self, argv: list[str], env: dict[str, str], attempt: int) -> dict[str, Any]:
        self.exit = None  # a new process: the last one's exit is no longer what read() says
        return {"pid": 100 + attempt, "offset": len(self.output)}


class FakeRay(types.SimpleNamespace):
    exceptions = types.SimpleNamespace(RayError=RuntimeError, GetTimeoutError=TimeoutError,
                                       ActorUnavailableError=ConnectionError)

    @staticmethod
    def get(value: Any, timeout: float | None = None) -> Any:
        return value


def test_a_restart_on_the_same_actor_relays_each_line_once(tmp_path: Path) -> None:
    task = TaskId("worker", 0)
    log = tmp_path / "worker-0.log"
    launch = TaskLaunch(task=task, host="10.0.0.2", port=1, argv=("python", "job.py"), env={}, cwd=None,
                        log_path=str(log), progress_path=str(tmp_path / "worker-0.json"))
    actor = FakeActor()
    backend = RayBackend()
    backend._group = types.SimpleNamespace(ray=FakeRay(), actors={task: actor},  # type: ignore[assignment]
                                           plan=types.SimpleNamespace(tasks=[launch]))
    try:
        first = backend.start(launch, 0)
        actor.output += b"attempt 0\n"
        wait_for(lambda: log.exists() and log.read_bytes() == b"attempt 0\n", timeout=30)
        actor.output += b"its last words\n"  # then it ends; the supervisor learns that from the actor
        actor.exit = 143
        backend._attempt = 1  # the group's next attempt is made (new ports: not this test's business)
        second = backend.start(launch, 1)
        actor.output += b"attempt 1\n"
        actor.exit = 0
        wait_for(lambda: second.handle.exit_code == 0, timeout=30)
        time.sleep(4 * INTERVAL)  # a relay of attempt 0 still running would have read it again by now
    finally:
        for relay in backend._relays:
            relay.stop()
    text = log.read_text()
    assert re.fullmatch(r"attempt 0\nits last words\n--- tfl: attempt 1 of worker:0 at [0-9:]+ ---\nattempt 1\n", text), text
    assert first.handle.exit_code == 143
