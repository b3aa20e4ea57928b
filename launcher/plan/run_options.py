"""The run's policy options (restarts, grace, timeouts), as plain data.

Apart from the supervisor that applies them so that the planners which must carry them
elsewhere (a Slurm batch script restarts its own group) need no supervisor, and the plan
stage no run stage.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from launcher.contract import PREEMPTED_EXIT_CODE

# A SIGTERM from outside tfl that the task did not save on: --retry-on preemption retries it
# (counted against --max-restarts); a task that saved exits PREEMPTED_EXIT_CODE instead.
PREEMPTION_EXIT_CODES = frozenset({143, -signal.SIGTERM, PREEMPTED_EXIT_CODE})
# Between a notice (SIGTERM) and SIGKILL: TensorFlow's agreement on a step and the save of a
# checkpoint take seconds (docs/benchmarks.md); 30 s is also Kubernetes' default termination
# grace and a spot VM's notice on GCE.
DEFAULT_GRACE_S = 30.0


@dataclass(frozen=True)
class SupervisorConfig:
    max_restarts: int = 0
    retry_on: str = "any"  # "any": every failure; "preemption": only PREEMPTION_EXIT_CODES
    grace_period: float = DEFAULT_GRACE_S
    max_preemptions: int = 100  # restarts after a preemption, counted apart from max_restarts
    poll_interval: float = 0.5  # an upper bound: local exits wake the supervisor at once
    evaluator_timeout: float = 600.0
    stall_timeout: float | None = None  # no progress from a training task for this long = failure
    log_tail_lines: int = 20
    # Elastic runs (``launcher.plan.resize``, ``launcher.supervise.elastic``): None = a fixed size.
    min_tasks: int | None = None  # the fewest training tasks, the chief included, the run goes on with
    elastic_batch: str = "global"  # "global": the global batch is kept | "per-replica": the per-replica batch is
    global_batch: int | None = None  # the job's global batch (every replica's together), "global" mode
    blacklist_after: int = 2  # tasks on a host failed this many attempts in a row: the host is lost
    elastic_wait: float = 600.0  # below min_tasks: wait this long for lost hosts to return
    probe_interval: float = 30.0  # how often lost hosts are probed while the run goes on without them
    # where the evaluator may move while its host is lost: hosts in order, or "any" (elastic.ANY_HOST)
    evaluator_moves_to: tuple[str, ...] | str = ()
