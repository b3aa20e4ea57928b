"""Survivors' tracebacks after a lost host: folded in the console, shown in full otherwise."""

from __future__ import annotations

import io
from pathlib import Path

from launcher.views.fold import IDLE, TracebackFold, lost_peers
from launcher.views.logs import LogFollower

SURVIVOR = """Traceback (most recent call last):
  File "/x/mnist.py", line 99, in <module>
    main()

  File "/x/optimizers/utils.py", line 172, in _all_reduce_sum_fn

Collective ops is aborted by: Error reported from /job:worker/task:0: The following tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) to debug further.
\t [[{{node CollectiveReduceV2}}]] [Op:__inference_train_function_2485]""".splitlines()
OWN_BUG = """Traceback (most recent call last):
  File "/x/job.py", line 3, in <module>
    1 / 0
ZeroDivisionError: division by zero""".splitlines()


def test_tensorflows_report_names_the_lost_task_and_not_the_reporter() -> None:
    assert lost_peers(SURVIVOR) == ["worker:1"]
    assert lost_peers(OWN_BUG) == []


def test_a_traceback_tensorflow_blames_on_a_lost_peer_is_one_line_and_the_next_output_shows() -> None:
    fold = TracebackFold([])
    assert [out for line in SURVIVOR for out in fold.feed(line)] == []  # held until it ends
    assert fold.tick(IDLE / 2) == []
    (line,) = fold.tick(IDLE)
    assert "10-line TensorFlow traceback folded: a consequence of losing worker:1" in line and fold.folded == 10
    assert fold.feed("epoch 3/5") == ["epoch 3/5"]


def test_a_jobs_own_traceback_is_shown_in_full_unless_a_host_is_known_lost() -> None:
    fold = TracebackFold([])
    for line in OWN_BUG:
        fold.feed(line)
    assert fold.flush() == OWN_BUG
    shared: list[str] = []
    other, this = TracebackFold(shared), TracebackFold(shared)
    other.feed("tfl: lost worker:0 on 198.51.100.3: host 198.51.100.3 unreachable since 01:02:03 (no answer for 9 s)")
    for line in OWN_BUG:
        this.feed(line)
    folded, end = this.feed("tfl: the end")  # a line of tfl's ends the held traceback
    assert "4-line TensorFlow traceback folded: a consequence of losing worker:0" in folded and end == "tfl: the end"


def test_the_console_folds_while_the_log_keeps_every_line(tmp_path: Path) -> None:
    log = tmp_path / "chief-0.log"
    log.write_text("\n".join(["epoch 1/5", *SURVIVOR, ""]))
    out = io.StringIO()
    follower = LogFollower([("chief:0", str(log))], out, hide_noise=True)
    follower.stop()
    shown = out.getvalue().splitlines()
    assert shown[0] == "[chief:0] epoch 1/5" and "folded" in shown[1] and len(shown) == 2
    assert log.read_text().count("\n") == len(SURVIVOR) + 1
    verbose = io.StringIO()
    LogFollower([("chief:0", str(log))], verbose, hide_noise=False).stop()
    assert "Traceback (most recent call last):" in verbose.getvalue()
