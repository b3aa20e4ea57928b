"""Each task's output and progress, from its actor to the task's files on this machine.

A thread per started task asks its actor for what is new (``TaskRunner.read``) every
``INTERVAL`` s, appends the output to the task's ``log_path`` and replaces its
``progress_path``: ``tfl logs``, the console and the stall watchdog read files, whatever ran
the task. The task's end is its exit code; its actor's death (a node lost, the actor killed)
ends it too, as a task failure with ``ended_by`` saying so.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from launcher.files import open_private, write_atomic

INTERVAL = 0.5
CALL_TIMEOUT = 30.0
ACTOR_DIED = -9  # a task whose actor died was killed with it (PR_SET_PDEATHSIG: SIGKILL)


@dataclass
class Relay:
    """One started task: its actor, where its output goes, and its end once known."""

    ray: ModuleType
    actor: Any
    log_path: str
    progress_path: str
    notify: Callable[[], None]
    exit_code: int | None = None
    ended_by: str | None = None
    died_at: float | None = None  # monotonic time the actor's death was noticed
    address_in_use: bool = False  # it failed because its port had been taken before TensorFlow bound it
    offset: int = 0  # how much of the actor's output file this machine has (a restart appends to it)
    _stop: threading.Event = field(default_factory=threading.Event)
    _progress: bytes | None = None
    _thread: threading.Thread | None = None

    def start(self, name: str) -> Relay:
        self._thread = threading.Thread(target=self._run, name=f"ray-relay-{name}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def finish(self) -> None:
        """Stop following a task that has ended, before its actor starts the next attempt: one last
        read brings what was not relayed yet. A relay left running would read the next attempt's
        output from its own offset and append it to the log a second time."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(CALL_TIMEOUT + INTERVAL)
            if self._thread.is_alive():  # a call to the actor still hangs: two writers would interleave
                return
        if self.exit_code is None:
            self._once()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._once():
                self.notify()
                return
            self._stop.wait(INTERVAL)

    def _once(self) -> bool:
        """One read; True once the task has ended."""
        ray = self.ray
        try:
            got = ray.get(self.actor.read.remote(self.offset), timeout=CALL_TIMEOUT)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.ActorUnavailableError):
            return False  # slow, or its node unreachable for now: Ray says when it is dead
        except ray.exceptions.RayError as exc:  # RayActorError: the actor, or its node, is dead
            self.died_at = time.monotonic()
            self.ended_by = f"its Ray actor died ({_reason(exc)})"
            self.exit_code = ACTOR_DIED
            return True
        self._write(got)
        if got["exit"] is not None:
            self.address_in_use = bool(got.get("address_in_use"))
            self.exit_code = int(got["exit"])
            return True
        return False

    def _write(self, got: dict[str, Any]) -> None:
        if got["data"]:
            with open_private(self.log_path) as log:
                log.write(got["data"])
            self.offset += len(got["data"])
        if got["progress"] is not None and got["progress"] != self._progress:
            self._progress = got["progress"]
            write_atomic(self.progress_path, got["progress"].decode(errors="replace"))


def _reason(exc: BaseException) -> str:
    text = str(exc)
    for hint in ("node", "SIGKILL", "killed", "exited"):
        for line in text.splitlines():
            if hint in line:
                return line.strip()[:200]
    return type(exc).__name__
