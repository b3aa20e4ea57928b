"""The preemption pieces that need no TensorFlow: the notice outside and inside training, the
resume rule of the input position, the preempted record, the barrier's name."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.contract import PREEMPTED_BARRIER, PREEMPTED_EXIT_CODE, ModelDirLayout, PreemptedRecord
from launcher.jobkit.context import TaskContext
from launcher.jobkit.finish import leave_together
from launcher.jobkit.position import NOTHING, resume_point
from tests.conftest import ROOT

SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
from launcher.jobkit import notice
from launcher.jobkit.context import TaskContext
notice.STALL_FLOOR_S = 0.5
context = TaskContext(task_type={kind!r}, task_index=0, cluster={{"chief": ["a:1"], "worker": [{worker!r}]}})
notice.exit_on_notice(context, "before training began")
{setup}
print("ready", flush=True)
read_fd, _ = os.pipe()
os.read(read_fd, 1)  # blocked in a C call, as a task in a collective is
print("never", flush=True)
"""


def run_with_notice(tmp_path: Path, kind: str = "chief", setup: str = "", worker: str = "b:1") -> tuple[int, str, float]:
    """Start the script, send SIGTERM once it is ready: (exit code, output, seconds to exit).
    ``worker``: the peer's TF_CONFIG address ("b" does not resolve: no evidence either way)."""
    script = tmp_path / "task.py"
    script.write_text(SCRIPT.format(root=str(ROOT), kind=kind, setup=textwrap.dedent(setup), worker=worker))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        return proc.returncode, out, time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_notice_before_training_exits_170_at_once_even_while_blocked(tmp_path: Path) -> None:
    code, out, _ = run_with_notice(tmp_path)
    assert code == PREEMPTED_EXIT_CODE
    assert "preemption notice (SIGTERM) before training began; nothing to save, exiting 170" in out
    assert "never" not in out


def test_a_notice_after_training_exits_170(tmp_path: Path) -> None:
    code, out, _ = run_with_notice(tmp_path, setup="""
        notice.training_begins()
        notice.exit_on_notice(context, "after training ended")
    """)
    assert code == PREEMPTED_EXIT_CODE and "after training ended" in out


def test_inside_training_a_group_that_stops_progressing_ends_as_sigterm_would(tmp_path: Path) -> None:
    # Calls ended 0.05 s apart; then the task blocks (a peer is gone): no agreed step can come.
    code, out, seconds = run_with_notice(tmp_path, setup="""
        notice.training_begins()
        for _ in range(3):
            time.sleep(0.05)
            notice.step_done()
        notice.epoch_done()
    """)
    assert code == -signal.SIGTERM
    assert "stopping without a checkpoint" in out
    assert seconds >= 0.5


def test_inside_training_the_notice_is_recorded_and_the_save_is_never_cut_short(tmp_path: Path) -> None:
    # The peer answers at once, as a live group's do. The clock of the stall limit (0.5 s here) runs from
    # the notice, and the save can begin only once the peer probe has ended: with the peer "b", the
    # resolver's time to say "b" does not exist (LLMNR, a slow DNS: up to the probe's whole 0.5 s) came
    # out of that limit, and the guard could end the task before its save began.
    with socket.create_server(("127.0.0.1", 0)) as alive:
        code, out, _ = run_with_notice(tmp_path, worker=f"127.0.0.1:{alive.getsockname()[1]}", setup="""
        import threading
        notice.training_begins()
        notice.step_done(); notice.step_done(); notice.epoch_done()
        def agreed_save():
            while not notice.received():
                time.sleep(0.01)
            notice.saving()
            time.sleep(1.5)  # a save longer than the stall limit
            print("saved", flush=True)
            notice.leave_now(170)
        threading.Thread(target=agreed_save, daemon=True).start()
    """)
    assert code == PREEMPTED_EXIT_CODE and "saved" in out and "without a checkpoint" not in out


# The stall guard is not what these prove: its 0.5 s floor counts from the signal, and the peer
# probe before it may take PEER_PROBE_S (0.5 s) on a loaded machine, after which the guard fired
# before the save could begin ("every peer answers" failed so once).
AGREED_SAVE = """
    import threading
    notice.STALL_FLOOR_S = 60.0
    notice.training_begins()
    notice.step_done(); notice.step_done(); notice.epoch_done()
    def agreed_save():
        while not notice.received():
            time.sleep(0.01)
        notice.saving()
        print("saved", flush=True)
        notice.leave_now(170)
    threading.Thread(target=agreed_save, daemon=True).start()
"""


def test_inside_training_a_sigterm_while_a_peer_is_gone_is_a_teardown_not_a_notice(tmp_path: Path) -> None:
    # The peer's port is bound but not listening, as a task's port is once its process has ended:
    # connections are refused. (Slurm's --kill-on-bad-exit ends the survivors with SIGTERM.)
    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        peer = f"127.0.0.1:{gone.getsockname()[1]}"
        code, out, _ = run_with_notice(tmp_path, setup=AGREED_SAVE, worker=peer)
    assert code == -signal.SIGTERM, out  # "Terminated", as Slurm's outcome reading expects of a survivor
    assert f"SIGTERM while the training task at {peer} is gone: a teardown" in out
    assert "jobkit: preemption notice" not in out and "saved" not in out


def test_inside_training_a_sigterm_while_every_peer_answers_stays_a_notice(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as alive:
        code, out, _ = run_with_notice(tmp_path, setup=AGREED_SAVE, worker=f"127.0.0.1:{alive.getsockname()[1]}")
    assert code == PREEMPTED_EXIT_CODE and "saved" in out and "preemption notice (SIGTERM); every training task" in out
    assert "teardown" not in out


def test_the_evaluator_keeps_sigterms_default_action(tmp_path: Path) -> None:
    code, out, _ = run_with_notice(tmp_path, kind="evaluator")
    assert code == -signal.SIGTERM and "preemption" not in out


@pytest.mark.parametrize(("state", "expected"), [
    (NOTHING, (0, 0)),  # no backup: from the start
    ((0, 4), (0, 5)),  # after step 5 of epoch 1
    ((1, 11), (2, 0)),  # after the last step of epoch 2 (12 steps)
    ((1, -1), (2, 0)),  # an epoch-end backup of an older kit
    ((2, 0), (2, 1)),
])
def test_resume_point_follows_keras_rule_for_step_backups(state: tuple[int, int], expected: tuple[int, int]) -> None:
    assert resume_point(state, 12) == expected


def test_preempted_record_round_trips_and_rejects_junk(tmp_path: Path) -> None:
    record = PreemptedRecord(run_id="r", attempt=2, global_step=29, epoch=3, step=5, steps_per_epoch=12,
                             notice_from="worker:0", backup="/m/backup/chief/ckpt-7", time=1.0)
    path = ModelDirLayout(tmp_path).preempted_file
    path.write_text(json.dumps(record.to_dict()))
    assert PreemptedRecord.from_dict(json.loads(path.read_text())) == record
    assert PreemptedRecord.from_dict([1]) is None
    assert PreemptedRecord.from_dict({"global_step": 3, "unknown": 1}) == PreemptedRecord(global_step=3)


def test_leave_together_meets_at_the_barrier_it_is_given() -> None:
    keys: list[str] = []

    class Coordination:
        def set_config_key_value(self, key: str, value: str) -> None:
            keys.append(key)

        def get_config_key_value(self, key: str, timeout_in_ms: int) -> str:
            keys.append(key)
            return "1"

    class Left(Exception):
        pass

    def leave() -> None:
        raise Left

    context = TaskContext("worker", 0, {"chief": ("a:1",), "worker": ("b:1",)})
    with pytest.raises(Left):
        leave_together(context, Coordination(), barrier_timeout_s=1, barrier=PREEMPTED_BARRIER,
                       leave=leave)  # type: ignore[arg-type]
    # Arrived, got the chief's go, said it was leaving: all under the preemption's own name.
    assert len(keys) == 3 and all(key.startswith(PREEMPTED_BARRIER + "/") for key in keys), keys
