"""`finish`: the end of a training task under MultiWorkerMirroredStrategy, chief last.

TensorFlow's own teardown at interpreter exit takes about 1.5 s per task, and when the
chief (which hosts the coordination service) is gone first, a worker spends 3-5 s more
on failing heartbeats. So every training task waits for the others at a barrier and
leaves at once with `os._exit(0)`. The order matters too: the chief's barrier can return
before the service has sent the workers their replies, and if the chief leaves then, a
worker is stuck on the slow path. So each worker, once past the barrier, tells the chief
through the service's key-value store, then leaves; the chief leaves after hearing from
every worker, the last of all. (Each side logs the moment it leaves; a worker's
message to the chief is its last act, so the chief's moment is always the later.)

`leave_together` is the protocol, free of TensorFlow so that it is tested with fakes.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from launcher.contract import TRAINING_TYPES
from launcher.jobkit.context import TaskContext, task_context
from launcher.jobkit.notice import exit_on_notice

if TYPE_CHECKING:
    import tensorflow as tf

BARRIER = "tfl-jobkit-finish"
LEFT_KEY = "tfl-jobkit-left/"  # + "worker:1": set by each non-chief task on its way out
LEFT_SEND_S = 5.0  # a worker gives up telling a chief that is already gone
REPLY_GRACE_S = 0.05  # the chief lets the service's replies to those last messages go out


class Coordination(Protocol):
    """The parts of TensorFlow's coordination service (`context.context()`) used here."""

    def wait_at_barrier(self, barrier_id: str, timeout_in_ms: int) -> None: ...
    def set_config_key_value(self, key: str, value: str) -> None: ...
    def get_config_key_value(self, key: str, timeout_in_ms: int) -> str: ...


def finish(strategy: tf.distribute.Strategy, barrier_timeout_s: float = 60.0, context: TaskContext | None = None) -> None:
    """End a training task whose work is done: call it last in the job's main.

    With MultiWorkerMirroredStrategy every training task waits for the others, then
    leaves with exit code 0 (the chief last). Everything the kit writes is closed by then
    (checkpoints, TensorBoard, progress, the done marker). With any other strategy it
    returns and the job ends as usual; if the barrier fails (a peer died), it returns
    too, and the launcher sees that peer fail.
    """
    import tensorflow as tf
    from tensorflow.python.eager import context as tf_context  # the coordination service

    context = context or task_context(os.environ)
    exit_on_notice(context, "after training ended")  # a custom loop's training ends here
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    leave_together(context, tf_context.context(), barrier_timeout_s=barrier_timeout_s,
                   errors=(tf.errors.OpError, AttributeError))


def leave_together(context: TaskContext, coordination: Coordination, *, barrier_timeout_s: float,
                   errors: tuple[type[BaseException], ...] = (Exception,),
                   leave: Callable[[], NoReturn] | None = None, sleep: Callable[[float], None] = time.sleep,
                   barrier: str = BARRIER) -> None:
    """Meet the other training tasks at the barrier, then leave, the chief after the rest."""
    leave = leave or _leave
    started = time.monotonic()
    try:
        coordination.wait_at_barrier(barrier, int(barrier_timeout_s * 1000))
    except errors as exc:
        print(f"jobkit: not every training task reached the end ({type(exc).__name__}); exiting the slow way", flush=True)
        return
    mine = f"{context.task_type}:{context.task_index}"
    if not context.is_chief:
        print(f"jobkit: every training task done (waited {time.monotonic() - started:.2f} s); {mine} leaves at "
              f"{time.time():.6f}, before the chief, without TensorFlow's teardown", flush=True)
        _flush()
        _send(lambda: coordination.set_config_key_value(LEFT_KEY + mine, "1"))
        leave()
    for task in (task for task in training_tasks(context) if task != mine):
        try:
            coordination.get_config_key_value(LEFT_KEY + task, int(LEFT_SEND_S * 1000))
        except errors as exc:
            print(f"jobkit: {task} did not say it was leaving ({type(exc).__name__}); the chief leaves anyway", flush=True)
            break
    print(f"jobkit: every training task done (waited {time.monotonic() - started:.2f} s); the chief leaves last at "
          f"{time.time():.6f}, without TensorFlow's teardown", flush=True)
    sleep(REPLY_GRACE_S)
    leave()


def training_tasks(context: TaskContext) -> list[str]:
    """Every training task of the cluster, as "type:index"."""
    return [f"{kind}:{i}" for kind in TRAINING_TYPES for i in range(len(context.cluster.get(kind, ())))]


def _send(call: Callable[[], Any]) -> None:
    """Run `call`, waiting at most LEFT_SEND_S: if the chief is gone, nobody is listening."""
    def run() -> None:
        try:
            call()
        except Exception:  # noqa: BLE001 - the chief is gone: nothing to tell
            pass

    thread = threading.Thread(target=run, name="tfl-finish", daemon=True)
    thread.start()
    thread.join(LEFT_SEND_S)


def _flush() -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()


def _leave() -> NoReturn:
    _flush()
    os._exit(0)
