"""The states of a task and of a run, with their allowed transitions.

Task (one process of one attempt)::

    PENDING --start--> RUNNING --exit 0--> SUCCEEDED
                          |---exit 170 (PREEMPTED_EXIT_CODE)--> PREEMPTED   saved at the agreed checkpoint
                          |---exit != 0 / vanished--> FAILED
                          '---stopped by tfl--------> STOPPED       (PREEMPTED when it saved on tfl's notice)

Run (the whole group; policy is all-or-nothing: one failed training task stops the rest)::

    STARTING -> RUNNING -> SUCCEEDED                      every training task exited 0
                       \\-> FAILED                         a training task failed, no restart left
                       \\-> RESTARTING -> RUNNING          a training task failed, restarts left; or it was
                                                          preempted, preemption restarts left (counted apart)
                       \\-> STOPPING -> STOPPED            the user asked (SIGINT, SIGHUP, ``tfl stop``)
                       \\-> STOPPING -> PREEMPTED          the launcher itself got SIGTERM (its machine going
                                                          away), or --max-preemptions was reached

A STOPPED, PREEMPTED or FAILED run can be continued by ``tfl resume``: the same record goes
STARTING again with the next attempt (``launcher.runs.resume``).

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
    PREEMPTED = "preempted"  # exited PREEMPTED_EXIT_CODE: it saved the agreed checkpoint and left

    @property
    def is_terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.PREEMPTED)


class RunState(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    PREEMPTED = "preempted"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.PREEMPTED)
