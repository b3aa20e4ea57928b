"""Which hosts still answer: a host that stopped answering is known lost within seconds.

Every host's agent pings its launcher on its session when it has sent nothing for
``backend.agent_ping_every`` (3.3 s: ``SILENT_AFTER`` / 1.5; its tasks' output counts). A task
whose host's session has said nothing for ``SILENT_AFTER`` s makes us ask its host the cheapest
question there is: a TCP connection to its sshd's port, within ``PROBE_TIMEOUT`` s. A host
whose kernel answers is up (the agent is stuck, or slow: its channel's own timeout,
``pool.HEARTBEAT_TIMEOUT``, deals with that as before, and a restart may go there). A host
that does not answer is *lost*: cut off or powered off. Every task there is declared lost at
once, with the moment the host was last heard from, and no task is started there again in
this run (``HostWatch.lost``) unless a full SSH probe reaches it again (``forget``: an
elastic run takes such a host back).

So a lost host is named at most ``SILENT_AFTER + CHECK_EVERY + PROBE_TIMEOUT`` (about 10) s
after its last word, well before TensorFlow's survivors give up on their all-reduce and the
agent's own dead-man timer (``ssh.fence_after``) stops the task on the far side.

Tests only: ``TFL_TEST_SILENT_AFTER`` and ``TFL_TEST_PROBE_TIMEOUT`` (seconds) in the
launcher's environment shorten the two waits on a test bed whose hosts answer within
milliseconds (docs/development.md); unset, as for every user, the figures above hold.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from launcher.errors import ResourceLimitError
from launcher.limits import OWN_ERRNOS, limit_error

SILENT_AFTER = float(os.environ.get("TFL_TEST_SILENT_AFTER") or 5.0)  # a ping 1.7 s late
PROBE_TIMEOUT = float(os.environ.get("TFL_TEST_PROBE_TIMEOUT") or 4.0)
CHECK_EVERY = 1.0


class Watched(Protocol):
    """What the watch needs of a task on its host's session (``session.RemoteTask``)."""

    host: str
    port: int

    @property
    def heard(self) -> float: ...  # monotonic time of its host's agent's last word

    @property
    def heard_wall(self) -> float: ...  # the same moment, wall clock

    def running(self) -> bool: ...

    def declare_lost(self, cause: str, since: float) -> None: ...


@dataclass(frozen=True)
class LostHost:
    host: str
    since: float  # wall time of its last word
    noticed: float  # wall time we knew

    def describe(self) -> str:
        return (f"host {self.host} unreachable since {time.strftime('%H:%M:%S', time.localtime(self.since))} "
                f"(no answer for {self.noticed - self.since:.0f} s, its sshd port silent too)")


def reachable(host: str, port: int, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether the host's kernel answers a TCP connection to ``port`` (refused counts: it is up).
    An error of the launcher's own (out of descriptors or buffers) says nothing of the host:
    ``ResourceLimitError``."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except ConnectionRefusedError:
        return True
    except OSError as exc:
        if exc.errno in OWN_ERRNOS:
            raise limit_error(exc, "watching the hosts") from None
        return False


class HostWatch:
    """Declares hosts lost; ``check`` is called every ``CHECK_EVERY`` s with the live tasks."""

    def __init__(self, notify: Callable[[], None], probe: Callable[[str, int], bool] = reachable,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 say: Callable[[str], None] = lambda line: print(f"tfl: {line}", file=sys.stderr, flush=True)) -> None:
        """``say``: where the launcher's own fault (``ResourceLimitError`` from a probe) is said, once."""
        self._notify, self._probe, self._clock, self._wall, self._say = notify, probe, clock, wall, say
        self.fault: ResourceLimitError | None = None  # the launcher's own limit met by a probe: no host lost for it
        self._lost: dict[str, LostHost] = {}
        self._probing: set[str] = set()
        self._probed: dict[str, float] = {}  # host -> when last found up: asked again only after SILENT_AFTER
        self._lock = threading.Lock()

    def lost(self, host: str) -> LostHost | None:
        return self._lost.get(host)

    def forget(self, host: str) -> bool:
        """The host answers again (a probe logged in there): tasks may start there again.
        Whether it had been lost."""
        with self._lock:
            self._probed.pop(host, None)
            return self._lost.pop(host, None) is not None

    def check(self, tasks: Iterable[Watched]) -> None:
        """Probe (in a thread of its own) each host one of whose tasks is silent."""
        now = self._clock()
        by_host: dict[str, list[Watched]] = {}
        for task in tasks:
            if task.running():
                by_host.setdefault(task.host, []).append(task)
        for host, group in by_host.items():
            if host in self._lost:
                self._declare(self._lost[host], group)
            elif any(now - t.heard > SILENT_AFTER for t in group) and now - self._probed.get(host, -SILENT_AFTER) >= SILENT_AFTER:
                with self._lock:
                    if host in self._probing:
                        continue
                    self._probing.add(host)
                threading.Thread(target=self._probe_host, args=(host, group), name=f"probe-{host}", daemon=True).start()

    def confirm(self, task: Watched) -> None:
        """``task``'s connection ended without its exit: was its host lost (powered off, cut off
        while the connection was closing), or only the connection? Asks the host (blocks up to
        ``PROBE_TIMEOUT`` s); a lost host's tasks are declared lost."""
        if task.host not in self._lost and self._answers(task.host, task.port) is not False:
            return
        with self._lock:
            self._lost.setdefault(task.host, LostHost(task.host, since=task.heard_wall, noticed=self._wall()))
        self._declare(self._lost[task.host], [task])

    def _probe_host(self, host: str, group: list[Watched]) -> None:
        try:
            answers = self._answers(host, group[0].port)
            if answers:
                self._probed[host] = self._clock()
            if answers is not False:  # None: the launcher could not ask; asked again at the next check
                return
            lost = LostHost(host, since=max(t.heard_wall for t in group), noticed=self._wall())
            with self._lock:
                self._lost.setdefault(host, lost)
            self._declare(self._lost[host], group)
            self._notify()
        finally:
            with self._lock:
                self._probing.discard(host)

    def _answers(self, host: str, port: int) -> bool | None:
        """The probe's answer; None when the launcher could not ask (said once, never a lost host)."""
        try:
            return self._probe(host, port)
        except ResourceLimitError as exc:
            if self.fault is None:
                self.fault = exc
                self._say(str(exc))
            return None

    @staticmethod
    def _declare(lost: LostHost, group: list[Watched]) -> None:
        for task in group:
            task.declare_lost(lost.describe(), lost.since)
