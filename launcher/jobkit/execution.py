"""How many steps one call into TensorFlow runs, and learning-rate scaling. Pure: no TensorFlow.

Keras runs `steps_per_execution` training steps per call of its train function. Every
call costs a fixed amount of Python on the host (the fit loop, the callbacks, the call
into the runtime, ~0.2-1 ms), so small steps waste a large share of the time at 1; but
the callbacks, and with them tfl's progress record, run once per call. The kit's choice
keeps one call near `TARGET_EXECUTION_S`: the fixed cost stays well under 1 % while the
progress file is still rewritten every half second (the stall watchdog reads it).
"""

from __future__ import annotations

import math
from typing import Final, Literal

from launcher.jobkit.context import JobKitError

TARGET_EXECUTION_S: Final = 0.2
MAX_STEPS_PER_EXECUTION: Final = 256
LrScaling = Literal["none", "linear"]
LR_SCALINGS: Final = ("none", "linear")


def choose_steps_per_execution(step_s: float, *, steps_per_epoch: int | None, backup_every_steps: int | None,
                               target_s: float = TARGET_EXECUTION_S,
                               limit: int = MAX_STEPS_PER_EXECUTION) -> int:
    """Steps per call so that one call takes about `target_s`, given the measured `step_s`.

    With backups every N steps it divides N and the epoch, so every call starts on a
    multiple of itself and every backup falls at the end of a call (keras runs callbacks
    only there). Otherwise it prefers a divisor of the epoch, so no epoch ends with a
    short call, unless the best divisor is less than half the ideal.
    """
    if step_s <= 0 or math.isnan(step_s):
        raise JobKitError(f"measured step time is {step_s!r}; expected a positive number of seconds")
    ideal = max(1, min(limit, int(target_s / step_s)))
    if steps_per_epoch is not None:
        ideal = min(ideal, steps_per_epoch)
    if backup_every_steps is not None:
        unit = math.gcd(backup_every_steps, steps_per_epoch) if steps_per_epoch else backup_every_steps
        return largest_divisor_at_most(unit, ideal)
    if steps_per_epoch is None:
        return ideal
    divisor = largest_divisor_at_most(steps_per_epoch, ideal)
    return divisor if 2 * divisor >= ideal else ideal


def largest_divisor_at_most(number: int, bound: int) -> int:
    """The largest d <= bound with number % d == 0 (at least 1)."""
    return next(d for d in range(max(1, min(bound, number)), 0, -1) if number % d == 0)


def check_steps_per_execution(value: int | None) -> None:
    if value is not None and value < 1:
        raise JobKitError(f"steps_per_execution is {value}; expected a positive number of steps, "
                          "or None to let the kit choose from the measured step time")


def scaled_learning_rate(base: float, replicas: int, scaling: str) -> float:
    """The peak learning rate: `base` for one replica, times the replicas under linear scaling
    (Goyal et al., 2017: the global batch grows with the replicas, so does the step)."""
    if scaling not in LR_SCALINGS:
        raise JobKitError(f"learning-rate scaling {scaling!r} is not known; expected one of {', '.join(LR_SCALINGS)}")
    return base * replicas if scaling == "linear" else base


def warmup_rate(step: int, *, base: float, peak: float, warmup_steps: int) -> float:
    """The rate at (0-based) `step`: from `base` up to `peak` in a straight line over the
    warm-up, then `peak`. The schedule in `schedules.py` computes the same in TensorFlow."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return peak
    return base + (peak - base) * step / warmup_steps
