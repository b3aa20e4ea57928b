"""Preemptions in the supervisor's state machine: scripted backend, fake clock (no processes).

A training task that exits PREEMPTED_EXIT_CODE saved the agreed checkpoint: the group is
restarted without counting against --max-restarts, up to --max-preemptions times.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from launcher.contract import LEFT_UNSAVED_PHASE, PREEMPTED_EXIT_CODE, PREEMPTED_PHASE
from launcher.engines.registry import TaskProcess
from launcher.records.states import RunState, TaskState
from launcher.supervise.supervisor import Supervisor
from launcher.views.report import summary
from tests.test_supervisor import FakeBackend, make, states

P = PREEMPTED_EXIT_CODE


class SavesOnNotice(FakeBackend):
    """Its tasks save and exit PREEMPTED_EXIT_CODE on SIGTERM, as the job kit's do."""

    def signal(self, proc: TaskProcess, signum: int) -> None:
        if signum == signal.SIGTERM and self.poll(proc) is None and proc.launch.task.is_training:
            self.signals.append((proc.launch.name, signum, self.clock.now))
            self._dead[proc.pid] = P
            return
        super().signal(proc, signum)


def agreed(sup: Supervisor, task: str, step: int) -> None:
    """The kit's last progress record of a preempted task."""
    path = Path(sup.record.task(task).progress_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"task": task, "phase": PREEMPTED_PHASE, "global_step": step, "epoch": 2, "epochs": 4}))


def test_a_preempted_group_restarts_without_counting_against_max_restarts(tmp_path: Path) -> None:
    sup, backend, clock, store = make(tmp_path, lambda c: FakeBackend(c, {
        "chief:0": [(5.2, P), (3, 0)], "worker:0": [(5, P), (3, 0)], "evaluator:0": [None, (4, 0)]}), max_restarts=0)
    agreed(sup, "worker:0", 40)
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and record.exit_code == 0 and record.attempt == 1
    assert [(r.kind, r.reason) for r in record.restarts] == [
        ("preemption", "worker:0 on localhost: preempted: saved the agreed checkpoint at step 40")]
    # The chief left on its own within the wait: only the evaluator was stopped.
    assert [(n, s) for n, s, _ in backend.signals] == [("evaluator:0", signal.SIGTERM)]
    first = [f for f in record.failures if f.attempt == 0]
    assert {(f.task, f.exit_code) for f in first} == {("worker:0", P), ("chief:0", P)}
    assert "1 restart(s): 1 after a preemption" in summary(store.load("r"))


def test_peers_that_do_not_leave_get_the_grace_then_the_usual_teardown(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: FakeBackend(c, {"worker:0": [(5, P), (2, 0)], "chief:0": [None, (2, 0)]},
                                                            ignores_term=frozenset({"chief:0"})),
                              evaluator=False, grace_period=10.0)
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and [r.kind for r in record.restarts] == ["preemption"]
    chief = [(s, t) for n, s, t in backend.signals if n == "chief:0"]
    # Waited the grace for the chief to save and leave, then SIGTERM, the grace again, SIGKILL.
    assert [s for s, _ in chief] == [signal.SIGTERM, signal.SIGKILL]
    assert 15 - 0.1 <= chief[0][1] <= 15 + 0.6 and chief[1][1] - chief[0][1] >= 10 - 0.1
    assert sup.record.failures[0].reason == "preempted: saved the agreed checkpoint"  # no progress record: no step


def test_max_preemptions_caps_the_preemption_restarts(tmp_path: Path) -> None:
    sup, backend, _, store = make(tmp_path, lambda c: FakeBackend(c, {"chief:0": [(1, P)] * 4, "worker:0": [(1, P)] * 4}),
                                  evaluator=False, max_restarts=5, max_preemptions=2)
    record = sup.run()
    assert record.state == RunState.PREEMPTED and record.exit_code == P and record.attempt == 2
    assert [r.kind for r in record.restarts] == ["preemption", "preemption"]
    assert "no preemption restart left (--max-preemptions 2)" in (record.message or "")
    assert states(sup) == {"chief:0": TaskState.PREEMPTED, "worker:0": TaskState.PREEMPTED}
    # The summary promises the agreed checkpoint where the model dir holds it (no process wrote one here).
    assert "resume it from its last checkpoint, if the job kept one" in summary(store.load("r"))
    (tmp_path / "runs" / "r" / "model").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "model" / "preempted.json").write_text("{}")  # what the kit writes with its save
    assert "resume it from its last checkpoint: tfl resume r" in summary(store.load("r"))


def test_a_failure_during_the_agreement_counts_as_a_failure(tmp_path: Path) -> None:
    sup, _, _, store = make(tmp_path, lambda c: FakeBackend(c, {"worker:0": [(2, P)], "chief:0": [(2.5, 1)]}),
                            evaluator=False, max_restarts=0, max_preemptions=10)
    record = sup.run()
    assert record.state == RunState.FAILED and record.restarts == []
    assert record.message == "chief:0 on localhost failed: exit code 1"
    text = summary(store.load("r"))
    assert "root cause: chief:0 on localhost" in text and "exit code 1" in text


def test_mixed_failure_and_preemption_are_counted_apart(tmp_path: Path) -> None:
    sup, _, _, _ = make(tmp_path, lambda c: FakeBackend(c, {
        "worker:0": [(2, P), (2, 3), (2, P), (2, 0)], "chief:0": [(2.1, P), None, (2.1, P), (2, 0)]}),
        evaluator=False, max_restarts=1, max_preemptions=2)
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and record.attempt == 3
    assert [r.kind for r in record.restarts] == ["preemption", "failure", "preemption"]


def test_a_bare_sigterm_without_saving_stays_a_failure(tmp_path: Path) -> None:
    sup, _, _, _ = make(tmp_path, lambda c: FakeBackend(c, {"worker:0": [(2, -signal.SIGTERM)]}), evaluator=False)
    record = sup.run()
    assert record.state == RunState.FAILED and record.restarts == []
    assert record.task("worker:0").state == TaskState.FAILED and "killed by SIGTERM" in (record.message or "")


class NoticeAt(SavesOnNotice):
    """At t=3 the launcher gets its SIGTERM (``request_stop(notice=True)``); ``ignores_notice``
    tasks neither save nor leave on SIGTERM."""

    sup: Supervisor | None = None
    ignores_notice: frozenset[str] = frozenset()

    def poll(self, proc: TaskProcess) -> int | None:
        if self.clock.now > 3 and self.sup is not None and not self.sup._stop_requested:  # type: ignore[attr-defined]
            self.sup.request_stop(notice=True)
        return super().poll(proc)

    def signal(self, proc: TaskProcess, signum: int) -> None:
        if proc.launch.name in self.ignores_notice and signum == signal.SIGTERM:
            self.signals.append((proc.launch.name, signum, self.clock.now))
            return
        super().signal(proc, signum)


@pytest.mark.parametrize("asked_by_tfl_stop", [False, True])
def test_the_launchers_own_sigterm_is_a_preemption_and_tfl_stop_is_not(tmp_path: Path, asked_by_tfl_stop: bool) -> None:
    sup, backend, _, store = make(tmp_path, lambda c: NoticeAt(c, {}), max_restarts=3)
    backend.sup = sup  # type: ignore[attr-defined]
    agreed(sup, "chief:0", 17)
    if asked_by_tfl_stop:
        store.request_stop(sup.record)
    record = sup.run()
    assert states(sup) == {"chief:0": TaskState.PREEMPTED, "worker:0": TaskState.PREEMPTED,
                           "evaluator:0": TaskState.STOPPED}
    assert record.restarts == [] and all(s == signal.SIGTERM for _, s, _ in backend.signals)
    if asked_by_tfl_stop:
        assert (record.state, record.exit_code) == (RunState.STOPPED, 130)
        assert record.message == "stopped by the user; every training task saved the agreed checkpoint at step 17"
    else:
        assert (record.state, record.exit_code) == (RunState.PREEMPTED, P)
        assert record.message == "preempted: tfl got SIGTERM; every training task saved the agreed checkpoint at step 17"


def test_a_stop_where_only_some_saved_says_so(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: NoticeAt(c, {}), evaluator=False, grace_period=4.0)
    backend.sup, backend.ignores_notice = sup, frozenset({"worker:0"})  # type: ignore[attr-defined]
    agreed(sup, "chief:0", 9)
    record = sup.run()
    assert record.state == RunState.PREEMPTED
    assert states(sup) == {"chief:0": TaskState.PREEMPTED, "worker:0": TaskState.STOPPED}
    assert record.message == ("preempted: tfl got SIGTERM; 1 of 2 training tasks saved the agreed checkpoint at step 9, "
                              "the others not within the 4 s grace (--grace-period)")


def test_a_stop_during_the_agreement_decides_how_the_run_ends(tmp_path: Path) -> None:
    sup, backend, _, _ = make(tmp_path, lambda c: NoticeAt(c, {"worker:0": [(2, P)]}), evaluator=False, max_preemptions=5)
    backend.sup = sup  # type: ignore[attr-defined]  # the launcher's SIGTERM at t=3, while the chief is awaited
    record = sup.run()
    assert record.state == RunState.PREEMPTED and record.restarts == []
    assert record.message == "preempted: tfl got SIGTERM; every training task saved the agreed checkpoint"
    assert [(n, s) for n, s, _ in backend.signals] == [("chief:0", signal.SIGTERM)]


def test_a_stop_before_training_does_not_claim_the_agreed_checkpoint(tmp_path: Path) -> None:
    # Every task left with 170 before its first step (the kit's record says so): nothing was saved.
    sup, backend, _, store = make(tmp_path, lambda c: NoticeAt(c, {}), evaluator=False)
    backend.sup = sup  # type: ignore[attr-defined]
    for task in ("chief:0", "worker:0"):
        path = Path(sup.record.task(task).progress_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"task": task, "attempt": 0, "phase": LEFT_UNSAVED_PHASE, "global_step": 40}))
    store.request_stop(sup.record)
    record = sup.run()
    assert record.state == RunState.STOPPED
    assert record.message == ("stopped by the user; every training task left on the notice without saving (before "
                              "training, or with the epoch length unknown); the last backup stays")
    assert "saved the agreed checkpoint" not in summary(store.load("r"))
