"""The preemption notice (SIGTERM) of a training task, seen even while TensorFlow holds the main thread.

Python runs signal handlers in the main thread only, between bytecodes; a task blocked in
a collective (waiting for a peer that is gone) would never get to run one. So the kit
asks Python to write each signal to a pipe (`signal.set_wakeup_fd`) and a daemon thread
reads it. What the thread does depends on where the task is:

- outside training (start-up before `fit`, or after it: the done marker is written) there
  is nothing to agree on: the task leaves at once with PREEMPTED_EXIT_CODE, and the next
  attempt resumes from the last backup, or finds the done marker and does not train; but for
  the done marker's case its last progress record says it saved nothing (contract.LEFT_UNSAVED_PHASE);
- inside `fit`, before the attempt's first call of the train function ended (a replayed
  input can hold that call for minutes), nothing was trained since the restore: the task
  leaves at once with PREEMPTED_EXIT_CODE, as outside training;
- inside `fit` after that, the notice is only recorded (`received`), and TensorFlow's preemption
  handler takes it from there (`preemption.py`: every training task saves at one agreed
  step). If the task then makes no progress for a while (no call of the train function
  ends; a peer is gone, so the agreement can never come), the thread ends the task as
  SIGTERM's default action would: no checkpoint, nothing claimed. "A while" is learnt
  from the gaps between calls, an epoch's end included (its checkpoint and backup).

Pure: no TensorFlow. The evaluator is not a training task: its SIGTERM ends it as the
default action would. tfl's teardown after a failure elsewhere is another signal
(contract.TEARDOWN_SIGNAL), which ends a task the same way: at once, as nothing can be
agreed with a dead peer. Each of those ends, like every exit of the kit's, first removes
autograph's generated files from the temp dir (`tidy`), which its skipped `atexit` would
have. Where the teardown is SIGTERM all the same (Slurm: srun's ``--kill-on-bad-exit``
ends a failed task's step that way, and Slurm's own preemption notice is SIGTERM straight
to the tasks, so no signal tells them apart), a SIGTERM inside
`fit` first asks whether a peer is gone: each other training task's TF_CONFIG address
gets a TCP connect (PEER_PROBE_S at most). A refused connection means that peer's
process has ended (a live task's server listens there for the whole of training, and no
peer leaves a real notice before this task has saved: they meet at a barrier after the
agreed checkpoint), so the SIGTERM is a teardown and the task ends at once, as SIGTERM's
default action would. A peer that answers, or cannot be reached in time, changes nothing.
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import NoReturn

from launcher.contract import LEFT_UNSAVED_PHASE, PREEMPTED_EXIT_CODE, TEARDOWN_SIGNAL, TRAINING_TYPES, ProgressRecord
from launcher.jobkit.context import TaskContext
from launcher.jobkit.layout import write_json_atomically
from launcher.jobkit.tidy import remove_at_exit, remove_generated_files

STALL_FLOOR_S = 2.0  # inside training: no progress for this long after a notice ends the task,
STALL_FACTOR = 3.0  # or for this many times the longest gap between calls seen so far,
FIRST_CALLS_S = 60.0  # or this long before two calls and an epoch's end (first saves) have been seen
TEARDOWN = signal.Signals[TEARDOWN_SIGNAL]
PEER_PROBE_S = 0.5  # a SIGTERM inside training: how long the kit looks for a gone peer before taking it as a notice


class _Notice:
    """The one notice state of this process (signals are per process)."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self.outside: str | None = "before training began"  # None: inside fit, the handler acts
        self.trained = False  # outside, after training ended: a notice then leaves nothing unsaved
        self.context: TaskContext | None = None  # whose progress file says it left unsaved
        self.saving = False  # the agreed save has begun: never cut it short
        self.last_progress = time.monotonic()
        self.longest_gap = 0.0
        self.steps = 0  # calls ended since training began
        self.epoch_ended = False  # an epoch's end (its checkpoint and backup) seen since training began
        self.installed = False
        self.evaluator = False  # a SIGTERM ends it at once: there is nothing to agree
        self.peers: tuple[str, ...] = ()  # the other training tasks' TF_CONFIG addresses ("host:port")
        self.lock = threading.Lock()


_NOTICE = _Notice()


def exit_on_notice(context: TaskContext, when: str, *, trained: bool = False) -> None:
    """From now on a notice ends this training task with PREEMPTED_EXIT_CODE (`when`: for its log;
    `trained`: training has ended, so there is nothing left unsaved to report).

    Call it again after anything that takes SIGTERM over (MultiWorkerMirroredStrategy's
    coordination agent does, when it starts).
    """
    remove_at_exit()
    if context.is_evaluator:
        _NOTICE.evaluator = True
        _install()
        return
    _NOTICE.peers = _peers(context)
    _NOTICE.context, _NOTICE.trained = context, trained
    _NOTICE.outside = when
    _install()


def training_begins() -> None:
    """Inside `fit` from here on: the notice is recorded for the preemption handler."""
    with _NOTICE.lock:
        _NOTICE.outside = None
        _NOTICE.last_progress = time.monotonic()
        _NOTICE.steps = 0
        _NOTICE.epoch_ended = False


def step_done() -> None:
    """A call of the train function ended: the group is making progress."""
    now = time.monotonic()
    with _NOTICE.lock:
        if _NOTICE.steps:  # not the first call's gap: it includes tracing the function
            _NOTICE.longest_gap = max(_NOTICE.longest_gap, now - _NOTICE.last_progress)
        _NOTICE.steps += 1
        _NOTICE.last_progress = now


def epoch_done() -> None:
    """An epoch ended (its writes done): the gaps seen since include an epoch's end."""
    step_done()
    _NOTICE.epoch_ended = True


def saving() -> None:
    """The agreed save has begun: the stall guard stands down."""
    _NOTICE.saving = True


def received() -> bool:
    """Whether a notice has come (TensorFlow's handler polls this)."""
    return _NOTICE.received.is_set()


def leave_now(code: int) -> NoReturn:
    """Exit at once, without TensorFlow's teardown (whose threads may wait on gone peers)."""
    sys.stdout.flush()
    sys.stderr.flush()
    remove_generated_files()
    os._exit(code)


def _install() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # signals can only be taken over from the main thread
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(TEARDOWN, _on_signal)
    if _NOTICE.installed:
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd,), name="tfl-notice", daemon=True).start()
    _NOTICE.installed = True


def _on_signal(signum: int, frame: FrameType | None) -> None:
    """The watching thread acts on a notice. A signal that ends the task is also acted on here, if
    the main thread gets to it first: the thread may never hear of it, should anything have taken
    the wakeup fd over (an asyncio loop does), and the task must not outlive its teardown."""
    del frame
    if signum == TEARDOWN or (signum == signal.SIGTERM and _NOTICE.evaluator):
        _die_by(signal.Signals(signum))


def _watch(read_fd: int) -> None:
    while True:
        data = os.read(read_fd, 64)
        if TEARDOWN in data:
            _die_by(TEARDOWN)
        if signal.SIGTERM in data and _NOTICE.evaluator:
            _die_by(signal.SIGTERM)
        if signal.SIGTERM in data and not _NOTICE.received.is_set():
            at = time.monotonic()
            if _NOTICE.outside is None:
                _end_if_torn_down()
                _nothing_trained_yet()
            _NOTICE.received.set()
            _act(at)


def _peers(context: TaskContext) -> tuple[str, ...]:
    mine = context.cluster.get(context.task_type, ())[context.task_index:context.task_index + 1]
    return tuple(a for kind in TRAINING_TYPES for a in context.cluster.get(kind, ()) if a not in mine)


def _nothing_trained_yet() -> None:
    """A notice before this attempt's first call of the train function ended: nothing was trained since
    the restore (the call may be replaying a tf.data input for minutes), so there is nothing to agree on or
    save; waiting for an agreed step would outlast the grace period and end in SIGKILL."""
    with _NOTICE.lock:
        if not _NOTICE.steps and not _NOTICE.saving:
            _NOTICE.outside = ("before this attempt's first step ended (nothing trained since it began: the input's "
                               "replay, or the first call's tracing)")


def _end_if_torn_down() -> None:
    """A SIGTERM while a peer is gone is the teardown after its failure, not a notice: end at once."""
    gone = gone_peer(_NOTICE.peers, PEER_PROBE_S)
    if gone is not None and not _NOTICE.saving:
        print(f"jobkit: SIGTERM while the training task at {gone} is gone: a teardown after its failure, not a "
              "preemption notice (no agreement can include it); stopping at once without a checkpoint", flush=True)
        _die_by(signal.SIGTERM)


def gone_peer(addresses: tuple[str, ...], timeout: float) -> str | None:
    """The first address ("host:port") that refuses a connection within ``timeout`` s, else None.

    One thread per address, so that a peer whose name does not resolve or whose host does not
    answer costs no more than ``timeout``; they are daemons, left to finish on their own."""
    answers: queue.SimpleQueue[str | None] = queue.SimpleQueue()
    for address in addresses:
        threading.Thread(target=_probe, args=(address, timeout, answers), name="tfl-peer-probe", daemon=True).start()
    deadline = time.monotonic() + timeout
    for _ in addresses:
        try:
            gone = answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if gone is not None:
            return gone
    return None


def _probe(address: str, timeout: float, answers: queue.SimpleQueue[str | None]) -> None:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except ConnectionRefusedError:
        answers.put(address)  # nothing listens there: that task's process has ended
        return
    except (OSError, ValueError):
        pass  # unresolved, unreachable, slow: no evidence either way
    answers.put(None)


def _act(at: float) -> None:
    when = _NOTICE.outside
    if when is not None:
        print(f"jobkit: preemption notice (SIGTERM) {when}; nothing to save, exiting {PREEMPTED_EXIT_CODE}",
              flush=True)
        if not _NOTICE.trained:
            _say_left_unsaved(_NOTICE.context)
        leave_now(PREEMPTED_EXIT_CODE)
    print("jobkit: preemption notice (SIGTERM); every training task stops at one agreed step and saves there",
          flush=True)
    threading.Thread(target=_guard, args=(at,), name="tfl-notice-guard", daemon=True).start()


def _say_left_unsaved(context: TaskContext | None) -> None:
    """The task's last progress record: this attempt saved nothing (the last backup stays what a
    restart resumes from), so the launcher does not say it saved the agreed checkpoint."""
    if context is None or context.progress_file is None:
        return
    try:
        last = ProgressRecord.from_dict(json.loads(Path(context.progress_file).read_text())) or ProgressRecord()
    except (OSError, ValueError):
        last = ProgressRecord()
    fields = {**last.to_dict(), "task": context.label, "attempt": context.attempt, "phase": LEFT_UNSAVED_PHASE,
              "examples_per_sec": 0.0, "time": time.time()}
    try:
        write_json_atomically(Path(context.progress_file), fields)
    except OSError:
        pass  # the launcher then says "preempted" as before; leaving must not wait on it


def _guard(at: float) -> None:
    """End the task if the group stops making progress before the agreed save begins."""
    while not _NOTICE.saving:
        with _NOTICE.lock:
            settled = _NOTICE.steps >= 2 and _NOTICE.epoch_ended
            limit = max(STALL_FLOOR_S, STALL_FACTOR * _NOTICE.longest_gap) if settled else FIRST_CALLS_S
            idle = time.monotonic() - max(at, _NOTICE.last_progress)
        if _NOTICE.outside is not None:  # training ended meanwhile: nothing to save
            _act(at)
        if idle > limit:
            print(f"jobkit: no step ended for {idle:.1f} s after the preemption notice (a peer is gone?); "
                  "stopping without a checkpoint", flush=True)
            _die_by(signal.SIGTERM)
        time.sleep(0.1)


def _die_by(signum: signal.Signals) -> NoReturn:
    """The signal's default action (the task ends by it), from a thread (Python lets only the
    main thread set handlers), once autograph's files are removed."""
    sys.stdout.flush()
    sys.stderr.flush()
    remove_generated_files()
    libc = ctypes.CDLL(None)
    libc.signal(signum, 0)  # SIG_DFL
    os.kill(os.getpid(), signum)
    time.sleep(5)
    os._exit(128 + signum)
