"""Tracebacks that are a consequence, not a cause: folded in the console once a peer is lost.

When a host is cut off, the tasks left (stuck in an all-reduce with the lost one) crash out
with long TensorFlow tracebacks ending in the coordination service's report, e.g.::

    Collective ops is aborted by: … The following tasks are unhealthy (stopped sending heartbeats):
    /job:worker/replica:0/task:0

The root cause is the lost host, which tfl names; those tracebacks only bury it. So the
console (``views.logs.LogFollower``, which hides start-up noise the same way) holds each
traceback until it ends (the task falls silent for ``IDLE`` s, or says something of tfl's),
and prints it in full unless a peer is known lost: TensorFlow's report is in it, or tfl has
said a host is lost. Then it prints one line instead. The task's log keeps every line.
"""

from __future__ import annotations

import re

TRACEBACK = "Traceback (most recent call last):"
# TensorFlow's coordination service naming the tasks that stopped answering.
UNHEALTHY = re.compile(r"tasks are unhealthy \(stopped sending heartbeats\)|stopped sending heartbeats")
TF_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
TFL_LOST = re.compile(r"^tfl: lost \S+ on \S+: host \S+ unreachable since")
IDLE = 1.0  # seconds of silence that end a held traceback
MAX_HELD = 400  # lines: a longer "traceback" is printed as it is


def lost_peers(lines: list[str]) -> list[str]:
    """The tasks TensorFlow's report in ``lines`` names as lost ("worker:0"), in order."""
    found: list[str] = []
    reported = False
    for line in lines:
        reported = reported or bool(UNHEALTHY.search(line))
        if reported:
            for job, index in TF_TASK.findall(line):
                if f"{job}:{index}" not in found:
                    found.append(f"{job}:{index}")
    return found


class TracebackFold:
    """One task's console lines: holds tracebacks, folds those caused by a lost peer.

    ``peer_lost`` is shared by every task of the run (a list, so any source can set it)."""

    def __init__(self, peer_lost: list[str]) -> None:
        self._peer_lost = peer_lost
        self._held: list[str] = []
        self._idle = 0.0
        self.folded = 0  # lines folded so far

    def feed(self, line: str) -> list[str]:
        """The lines to print now for ``line`` (none while a traceback is held)."""
        if TFL_LOST.match(line) and not self._peer_lost:
            self._peer_lost.append(line.split()[2])  # the lost task
        if self._held and line.startswith("tfl:"):
            return [*self.flush(), line]
        if self._held:
            self._held.append(line)
            self._idle = 0.0
            return self.flush() if len(self._held) >= MAX_HELD else []
        if line.strip() == TRACEBACK:
            self._held, self._idle = [line], 0.0
            return []
        return [line]

    def tick(self, seconds: float) -> list[str]:
        """No new line for ``seconds`` more: a traceback held long enough has ended."""
        if not self._held:
            return []
        self._idle += seconds
        return self.flush() if self._idle >= IDLE else []

    def flush(self) -> list[str]:
        held, self._held = self._held, []
        if not held:
            return []
        peers = lost_peers(held)
        if peers and not self._peer_lost:
            self._peer_lost.append(peers[0])
        if not (peers or self._peer_lost):
            return held
        self.folded += len(held)
        because = peers or self._peer_lost
        return [f"tfl: a {len(held)}-line TensorFlow traceback folded: a consequence of losing {', '.join(because)} "
                "(the task's log keeps it)"]
