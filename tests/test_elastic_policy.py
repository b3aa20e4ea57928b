"""The supervisor's elastic policy, driven by a scripted backend whose hosts go down and come
back on a fake clock: every branch (declared lost, unreachable at restart, blacklisted, below
the minimum on each side of the wait, taken back, stopped while waiting)."""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from launcher.contract import PREEMPTED_EXIT_CODE, TEARDOWN_SIGNAL
from launcher.describe.spec import parse_cluster
from launcher.engines.preflight import Check, HostTasks
from launcher.engines.registry import TaskProcess
from launcher.plan.build import build_plan
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.resize import resize_plan
from launcher.plan.run_options import SupervisorConfig
from launcher.records.states import RunState
from launcher.records.store import RunStore
from launcher.supervise.supervisor import Supervisor, initial_record
from launcher.views.report import run_detail, summary
from launcher.views.status import run_view
from tests.test_supervisor import FakeClock

THREE = {"chief": ["h0:1000"], "worker": ["h1:1001", "h2:1002"]}


@dataclass
class Hosts:
    """A scripted cluster: each host is down over [since, until) of the fake clock; each
    attempt's training ends (exit 0) ``train_for`` s after it starts; ``fails`` makes every task
    on a host exit 1 after 1 s in the attempts listed."""

    clock: FakeClock
    down: dict[str, tuple[float, float]] = field(default_factory=dict)
    train_for: float = 100.0
    fails: dict[str, set[int]] = field(default_factory=dict)
    declares: bool = True  # the backend tells a lost host's tasks (False: they just fail, or hang)
    concurrent_start = False

    def __post_init__(self) -> None:
        self.started: list[tuple[int, str, str, dict[str, object]]] = []  # attempt, task, host, TF_CONFIG
        self.probes: list[tuple[float, list[str]]] = []
        self.signals: list[tuple[str, int]] = []
        self._dead: dict[int, int] = {}
        self._start: dict[int, float] = {}
        self._pid = 100

    def is_down(self, host: str) -> bool:
        since, until = self.down.get(host, (float("inf"), 0.0))
        return since <= self.clock.now < until

    def probe(self, hosts: list[HostTasks], *, quick: bool) -> list[Check]:
        self.probes.append((self.clock.now, [h.host for h in hosts]))
        return [Check(h.host, "ssh", "fail", "timed out") if self.is_down(h.host) else Check(h.host, "ssh", "ok", "reached")
                for h in hosts]

    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        self._pid += 1
        self._start[self._pid] = self.clock.now
        self.started.append((attempt, launch.name, launch.host, json.loads(launch.env["TF_CONFIG"])))
        return TaskProcess(launch=launch, attempt=attempt, pid=self._pid, create_time=1.0, pgid=self._pid)

    def poll(self, proc: TaskProcess) -> int | None:
        assert proc.pid is not None
        if proc.pid in self._dead:
            return self._dead[proc.pid]
        host, ran = proc.launch.host, self.clock.now - self._start[proc.pid]
        if self.is_down(host) and self.declares:  # what the backend's detection says (net: within seconds)
            proc.unreachable_since, proc.ended_by = self.down[host][0], f"{host} stopped answering"
            self._dead[proc.pid] = 255
        elif proc.attempt in self.fails.get(host, set()) and ran >= 1:
            self._dead[proc.pid] = 1
        elif ran >= self.train_for:
            self._dead[proc.pid] = 0
        return self._dead.get(proc.pid)

    def signal(self, proc: TaskProcess, signum: int) -> None:
        assert proc.pid is not None
        self.signals.append((proc.launch.name, signum))
        if self.poll(proc) is None:  # the notice: each task saves at the agreed step and leaves
            self._dead[proc.pid] = PREEMPTED_EXIT_CODE if signum == signal.SIGTERM else -signum

    def alive(self, proc: TaskProcess) -> bool:
        return self.poll(proc) is None

    def close(self) -> None:
        pass

    def attempts(self) -> dict[int, list[tuple[str, str]]]:
        out: dict[int, list[tuple[str, str]]] = {}
        for attempt, name, host, _ in self.started:
            out.setdefault(attempt, []).append((name, host))
        return out


def make(tmp_path: Path, hosts_of: type[Hosts] = Hosts, cluster: dict[str, list[str]] = THREE, *,
         script: dict[str, object] | None = None, stop_at: float | None = None, lost: dict[str, str] | None = None,
         **config: object) -> tuple[Supervisor, Hosts, FakeClock, list[str]]:
    """``stop_at``: the user stops the run (Ctrl-C) once the clock passes that time."""
    store = RunStore(tmp_path)
    plan: LaunchPlan = build_plan(parse_cluster({"cluster": cluster}), "/job.py", (), run_id="r",
                                  run_dir=str(tmp_path / "runs" / "r"), python="py", cwd="/")
    record = initial_record(plan, created=0.0, max_restarts=0, backend="fake")
    if lost:  # a resumed run that had lost these hosts (its record says so; its tasks are the resized plan's)
        record.lost_hosts, record.tasks = dict(lost), initial_record(resize_plan(plan, lost).plan, 0.0, 0, "fake").tasks
    store.create(record)
    clock = FakeClock()
    hosts = hosts_of(clock, **(script or {}))  # type: ignore[arg-type]
    said: list[str] = []
    settings = {"min_tasks": 2, "probe_interval": 5.0, "elastic_wait": 60.0, "grace_period": 3.0, **config}
    sup: Supervisor

    def wait(seconds: float) -> None:
        clock.sleep(seconds)
        if stop_at is not None and clock.now > stop_at:
            sup.request_stop()

    sup = Supervisor(plan, record, store, SupervisorConfig(**settings), backend=hosts,  # type: ignore[arg-type]
                     clock=clock, wall=clock, wait=wait, say=said.append)
    return sup, hosts, clock, said


def test_a_worker_host_lost_mid_run_the_run_goes_on_with_two_and_ends_0(tmp_path: Path) -> None:
    sup, hosts, clock, said = make(tmp_path, script={"down": {"h2": (10.0, 1e9)}})
    record = sup.run()
    assert record.state == RunState.SUCCEEDED and record.exit_code == 0
    assert hosts.attempts() == {0: [("chief:0", "h0"), ("worker:0", "h1"), ("worker:1", "h2")],
                                1: [("chief:0", "h0"), ("worker:0", "h1")]}
    assert hosts.started[-1][3] == {"cluster": {"chief": ["h0:1000"], "worker": ["h1:1001"]},
                                    "task": {"type": "worker", "index": 0}}
    assert record.restarts == []  # a resize is no restart (nor a preemption)
    (resize,) = record.resizes
    assert (resize.attempt, resize.from_tasks, resize.to_tasks, resize.hosts) == (1, 3, 2, ["h2"])
    assert resize.reason == "lost: h2 (h2 stopped answering)"
    assert record.lost_hosts == {"h2": "h2 stopped answering"} and record.min_tasks == 2
    assert [t.task for t in record.tasks] == ["chief:0", "worker:0"]
    assert said[0] == "tfl: resize: 3 -> 2 training tasks; lost: h2 (h2 stopped answering)"
    assert "  resize at attempt 1: 3 -> 2 training tasks; lost: h2 (h2 stopped answering)" in summary(record)
    # The lost host is probed every 5 s while the run goes on without it.
    later = [t for t, probed in hosts.probes if probed == ["h2"]]
    assert len(later) >= 10 and all(b - a == pytest.approx(5.0, abs=0.6) for a, b in zip(later, later[1:], strict=False))


def test_the_chiefs_host_lost_a_worker_becomes_chief(tmp_path: Path) -> None:
    sup, hosts, _, said = make(tmp_path, script={"down": {"h0": (10.0, 1e9)}})
    record = sup.run()
    assert record.exit_code == 0 and hosts.attempts()[1] == [("chief:0", "h1"), ("worker:0", "h2")]
    assert hosts.started[-2][3] == {"cluster": {"chief": ["h1:1001"], "worker": ["h2:1002"]},
                                    "task": {"type": "chief", "index": 0}}
    assert record.resizes[0].notes == ["worker:0 on h1 is now chief:0", "worker:1 on h2 is now worker:0"]
    assert said[0].endswith("; worker:0 on h1 is now chief:0; worker:1 on h2 is now worker:0")


def test_a_host_unreachable_when_the_restart_begins_is_left_out(tmp_path: Path) -> None:
    """Its task failed with exit 1 (nothing said the host was lost); the probe at the restart
    cannot reach it: the next attempt runs without it, and no restart was spent."""
    sup, hosts, _, _ = make(tmp_path, script={"fails": {"h2": {0}}, "down": {"h2": (0.5, 1e9)},
                                                      "declares": False})
    record = sup.run()
    assert record.exit_code == 0 and hosts.attempts()[1] == [("chief:0", "h0"), ("worker:0", "h1")]
    assert record.resizes[0].reason == "lost: h2 (unreachable: timed out)" and record.restarts == []


def test_a_host_whose_tasks_fail_k_attempts_in_a_row_is_blacklisted(tmp_path: Path) -> None:
    sup, hosts, _, _ = make(tmp_path, script={"fails": {"h1": {0, 1}}}, max_restarts=1)
    record = sup.run()
    assert record.exit_code == 0
    assert [len(hosts.attempts()[a]) for a in (0, 1, 2)] == [3, 3, 2]  # a counted restart first, then the resize
    assert len(record.restarts) == 1 and record.restarts[0].attempt == 1
    assert record.resizes[0].reason == ("lost: h1 (tasks on it failed 2 attempts in a row (--blacklist-after 2; "
                                        "not taken back))")
    assert hosts.attempts()[2] == [("chief:0", "h0"), ("worker:0", "h2")] and len(hosts.attempts()) == 3
    assert all("h1" not in probed for _, probed in hosts.probes[2:])  # it answers, but it is never probed to come back


def test_blacklisting_off_the_failures_spend_the_restarts(tmp_path: Path) -> None:
    sup, hosts, _, _ = make(tmp_path, script={"fails": {"h1": {0, 1}}}, max_restarts=1, blacklist_after=0)
    record = sup.run()
    assert record.state == RunState.FAILED and record.resizes == [] and len(hosts.attempts()) == 2


def test_below_the_minimum_it_waits_then_fails_naming_the_hosts(tmp_path: Path) -> None:
    sup, hosts, clock, said = make(tmp_path, script={"down": {"h2": (10.0, 1e9)}}, min_tasks=3, elastic_wait=60.0)
    record = sup.run()
    assert record.state == RunState.FAILED and record.exit_code == 1
    assert record.message == ("2 training tasks left, below --min-tasks 3, and the lost hosts did not return within "
                              "60 s (--elastic-wait): h2 (h2 stopped answering)")
    assert clock.now >= 70 and len(hosts.attempts()) == 1  # it waited, and started nothing meanwhile
    waiting = [t for t, probed in hosts.probes if probed == ["h2"]]
    assert len(waiting) >= 12 and waiting[-1] >= 69  # probed every 5 s to the end of the wait
    assert said == ["tfl: lost h2 (h2 stopped answering); 2 training tasks left, below --min-tasks 3: waiting up to "
                    "60 s for h2"]


def test_below_the_minimum_a_host_back_within_the_wait_goes_on_at_full_size(tmp_path: Path) -> None:
    sup, hosts, clock, _ = make(tmp_path, script={"down": {"h2": (10.0, 40.0)}}, min_tasks=3, elastic_wait=60.0)
    record = sup.run()
    assert record.exit_code == 0 and clock.now < 200
    assert hosts.attempts()[1] == [("chief:0", "h0"), ("worker:0", "h1"), ("worker:1", "h2")]
    (resize,) = record.resizes
    assert (resize.from_tasks, resize.to_tasks) == (3, 3) and record.lost_hosts == {}
    assert resize.reason == "lost: h2 (h2 stopped answering); back: h2"
    assert record.tasks[0].started is not None and record.tasks[0].started >= 40


def test_a_lost_host_that_answers_again_is_taken_back_at_an_agreed_checkpoint(tmp_path: Path) -> None:
    sup, hosts, clock, said = make(tmp_path, script={"down": {"h2": (10.0, 30.0)}})
    record = sup.run()
    assert record.exit_code == 0
    assert [len(hosts.attempts()[a]) for a in (0, 1, 2)] == [3, 2, 3]
    assert [(r.from_tasks, r.to_tasks, r.hosts) for r in record.resizes] == [(3, 2, ["h2"]), (2, 3, ["h2"])]
    assert record.resizes[1].reason == "back: h2 answers again (taken back at an agreed checkpoint)"
    # The notice (SIGTERM) went to the two that ran; nothing was killed, nothing counted as a restart. The
    # loss before was a failure: its survivors got the teardown signal, not a notice (no agreement without h2).
    assert hosts.signals[-2:] == [("chief:0", signal.SIGTERM), ("worker:0", signal.SIGTERM)]
    assert {sig for _, sig in hosts.signals[:-2]} == {signal.Signals[TEARDOWN_SIGNAL]}
    assert record.restarts == [] and record.lost_hosts == {}
    assert [f.attempt for f in record.failures] == [0]  # only the lost task: the notice's exit 170 is no failure
    assert said[1] == "tfl: resize: 2 -> 3 training tasks; back: h2 answers again (taken back at an agreed checkpoint)"
    assert hosts.started[-1][3]["cluster"] == THREE


def test_a_stop_while_waiting_for_hosts_ends_the_run_stopped(tmp_path: Path) -> None:
    sup, hosts, clock, _ = make(tmp_path, script={"down": {"h2": (10.0, 1e9)}}, min_tasks=3, elastic_wait=600.0,
                                stop_at=30.0)
    record = sup.run()
    assert record.state == RunState.STOPPED and record.exit_code == 130 and clock.now < 100
    assert record.message == "stopped by the user while waiting for lost hosts" and len(hosts.attempts()) == 1


def test_status_shows_the_size_the_lost_hosts_and_the_history(tmp_path: Path) -> None:
    sup, _, _, _ = make(tmp_path, script={"down": {"h2": (10.0, 1e9)}})
    sup.run()
    record = RunStore(tmp_path).load("r")  # as saved: the record round-trips
    view = run_view(record)
    assert (view.min_tasks, view.training_tasks, view.full_training_tasks) == (2, 2, 3)
    assert view.lost_hosts == {"h2": "h2 stopped answering"}
    assert [(r["from_tasks"], r["to_tasks"], r["hosts"]) for r in view.to_dict()["resizes"]] == [(3, 2, ["h2"])]
    text = run_detail(view)
    assert "  elastic: 2 of 3 training tasks (--min-tasks 2); lost: h2 (h2 stopped answering)" in text
    assert "  resize at attempt 1: 3 -> 2 tasks; lost: h2 (h2 stopped answering)" in text


def test_a_fixed_size_run_still_ends_when_a_host_is_lost(tmp_path: Path) -> None:
    sup, hosts, _, said = make(tmp_path, script={"down": {"h2": (10.0, 1e9)}}, min_tasks=None, max_restarts=3)
    record = sup.run()
    assert record.state == RunState.FAILED and "no restart on a host known lost" in (record.message or "")
    assert len(hosts.attempts()) == 1 and record.resizes == [] and said == [] and record.min_tasks is None


def test_a_resumed_run_starts_without_the_hosts_it_had_lost_and_takes_them_back(tmp_path: Path) -> None:
    sup, hosts, _, _ = make(tmp_path, lost={"h0": "h0 stopped answering"})
    record = sup.run()
    assert record.exit_code == 0
    assert hosts.attempts()[0] == [("chief:0", "h1"), ("worker:0", "h2")]  # as it was when it stopped
    assert hosts.attempts()[1] == [("chief:0", "h0"), ("worker:0", "h1"), ("worker:1", "h2")]  # h0 answers: back
    assert [(r.from_tasks, r.to_tasks, r.hosts) for r in record.resizes] == [(2, 3, ["h0"])]


def test_below_the_minimum_with_only_failing_hosts_lost_it_ends_at_once(tmp_path: Path) -> None:
    # h1 fails twice: blacklisted, never probed to come back, so waiting up to --elastic-wait could not help.
    sup, hosts, clock, said = make(tmp_path, script={"fails": {"h1": {0, 1}}}, max_restarts=1, min_tasks=3,
                                   elastic_wait=600.0)
    record = sup.run()
    assert record.state == RunState.FAILED and record.exit_code == 1
    assert clock.now < 60 and len(hosts.attempts()) == 2  # not the 600 s wait
    assert record.message == ("2 training tasks left, below --min-tasks 3, and no wait brings back a host lost for "
                              "failing (fix what fails there, then tfl resume the run): h1 (tasks on it failed 2 "
                              "attempts in a row (--blacklist-after 2; not taken back))")
    assert not any("waiting up to" in line for line in said)


def test_a_resumed_run_below_the_minimum_takes_back_the_hosts_that_answer_before_it_starts(tmp_path: Path) -> None:
    sup, hosts, _, said = make(tmp_path, lost={"h1": "h1 stopped answering", "h2": "h2 stopped answering"})
    record = sup.run()
    assert record.exit_code == 0
    # Not one task alone (below --min-tasks 2): the first attempt waits for the hosts, which answer at once.
    assert hosts.attempts() == {0: [("chief:0", "h0"), ("worker:0", "h1"), ("worker:1", "h2")]}
    assert [(r.attempt, r.from_tasks, r.to_tasks, r.reason) for r in record.resizes] == [(0, 1, 3, "back: h1, h2")]
    assert said[0].startswith("tfl: resumed without h1 (h1 stopped answering), h2 (h2 stopped answering); 1 "
                              "training task left, below --min-tasks 2: waiting up to 60 s")


def test_a_resumed_run_whose_every_host_is_lost_and_silent_fails_and_runs_nothing(tmp_path: Path) -> None:
    one_host = {"chief": ["h0:1000"], "worker": ["h0:1001", "h0:1002"]}
    sup, hosts, clock, _ = make(tmp_path, cluster=one_host, script={"down": {"h0": (0.0, 1e9)}},
                                lost={"h0": "h0 stopped answering"})
    record = sup.run()
    assert record.state == RunState.FAILED and record.exit_code == 1 and hosts.started == []
    assert record.message == ("0 training tasks left, below --min-tasks 2, and the lost hosts did not return within "
                              "60 s (--elastic-wait): h0 (h0 stopped answering)")
    assert clock.now >= 60


def test_status_while_waiting_below_the_minimum_counts_without_the_lost_host_and_says_it_waits(tmp_path: Path) -> None:
    """A second terminal's `tfl status RUN` during the wait said `elastic: 3 of 3 training tasks` and nothing of it."""
    sup, _, clock, _ = make(tmp_path, script={"down": {"h2": (10.0, 1e9)}}, min_tasks=3, elastic_wait=60.0)
    seen: list[str] = []
    sleep = clock.sleep

    def look(seconds: float) -> None:  # mid-wait, the record as `tfl status` reads it
        sleep(seconds)
        if 30 < clock.now and not seen:
            saved = RunStore(tmp_path).load("r")
            saved.backend = "local"  # a backend the view can ask (it finds none of the fake's pids)
            seen.append(run_detail(run_view(saved)))

    clock.sleep = look  # type: ignore[method-assign]
    record = sup.run()
    assert "  elastic: 2 of 3 training tasks (--min-tasks 3); lost: h2 (h2 stopped answering); below the minimum: " \
           "waiting for lost hosts to return (--elastic-wait)" in seen[0].splitlines()
    ended = run_detail(run_view(record))
    assert "  elastic: 2 of 3 training tasks (--min-tasks 3); lost: h2 (h2 stopped answering)" in ended.splitlines()


@pytest.mark.parametrize(("by_tfl_stop", "state", "code"), [(True, RunState.STOPPED, 130),
                                                              (False, RunState.PREEMPTED, PREEMPTED_EXIT_CODE)])
def test_a_sigterm_while_waiting_for_hosts_ends_as_any_stop(tmp_path: Path, by_tfl_stop: bool, state: RunState,
                                                            code: int) -> None:
    """The machine's SIGTERM (no `tfl stop`) during the wait below the minimum ended the run `stopped by the
    user`, 130, where everywhere else it ends preempted, 170, to be resumed."""
    sup, _, clock, _ = make(tmp_path, script={"down": {"h2": (10.0, 1e9)}}, min_tasks=3, elastic_wait=600.0)
    store, sleep = RunStore(tmp_path), clock.sleep

    def sigterm_at_30(seconds: float) -> None:
        sleep(seconds)
        if clock.now > 30:
            if by_tfl_stop:
                store.request_stop(sup.record)
            sup.request_stop(notice=True)

    clock.sleep = sigterm_at_30  # type: ignore[method-assign]
    record = sup.run()
    assert (record.state, record.exit_code) == (state, code) and clock.now < 100
    assert record.message == ("stopped by the user" if by_tfl_stop else "preempted: tfl got SIGTERM") + \
        " while waiting for lost hosts"
