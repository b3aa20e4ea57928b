"""Progress reporting: the launcher's progress file and the per-epoch stdout line.

Pure (no TensorFlow). The callback in `callbacks.py` feeds true values in here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, SupportsFloat, SupportsInt

from launcher.contract import ProgressRecord
from launcher.jobkit.layout import write_json_atomically

Phase = Literal["train", "eval", "done", "preempted", "left-unsaved", "replay"]  # contract.PHASES
# Keys of keras logs that are not metrics of the model.
_NOT_METRICS = frozenset({"loss", "batch", "size", "num_steps"})


class ProgressWriter:
    """Writes `$TFL_PROGRESS_FILE` atomically, at most every `min_interval_s` unless forced.

    `log_path`, when given, also receives every record as one JSON line, unthrottled;
    it exists so tests (and people debugging) can see each step's values.
    """

    def __init__(
        self,
        path: Path | None,
        *,
        log_path: Path | None = None,
        min_interval_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._log_path = log_path
        self._min_interval_s = min_interval_s
        self._clock = clock
        self._last_write: float | None = None

    def due(self) -> bool:
        """Whether an unforced `write` would record anything (saves building the record)."""
        return self._log_path is not None or (self._path is not None and self._interval_elapsed())

    def write(self, record: Mapping[str, Any], *, force: bool = False) -> bool:
        """Record `record`; returns whether the progress file itself was rewritten."""
        if self._log_path is not None:
            with self._log_path.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        if self._path is None:
            return False
        if not force and not self._interval_elapsed():
            return False
        write_json_atomically(self._path, dict(record))
        self._last_write = self._clock()
        return True

    def _interval_elapsed(self) -> bool:
        return self._last_write is None or self._clock() - self._last_write >= self._min_interval_s


def split_logs(logs: Mapping[str, Any]) -> tuple[float | None, dict[str, float]]:
    """(loss, other metrics) from keras logs, as plain floats."""
    loss = float(logs["loss"]) if "loss" in logs else None
    metrics = {name: float(value) for name, value in logs.items() if name not in _NOT_METRICS}
    return loss, metrics


def format_epoch_line(epoch: int, epochs: int, logs: Mapping[str, Any]) -> str:
    """`epoch 2/3 loss=0.123456 accuracy=0.950000 [name=value ...]`; the launcher parses it."""
    return f"epoch {epoch}/{epochs} {_values_text(logs)}"


def format_eval_line(checkpoint: str, epoch: int | None, results: Mapping[str, Any]) -> str:
    """`eval checkpoint=ckpt-2 epoch=2 loss=0.123456 accuracy=0.950000 [name=value ...]`."""
    shown_epoch = "unknown" if epoch is None else str(epoch)
    return f"eval checkpoint={checkpoint} epoch={shown_epoch} {_values_text(results)}"


def _values_text(logs: Mapping[str, Any]) -> str:
    # Fixed order (loss, accuracy, then the rest sorted) so lines from two tasks compare equal.
    loss, metrics = split_logs(logs)
    parts = ["loss=nan" if loss is None else f"loss={loss:.6f}"]
    if "accuracy" in metrics:
        parts.append(f"accuracy={metrics.pop('accuracy'):.6f}")
    parts.extend(f"{name}={value:.6f}" for name, value in sorted(metrics.items()))
    return " ".join(parts)


def progress_record(
    *,
    task: str,
    attempt: SupportsInt,
    phase: Phase,
    epoch: SupportsInt,
    epochs: SupportsInt,
    step: SupportsInt,
    steps_per_epoch: SupportsInt | None,
    global_step: SupportsInt,
    logs: Mapping[str, Any],
    examples_per_sec: SupportsFloat,
    now: float | None = None,
) -> dict[str, Any]:
    """The progress file's record (``contract.ProgressRecord``), as the JSON object it is written as."""
    loss, metrics = split_logs(logs)
    # int()/float(): keras hands out numpy scalars (e.g. the batch index after a
    # mid-epoch restore), which json cannot serialise.
    return ProgressRecord(
        task=task, attempt=int(attempt), phase=phase, epoch=int(epoch), epochs=int(epochs), step=int(step),
        steps_per_epoch=None if steps_per_epoch is None else int(steps_per_epoch),
        global_step=int(global_step), loss=loss, metrics=metrics,
        examples_per_sec=float(examples_per_sec), time=time.time() if now is None else now,
    ).to_dict()
