"""A task's log file as every engine writes it and the views read it (stdlib only, so a node side may
import it): the banner that opens a restarted attempt, and the last lines of a log for a failure record."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path


def attempt_banner(task: str, attempt: int) -> str:
    """The line that opens a restarted task's output in its log (every backend writes it)."""
    return f"--- tfl: attempt {attempt} of {task} at {time.strftime('%H:%M:%S')} ---\n"


def tail_lines(path: str | Path, count: int = 20) -> list[str]:
    """The last ``count`` lines of a file ([] when it does not exist)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return list(deque(text.splitlines(), maxlen=count))
