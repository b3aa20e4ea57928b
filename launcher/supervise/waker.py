"""Waking the supervisor's loop from threads *and* signal handlers: a self-pipe.

A Python signal handler runs in the main thread between two bytecodes, possibly while
that thread is inside ``threading.Event.wait``/``clear`` holding the Event's lock; an
``Event.set()`` in the handler then waits for that lock forever (or, under a stream of
signals, nests until ``RecursionError``). ``Waker.wake`` takes no lock: it writes one
byte to a non-blocking pipe, which is safe from any thread and from a signal handler.
``Waker.wait`` selects on the pipe's other end and drains it, so any number of wakes
before or during a wait end that wait once, like ``Event.wait`` followed by ``clear``.
"""

from __future__ import annotations

import os
import select


class Waker:
    """A wake-up call that a signal handler may make. Lives as long as its last user: the
    pipe is closed only when nothing can write to it any more (a closed descriptor's
    number could be reused by another file, which a late ``wake`` would then write to)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def wake(self) -> None:
        """Make the current or the next ``wait`` return at once. Lock-free."""
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: a wake is pending anyway

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a wake; True when woken. Pending wakes are consumed."""
        ready, _, _ = select.select([self._read], [], [], max(0.0, timeout))
        if not ready:
            return False
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass  # drained
        return True

    def __del__(self) -> None:
        for fd in (getattr(self, "_read", None), getattr(self, "_write", None)):
            if fd is None:
                continue
            try:
                os.close(fd)
            except OSError:
                pass
