"""The states of a task and of a run, with their allowed transitions.

Task (one process of one attempt)::

    PENDING --start--> RUNNING --exit 0--> SUCCEEDED
                          |---exit != 0 / vanished--> FAILED
                          '---stopped by tfl--------> STOPPED

Run (the whole group; policy is all-or-nothing: one failed training task stops the rest)::

    STARTING -> RUNNING -> SUCCEEDED                      every training task exited 0
                       \\-> FAILED                         a training task failed, no restart left
                       \\-> RESTARTING -> RUNNING          a training task failed, restarts left
                       \\-> STOPPING -> STOPPED            the user asked (signal, ``tfl stop``)

``LOST`` is never written: ``tfl status`` shows it for a run whose record is not terminal
but whose launcher process is gone.
"""

from __future__ import annotations

from enum import Enum


class TaskState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED)


class RunState(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED)
