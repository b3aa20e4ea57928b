"""A restarted task whose previous attempt was lost with its connection.

That attempt may still run on its host (its agent kills it only once it notices the silence,
up to ``HEARTBEAT_TIMEOUT`` + the kill grace later) and hold the port the new attempt must
bind. So before starting the new attempt the launcher stops the old one itself, through
the agent's ``signal`` and ``info`` requests, which check the process's identity (pid and
start ticks) first: SIGTERM its group, SIGKILL after ``PREDECESSOR_GRACE``, and wait, at
most ``PREDECESSOR_WAIT``, until it is gone. The wait is bounded: a host that does not
answer at all is the caller's to report.
"""

from __future__ import annotations

import signal
import time
from typing import Any, Callable

PREDECESSOR_GRACE = 2.0
PREDECESSOR_WAIT = 10.0
POLL_EVERY = 0.3

Ask = Callable[[dict[str, Any]], Any]  # one agent request on the task's host -> its answer


def stop_lost_attempt(ask: Ask, name: str, header: dict[str, Any], *, grace: float = PREDECESSOR_GRACE,
                      wait: float = PREDECESSOR_WAIT, clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Stop the lost attempt described by its agent's ``header`` (pid, create time, start
    ticks); returns a line for the task's log, or None when it was already gone."""
    task = {"name": name, "progress_path": "", **{k: header.get(k) for k in ("pid", "create_time", "start_ticks")}}
    started = clock()
    if ask({"mode": "signal", "signal": int(signal.SIGTERM), "tasks": [task]}).get(name) != "signalled":
        return None
    killed = gone = False
    while not gone and clock() - started < wait:
        sleep(POLL_EVERY)
        if not killed and clock() - started >= grace:
            killed = ask({"mode": "signal", "signal": int(signal.SIGKILL), "tasks": [task]}).get(name) == "signalled"
        gone = not ask({"mode": "info", "tasks": [task]})[name]["alive"]
    note = "stopped" if gone else "could not stop"
    return (f"tfl: {note} this task's previous attempt (pid {task['pid']}), lost with its connection, "
            f"in {clock() - started:.1f} s\n")
