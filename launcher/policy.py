"""The run's policy options (restarts, grace, timeouts), as plain data.

Apart from the supervisor that applies them so that the planners which must carry them
elsewhere (a Slurm batch script restarts its own group) need no supervisor, and the plan
stage no run stage.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

# TensorFlow's preemption exit code, and a SIGTERM from outside tfl: always worth a retry.
PREEMPTION_EXIT_CODES = frozenset({143, -signal.SIGTERM})


@dataclass(frozen=True)
class SupervisorConfig:
    max_restarts: int = 0
    retry_on: str = "any"  # "any": every failure; "preemption": only PREEMPTION_EXIT_CODES
    grace_period: float = 5.0
    poll_interval: float = 0.5  # an upper bound: local exits wake the supervisor at once
    evaluator_timeout: float = 600.0
    stall_timeout: float | None = None  # no progress from a training task for this long = failure
    log_tail_lines: int = 20
