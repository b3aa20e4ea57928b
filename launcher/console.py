"""tfl's own lines on stderr, and a console whose reader went away (stdlib only).

``tfl launch … | head -1`` (or ``2>&1 | head -1``) closes the pipe under tfl: a write then
raises BrokenPipeError, and the interpreter's last flush at exit raises it again. The run
goes on regardless, and its exit code stays the run's: ``say`` writes a line and, when the
reader is gone, ``silence``s the stream, so nothing tfl writes later raises.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TextIO


def silence(out: TextIO) -> None:
    """``out``'s reader is gone (a closed pipe): its descriptor now writes to /dev/null, so what
    its buffer still holds, flushed at exit, raises nothing again."""
    with contextlib.suppress(OSError, ValueError):  # no descriptor (a StringIO): nothing buffered for the exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, out.fileno())
        finally:
            os.close(devnull)


def say(text: str) -> None:
    """``text`` as a line on stderr, flushed (a detached launcher's stderr is its launcher.log);
    nothing more once stderr's reader is gone."""
    try:
        print(text, file=sys.stderr, flush=True)
    except BrokenPipeError:
        silence(sys.stderr)
