"""Stopping tasks: SIGTERM, a grace period, then SIGKILL. For any backend, any kind of task.

The supervisor uses it for a live group (through ``Backend.signal``/``alive``), backends use
it for what a recorded run left behind (``Backend.stop_recorded``). Tasks already gone are
fine, and so is a second call: it is idempotent.
"""

from __future__ import annotations

import signal as signals
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
KILL_WAIT = 10.0  # after SIGKILL: how long to wait for the kernel to reap the groups


def teardown(targets: Sequence[T], *, signal: Callable[[T, int], None], alive: Callable[[T], bool], grace: float,
             force: Callable[[], bool] = lambda: False, clock: Callable[[], float] = time.monotonic,
             wait: Callable[[float], None] = time.sleep, kill_wait: float = KILL_WAIT) -> list[T]:
    """SIGTERM every target still alive, wait up to ``grace`` s for them to go, SIGKILL the rest
    and wait up to ``kill_wait`` s. ``force()`` turning true skips (or cuts short) the grace.
    Returns the targets still alive at the end (normally none)."""
    left = [t for t in targets if alive(t)]
    for signum, budget in ((signals.SIGTERM, grace), (signals.SIGKILL, kill_wait)):
        if not left:
            break
        if signum == signals.SIGTERM and force():
            continue
        for target in left:
            signal(target, signum)
        deadline = clock() + budget
        while left and clock() < deadline and not (signum == signals.SIGTERM and force()):
            wait(min(0.05, max(0.0, deadline - clock())))
            left = [t for t in left if alive(t)]
        left = [t for t in left if alive(t)]
    return left
