"""Follow the tasks' log files and print their lines with a ``[chief:0]`` prefix.

Tasks write straight to their log files (nothing lost if the launcher dies, no SIGPIPE
for the tasks); the live console view of ``tfl launch`` and ``tfl logs --follow`` both
tail those files with this one follower. By default it hides TensorFlow's known start-up
noise (``launcher.views.noise``) and says, once per task at the end, how many lines it hid; and
it folds into one line each traceback a lost peer caused (``launcher.views.fold``).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from pathlib import Path
from typing import BinaryIO, Callable, TextIO

from launcher.console import silence
from launcher.limits import FOLLOW_OPEN
from launcher.views.fold import TracebackFold
from launcher.views.noise import NoiseFilter

IDLE_CLOSE = 100  # polls (10 s at the console's pace) after which an idle log is closed
READ_CHUNK = 1 << 20  # bytes read from a log at once: a task that prints faster than the console never grows tfl's memory
_COLOURS = ("36", "33", "35", "32", "34", "31", "96", "93", "95", "92")


class _Source:
    """One task's log, read from where the last read ended. Its size is looked at first: an idle
    log is never opened again, a growing one stays open (at most ``FOLLOW_OPEN`` logs of a
    follower at once, closed again after ``IDLE_CLOSE`` idle polls), and a log truncated or
    replaced at its path is read again from its start."""

    def __init__(self, name: str, path: Path, prefix: str, from_end: bool, hide_noise: bool,
                 peer_lost: list[str], slots: list[int]) -> None:
        self.name, self.path, self.prefix = name, path, prefix
        self.ident = _ident(path)  # the file read so far (device, inode): another one at the path starts anew
        self.offset = path.stat().st_size if from_end and self.ident else 0
        self.partial = b""
        self.noise = NoiseFilter() if hide_noise else None
        self.cut_noise = 0  # noise lines that came before the first line a tail kept
        self.fold = TracebackFold(peer_lost) if hide_noise else None
        self._handle: BinaryIO | None = None
        self._idle = 0  # polls since it last grew
        self._slots = slots  # shared by the follower's sources: how many logs may stay open now

    def shown(self, lines: list[str], idle: float, final: bool) -> list[tuple[str, int]]:
        """What of ``lines`` the console shows (no start-up noise, no traceback a lost peer caused),
        each with how many noise lines had been hidden when it came."""
        if self.fold is None:
            return [(line, 0) for line in lines]
        shown = [(out, self.hidden) for out in self.fold.tick(idle)] if not lines else []
        for line in lines:
            if self.noise is None or not self.noise.is_noise(line):
                shown += [(out, self.hidden) for out in self.fold.feed(line)]
        return shown + [(out, self.hidden) for out in self.fold.flush()] if final else shown

    @property
    def hidden(self) -> int:
        """Noise lines hidden from what is shown (not those before a ``--tail`` cut)."""
        return self.noise.count - self.cut_noise if self.noise is not None else 0

    def read_lines(self, final: bool) -> tuple[list[str], bool]:
        """The next complete lines (``final``: the last one without its newline too, once the log is read
        to its end), and whether more may be waiting (a whole ``READ_CHUNK`` was read)."""
        chunk = self._read_new()
        more = len(chunk) >= READ_CHUNK
        final = final and not more
        data = self.partial + chunk
        lines = data.split(b"\n")
        self.partial = b"" if final else lines.pop()
        if len(self.partial) >= READ_CHUNK:  # a line that never ends (no newline): shown in pieces, never held whole
            lines.append(self.partial)
            self.partial = b""
        if final and lines and lines[-1] == b"":
            lines.pop()
        return [line.decode(errors="replace") for line in lines], more

    def _read_new(self) -> bytes:
        try:
            st = os.stat(self.path)
        except OSError:
            return b""
        rest = b""
        if (st.st_dev, st.st_ino) != self.ident:  # rotated or made anew: the old file's last bytes, then the new one
            rest = self._read_open()
            if len(rest) >= READ_CHUNK:
                return rest  # the old file's last bytes, a chunk at a time, before the new one
            self.close()
            self.offset = 0 if self.ident else self.offset
            self.ident = (st.st_dev, st.st_ino)
        elif st.st_size < self.offset:  # truncated
            self.close()
            self.offset = 0
        if st.st_size <= self.offset:  # idle: nothing opened, and one idle long enough gives its slot back
            self._idle += 1
            if self._idle >= IDLE_CLOSE:
                self.close()
            return rest
        self._idle = 0
        if self._handle is None:
            try:
                handle = open(self.path, "rb")
            except OSError:
                return rest
            handle.seek(self.offset)
            if self._slots[0] > 0:
                self._slots[0] -= 1
                self._handle = handle
            else:  # every slot taken: read and close
                with handle:
                    chunk = handle.read(READ_CHUNK - len(rest))
                self.offset += len(chunk)
                return rest + chunk
        return rest + self._read_open()

    def _read_open(self) -> bytes:
        if self._handle is None:
            return b""
        try:
            chunk = self._handle.read(READ_CHUNK)
        except OSError:
            return b""
        self.offset += len(chunk)
        return chunk

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            self._slots[0] += 1


def _ident(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class LogFollower:
    """Prints new lines of several log files, each line prefixed with its task name."""

    def __init__(self, sources: list[tuple[str, str]], out: TextIO, *, colour: bool = False,
                 interval: float = 0.1, from_end: bool = False, hide_noise: bool = False, tail: int | None = None,
                 on_gone: Callable[[], None] = lambda: None) -> None:
        """``tail``: of what the logs already hold, each task's last ``tail`` lines shown (as ``tail -n``);
        what they get later is shown whole. ``on_gone``: called once if ``out``'s reader goes away
        (a closed pipe); from then on nothing is written (``gone``), and the logs keep every line."""
        width = max((len(name) for name, _ in sources), default=0)
        self._sources = []
        peer_lost: list[str] = []  # shared: a host lost is known to every task's fold
        slots = [FOLLOW_OPEN]  # logs that may stay open at once
        for i, (name, path) in enumerate(sources):
            tag = f"[{name}]".ljust(width + 2)
            prefix = f"\033[{_COLOURS[i % len(_COLOURS)]}m{tag}\033[0m " if colour else f"{tag} "
            self._sources.append(_Source(name, Path(path), prefix, from_end, hide_noise, peer_lost, slots))
        self._out, self._interval, self._tail, self._on_gone = out, interval, tail, on_gone
        self.gone = False
        self.behind = False  # the last poll left lines unread (a task that prints faster than one chunk a poll)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self, final: bool = False) -> int:
        if self.gone:
            return 0
        printed, self.behind = 0, False
        for src in self._sources:
            kept: deque[tuple[str, int]] = deque(maxlen=self._tail)  # with a tail: its last lines so far
            total, chunks, more = 0, 0, True
            # A chunk at a time: what the log holds is never in memory at once. A live poll takes one chunk
            # of each log, so one fast task never holds up the others; ``behind``: poll again at once.
            while more and not self.gone:
                if chunks and not (final or self._tail is not None):
                    self.behind = True
                    break
                lines, more = src.read_lines(final)
                chunks += 1
                shown = src.shown(lines, self._interval, final and not more) if lines or not more else []
                total += len(shown)
                if self._tail is not None:
                    kept.extend(shown)
                else:
                    printed += self._write("".join(f"{src.prefix}{line}\n" for line, _ in shown), len(shown))
            if self._tail is not None:
                if total > self._tail:
                    src.cut_noise = kept[0][1] if kept else src.hidden
                printed += self._write("".join(f"{src.prefix}{line}\n" for line, _ in kept), len(kept))
        self._tail = None  # only what the logs held at the first poll is cut
        return printed

    def _write(self, text: str, lines: int = 1) -> int:
        """``text`` written and flushed; 0 (and ``gone``) when the reader went away."""
        if self.gone or not text:
            return 0
        try:
            self._out.write(text)
            self._out.flush()
        except BrokenPipeError:
            self.gone = True
            silence(self._out)
            self._on_gone()
            return 0
        return lines

    def start(self) -> LogFollower:
        self._thread = threading.Thread(target=self._loop, name="log-follower", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0 if self.behind else self._interval):
            self.poll_once()

    def stop(self) -> None:
        """Stop following and print what is left, partial last lines included, then how many
        noise lines each task had. Idempotent."""
        self._stop.set()
        if self._thread:
            self._thread.join()
            self._thread = None
        self.poll_once(final=True)
        for src in self._sources:
            if src.hidden:
                self._write(f"{src.prefix}tfl: {src.hidden} line(s) of TensorFlow start-up noise hidden "
                            "(the task's log keeps them; --verbose shows them)\n")
            if src.noise is not None:
                src.noise.hidden.clear()
                src.cut_noise = 0
            src.close()
