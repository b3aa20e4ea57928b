"""`finish`: the end of a training task under MultiWorkerMirroredStrategy, chief last.

TensorFlow's own teardown at interpreter exit takes about 1.5 s per task, and when the
chief (which hosts the coordination service) is gone first, a worker spends 3-5 s more
on failing heartbeats. So every training task waits for the others and leaves at once
with `os._exit(0)`. The order matters too: if the chief leaves before the service has
sent a worker its last reply, that worker is stuck on the slow path. So each worker,
once everyone is done, tells the chief through the service's key-value store, then
leaves; the chief leaves after hearing from every worker, the last of all. (Each side
logs the moment it leaves; a worker's message to the chief is its last act, so the
chief's moment is always the later.)

The tasks meet through the key-value store alone, not the service's barrier: each worker
sets its arrival key, the chief waits for all of them and sets one "go" key that the
workers wait for. A barrier call is refused at once ("FailedPrecondition: Agent must be
in CONNECTED state") by a task whose own agent has gone into ERROR, and one late
heartbeat is enough for that: TensorFlow's window is 10 s (a heartbeat RPC may take 5 s),
which a loaded machine overruns (issue 26: the chief's barrier failed that way, the chief
left the slow way, the worker 50 s after it). The key-value calls do not look at the
agent's state, and the service keeps the keys whatever it thinks of a task's health. A
task that never comes (it died) costs the others the timeout, then they leave the slow
way; under tfl the supervisor has stopped the group long before.

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
from launcher.jobkit.tidy import remove_generated_files

if TYPE_CHECKING:
    import tensorflow as tf

BARRIER = "tfl-jobkit-finish"  # the meeting's name: the keys below live under it
ARRIVED = "/at/"  # BARRIER + ARRIVED + "worker:1": set by each non-chief task when its work is done
GO = "/go"  # BARRIER + GO: set by the chief once every other training task has arrived
LEFT = "/left/"  # BARRIER + LEFT + "worker:1": set by each non-chief task on its way out
LEFT_SEND_S = 5.0  # a worker gives up telling a chief that is already gone
REPLY_GRACE_S = 0.05  # the chief lets the service's replies to those last messages go out


class Coordination(Protocol):
    """The parts of TensorFlow's coordination service (`context.context()`) used here: its
    key-value store, which answers whatever state this task's agent is in."""

    def set_config_key_value(self, key: str, value: str) -> None: ...
    def get_config_key_value(self, key: str, timeout_in_ms: int) -> str: ...


def finish(strategy: tf.distribute.Strategy, barrier_timeout_s: float = 60.0, context: TaskContext | None = None) -> None:
    """End a training task whose work is done: call it last in the job's main.

    With MultiWorkerMirroredStrategy every training task waits for the others, then
    leaves with exit code 0 (the chief last). Everything the kit writes is closed by then
    (checkpoints, TensorBoard, progress, the done marker). With any other strategy it
    returns and the job ends as usual; if a peer does not come within `barrier_timeout_s`
    (it died), it returns too, and the launcher sees that peer fail.
    """
    import tensorflow as tf
    from tensorflow.python.eager import context as tf_context  # the coordination service

    context = context or task_context(os.environ)
    exit_on_notice(context, "after training ended", trained=True)  # a custom loop's training ends here
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return
    leave_together(context, tf_context.context(), barrier_timeout_s=barrier_timeout_s,
                   errors=(tf.errors.OpError, AttributeError))


def leave_together(context: TaskContext, coordination: Coordination, *, barrier_timeout_s: float,
                   errors: tuple[type[BaseException], ...] = (Exception,),
                   leave: Callable[[], NoReturn] | None = None, sleep: Callable[[float], None] = time.sleep,
                   barrier: str = BARRIER) -> None:
    """Meet the other training tasks, then leave, the chief after the rest.

    `barrier` names the meeting (the keys live under it); `barrier_timeout_s` bounds the wait
    for the others. Returns (for the slow way) only if the meeting failed.
    """
    leave = leave or _leave
    started = time.monotonic()
    deadline = started + barrier_timeout_s
    mine = f"{context.task_type}:{context.task_index}"
    others = [task for task in training_tasks(context) if task != mine]
    step = ""  # what this task was doing when the meeting failed: said, so that a failure can be told apart
    try:
        if context.is_chief:
            for task in others:
                step = f"waiting for {task} to arrive"
                coordination.get_config_key_value(barrier + ARRIVED + task, _ms_until(deadline))
            step = "saying go"
            coordination.set_config_key_value(barrier + GO, "1")
        else:
            step = "saying it arrived"
            coordination.set_config_key_value(barrier + ARRIVED + mine, "1")
            step = f"waiting for the chief's go (its arrival said after {time.monotonic() - started:.2f} s)"
            coordination.get_config_key_value(barrier + GO, _ms_until(deadline))
    except errors as exc:
        said = str(exc).strip().splitlines()[:1]
        print(f"jobkit: not every training task reached the end ({type(exc).__name__} after "
              f"{time.monotonic() - started:.1f} s, {mine} {step}{': ' + said[0][:200] if said else ''}); "
              "exiting the slow way", flush=True)
        return
    if not context.is_chief:
        print(f"jobkit: every training task done (waited {time.monotonic() - started:.2f} s); {mine} leaves at "
              f"{time.time():.6f}, before the chief, without TensorFlow's teardown", flush=True)
        _flush()
        unanswered = _send(lambda: coordination.set_config_key_value(barrier + LEFT + mine, "1"))
        if unanswered:  # the chief left before its service answered: it is a race the chief should not lose
            print(f"jobkit: {mine} got no answer from the chief ({unanswered}); it leaves anyway", flush=True)
        leave()
    for task in others:
        try:
            coordination.get_config_key_value(barrier + LEFT + task, int(LEFT_SEND_S * 1000))
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


def _ms_until(deadline: float) -> int:
    """Milliseconds left until `deadline` (time.monotonic()), at least 1: 0 would mean no limit."""
    return max(1, int((deadline - time.monotonic()) * 1000))


def _send(call: Callable[[], Any]) -> str | None:
    """Run `call`, waiting at most LEFT_SEND_S: if the chief is gone, nobody is listening.
    None if it was answered, else why not."""
    failed: list[str] = []

    def run() -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - the chief is gone: nothing to tell
            failed.append(type(exc).__name__)

    thread = threading.Thread(target=run, name="tfl-finish", daemon=True)
    thread.start()
    thread.join(LEFT_SEND_S)
    if thread.is_alive():
        return f"no reply in {LEFT_SEND_S:.0f} s"
    return failed[0] if failed else None


def _flush() -> None:
    """What was logged and printed reaches its file before `os._exit`. Flushed, not closed
    (`logging.shutdown()` closed them): absl's handler, which TensorFlow installs, closes any
    stream that is not sys's at that moment, and a process that goes on (a test's) lost it."""
    named = logging.Logger.manager.loggerDict.values()
    loggers = [logging.getLogger(), *(lg for lg in named if isinstance(lg, logging.Logger))]
    for handler in {h for lg in loggers for h in lg.handlers}:
        try:
            handler.flush()
        except (OSError, ValueError):  # a handler whose stream is already gone
            pass
    sys.stdout.flush()
    sys.stderr.flush()


def _leave() -> NoReturn:
    _flush()
    remove_generated_files()
    os._exit(0)
