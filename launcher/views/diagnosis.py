"""Known causes of a task's failure, told from the end of its log: the tail a failure record
keeps (dumps folded) and the one line that says what to do.

Keras 3 under MultiWorkerMirroredStrategy (keras-team/keras#20585): a job that writes
`import keras` gets Keras 3, whose `fit` hands a `PerReplica` batch to an op, and TensorFlow
raises `ValueError: Attempt to convert a value (PerReplica:{ … })` with every replica's
batch printed in between: a screenful of numbers that buries the message. The tail keeps
the first and last lines and folds the dump; the fix is tf_keras. The job kit refuses such a
model before that (`contract.KERAS3_REFUSED` in its one line): the same fix.

TensorFlow's known start-up noise (``views.noise``, what the console hides) is left out of the
tail as well, with one line that says how many lines were: a task that dies in its first
seconds would otherwise show twenty lines of oneDNN, CUDA-stub and gRPC notices and none of
its own. Pure.
"""

from __future__ import annotations

import re

from launcher.contract import KERAS3_REFUSED, LEGACY_KERAS
from launcher.tasklog import tail_lines
from launcher.views.noise import NoiseFilter

SCAN_LINES = 2000  # how far back a dump's first line is looked for
_DUMP_START = re.compile(r"\w*Error: Attempt to convert a value \(PerReplica:\{")
_KERAS3_END = re.compile(r".*with an unsupported type \(<class '[\w.]*PerReplica'>\) to a Tensor\.\s*$")
KERAS3_FIX = ("Keras 3 (`import keras`) breaks under MultiWorkerMirroredStrategy (keras-team/keras#20585): "
              f"use `import tf_keras as keras`, or `tf.keras` (tfl sets {LEGACY_KERAS}=1 for it)")


def failure_tail(log_path: str, count: int) -> list[str]:
    """The last ``count`` lines of a failed task's log, a known dump folded into one line and
    TensorFlow's known start-up noise left out (one line first says how many of the lines the
    tail spans were)."""
    if not count:
        return []
    lines = _folded(tail_lines(log_path, SCAN_LINES))
    noise = NoiseFilter()
    quiet = [not noise.is_noise(line) for line in lines]
    kept = [i for i, keep in enumerate(quiet) if keep][-count:]
    first = kept[0] if len(kept) == count else 0
    hidden = quiet[first:].count(False)
    said = [f"… {hidden} line(s) of TensorFlow start-up noise left out (the task's log keeps them)"] if hidden else []
    return said + [lines[i] for i in kept]


def _folded(lines: list[str]) -> list[str]:
    """``lines`` with a Keras 3 tensor dump at their end folded into one line."""
    if lines and _KERAS3_END.match(lines[-1]):
        start = next((i for i in range(len(lines) - 1, -1, -1) if _DUMP_START.search(lines[i])), None)
        if start is not None and len(lines) - start > 2:
            folded = len(lines) - start - 2
            lines = [*lines[:start + 1], f"… {folded} lines of the value's tensors folded (the task's log keeps them)",
                     lines[-1]]
    return lines


def known_fix(tail: list[str]) -> str | None:
    """What to do about a failure whose log ends in ``tail``, when the cause is a known one."""
    if tail and (_KERAS3_END.match(tail[-1]) or KERAS3_REFUSED in tail[-1]):  # TensorFlow's error, or the kit's
        return KERAS3_FIX
    return None
