"""The supervisor's elastic policy (``tfl launch --min-tasks N``): which hosts are lost, the
size of the next attempt, the wait below the minimum, and taking hosts back.

A host is lost when, after a training failure:
- the backend declared it lost during the attempt (``TaskProcess.host_lost``: an SSH task
  whose connection to its host ended before the task's exit was reported);
- or it cannot be reached when the restart begins (the backend's quick probe: its ``ssh``
  check failed);
- or tasks on it failed ``blacklist_after`` attempts in a row.

The next attempt then runs without the lost hosts' tasks (``plan.resize.resize_plan``), from the
last checkpoint. Such a resize counts neither as a failure (``--max-restarts``) nor as a
preemption. When the training tasks left are fewer than ``min_tasks``, the policy waits up
to ``elastic_wait`` s, probing the lost hosts every ``probe_interval`` s, and the run fails
naming them if too few return. While the run goes on smaller, the supervisor asks
``taken_back`` each turn; every ``probe_interval`` s it probes the lost hosts, and the
supervisor gives those that answer again back to the group at an agreed checkpoint (the
preemption notice: SIGTERM, each task saves at a step they agree on, exits 170).

Probes run on the supervisor's thread: a host that does not answer holds it for up to its
``ssh.connect_timeout`` every ``probe_interval`` s (a task's exit is seen after that).

Every resize is recorded (``RunRecord.resizes``) and said on the console (``say``). Clock,
wait and the backend are the supervisor's, so the tests drive this with a fake backend.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from launcher.engines.base import Backend, TaskProcess
from launcher.engines.preflight import Check, host_tasks
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.resize import Resize, plan_hosts, resize_plan, training_size
from launcher.plan.run_options import SupervisorConfig
from launcher.records.states import RunState
from launcher.records.store import ResizeRecord, RunRecord, TaskRecord

UNREACHABLE = "ssh"  # the check a probe fails when it cannot reach a host


@dataclass(frozen=True)
class ElasticOutcome:
    """What follows a training failure in which hosts were lost: the next attempt's plan, or
    the run's end (``message``; ``stopped``: the user stopped it while it waited)."""

    plan: LaunchPlan | None
    message: str | None = None
    stopped: bool = False

    @property
    def end(self) -> tuple[RunState, int, str]:
        """How the run fails when there is no next plan: state, exit code, message (a stop ends as
        any stop does: ``Supervisor._stop``)."""
        return RunState.FAILED, 1, self.message or ""


class ElasticPolicy:
    def __init__(self, full: LaunchPlan, record: RunRecord, config: SupervisorConfig, backend: Backend, *,
                 clock: Callable[[], float], wall: Callable[[], float], wait: Callable[[float], None],
                 stopping: Callable[[], bool], say: Callable[[str], None]) -> None:
        assert config.min_tasks is not None
        self.full, self.record, self.config, self.backend = full, record, config, backend
        self.min_tasks: int = config.min_tasks
        self._clock, self._wall, self._wait, self._stopping, self._say = clock, wall, wait, stopping, say
        self._streak: dict[str, int] = {}  # host -> attempts in a row in which a task on it failed
        self._blacklist: set[str] = set()  # lost for failing: it answers probes, so it is never taken back
        self._next_probe = 0.0
        self._attempt = -1  # the attempt ``_next_probe`` belongs to
        record.min_tasks = self.min_tasks

    @property
    def lost(self) -> dict[str, str]:
        return self.record.lost_hosts

    def resumed(self) -> LaunchPlan:
        """The plan of the first attempt: the full plan, without the hosts a resumed run had lost."""
        return self._plan_without(self.lost).plan if self.lost else self.full

    def before_start(self) -> ElasticOutcome | None:
        """A resumed run whose lost hosts leave fewer than ``min_tasks`` training tasks waits for
        them before its first attempt, as below the minimum (None: start as planned)."""
        left = training_size(self.full, self.lost)
        return self._wait_for_hosts(left, {}) if left < self.min_tasks else None

    # --- after a training failure -------------------------------------------------------
    def after_failure(self, current: LaunchPlan, procs: Iterable[TaskProcess]) -> ElasticOutcome | None:
        """The group (``procs``) has stopped after a failure: the hosts lost in this attempt, and
        the next attempt's plan. None when no host is lost (the usual restart policy applies)."""
        declared = {p.launch.host: p.ended_by or "it stopped answering" for p in procs if p.unreachable_since is not None}
        newly = {h: why for h, why in declared.items() if h not in self.lost}
        newly.update({h: why for h, why in self._blacklisted(current).items() if h not in newly})
        reachable = [h for h in plan_hosts(current) if h not in newly]
        newly.update(self._unreachable(reachable))
        if not newly:
            return None
        before = training_size(self.full, self.lost)
        self.lost.update(newly)
        self._streak.clear()  # a new group: failures in a row count from here
        if training_size(self.full, self.lost) < self.min_tasks:
            return self._wait_for_hosts(before, newly)
        return ElasticOutcome(self._resize(before, "lost: " + _why(newly), sorted(newly)))

    def _blacklisted(self, current: LaunchPlan) -> dict[str, str]:
        k = self.config.blacklist_after
        failed = {f.host for f in self.record.failures if f.attempt == self.record.attempt}
        for host in plan_hosts(current):
            self._streak[host] = self._streak.get(host, 0) + 1 if host in failed else 0
        failing = {h: f"tasks on it failed {n} attempts in a row (--blacklist-after {k}; not taken back)"
                   for h, n in self._streak.items() if k and n >= k}
        self._blacklist.update(failing)
        return failing

    def _wait_for_hosts(self, before: int, newly: dict[str, str]) -> ElasticOutcome:
        """Below the minimum: probe the lost hosts until enough answer, or ``elastic_wait`` ends."""
        deadline = self._clock() + self.config.elastic_wait
        left = training_size(self.full, self.lost)
        hopeless = self._never_enough(left)
        if hopeless is not None:
            return ElasticOutcome(None, hopeless)
        what = f"lost {_why(newly)}" if newly else f"resumed without {_why(self.lost)}"
        self._say(f"tfl: {what}; {left} training task{'s' * (left != 1)} left, below --min-tasks "
                  f"{self.min_tasks}: waiting up to {self.config.elastic_wait:g} s for {', '.join(sorted(self.lost))}")
        while not self._stopping():
            back = self._answering(self._probed())
            for host in back:
                del self.lost[host]
            if training_size(self.full, self.lost) >= self.min_tasks:
                parts = ([f"lost: {_why(newly)}"] if newly else []) + ([f"back: {', '.join(back)}"] if back else [])
                reason = "; ".join(parts)
                # None newly lost: a resumed run, whose first attempt (this one) is not yet started.
                return ElasticOutcome(self._resize(before, reason, sorted({*newly, *back}), starts=not newly))
            remaining = deadline - self._clock()
            if remaining <= 0:
                left = training_size(self.full, self.lost)
                return ElasticOutcome(None, f"{left} training task{'s' * (left != 1)} left, below --min-tasks "
                                            f"{self.min_tasks}, and the lost hosts did not return within "
                                            f"{self.config.elastic_wait:g} s (--elastic-wait): {_why(self.lost)}")
            self._wait(min(self.config.probe_interval, remaining))
        return ElasticOutcome(None, "stopped by the user while waiting for lost hosts", stopped=True)

    def _never_enough(self, left: int) -> str | None:
        """Why no wait can help (None when one can): even if every lost host that may come back did,
        too few training tasks would run, since hosts lost for failing are never taken back."""
        kept_out = {h: why for h, why in self.lost.items() if h in self._blacklist}
        if not kept_out or training_size(self.full, kept_out) >= self.min_tasks:
            return None
        return (f"{left} training task{'s' * (left != 1)} left, below --min-tasks {self.min_tasks}, and no wait "
                f"brings back a host lost for failing (fix what fails there, then tfl resume the run): {_why(kept_out)}")

    # --- while running smaller ----------------------------------------------------------
    def taken_back(self) -> list[str]:
        """The lost hosts that answer again (probed every ``probe_interval`` s of an attempt), or []."""
        if self._attempt != self.record.attempt:  # a new attempt: its first probe comes one interval in
            self._attempt, self._next_probe = self.record.attempt, self._clock() + self.config.probe_interval
        if not self.lost or self._clock() < self._next_probe:
            return []
        self._next_probe = self._clock() + self.config.probe_interval
        return self._answering(self._probed())

    def grow(self, hosts: Collection[str]) -> LaunchPlan:
        """The next attempt's plan with ``hosts`` back (up to the cluster's size)."""
        before = training_size(self.full, self.lost)
        for host in hosts:
            self.lost.pop(host, None)
        self._streak.clear()
        return self._resize(before, f"back: {', '.join(sorted(hosts))} answer{'s' * (len(hosts) == 1)} again "
                                    "(taken back at an agreed checkpoint)", sorted(hosts))

    # --- shared ---------------------------------------------------------------------------
    def _resize(self, before: int, reason: str, hosts: list[str], starts: bool = False) -> LaunchPlan:
        """``starts``: the record's attempt is the one this plan runs (a resume's first), not the one before it."""
        resize = self._plan_without(self.lost)
        notes = [*resize.notes, *_evaluator_home(self.full, resize, self.record)]
        self.record.resizes.append(ResizeRecord(
            attempt=self.record.attempt + (0 if starts else 1), time=self._wall(), from_tasks=before, to_tasks=resize.training_size,
            reason=reason, hosts=hosts, notes=notes))
        self.record.tasks = _task_records(resize, self.record)
        self._say(f"tfl: resize: {before} -> {resize.training_size} training tasks; {reason}"
                  + "".join(f"; {note}" for note in notes))
        return resize.plan

    def _plan_without(self, lost: Collection[str]) -> Resize:
        return resize_plan(self.full, lost, self.config.evaluator_moves_to)

    def _probe(self, hosts: Collection[str]) -> list[Check]:
        tasks = tuple(t for t in self.full.tasks if t.host in hosts)
        if not tasks:
            return []
        return self.backend.probe(host_tasks(dataclasses.replace(self.full, tasks=tasks)), quick=True)

    def _unreachable(self, hosts: list[str]) -> dict[str, str]:
        checks = self._probe(hosts) if hosts else []
        return {c.host: f"unreachable: {c.detail}" for c in checks if c.name == UNREACHABLE and c.status == "fail"}

    def _probed(self) -> list[str]:
        """The lost hosts worth probing: not those lost for failing (they answer, and would fail again)."""
        return [h for h in self.lost if h not in self._blacklist]

    def _answering(self, hosts: list[str]) -> list[str]:
        """The ``hosts`` that pass every quick check again (reached, python, their ports free)."""
        if not hosts:
            return []
        failing = {c.host for c in self._probe(hosts) if c.status == "fail"}
        return [h for h in sorted(hosts) if h not in failing]


def _why(hosts: dict[str, str]) -> str:
    return ", ".join(f"{h} ({why})" for h, why in sorted(hosts.items()))


def _evaluator_home(full: LaunchPlan, resize: Resize, record: RunRecord) -> list[str]:
    """A note when the evaluator, moved while its host was lost, goes back to it (the host is back)."""
    home = next((t for t in full.tasks if not t.task.is_training), None)
    now = next((t for t in resize.plan.tasks if not t.task.is_training), None)
    was = next((t.host for t in record.tasks if home is not None and t.task == home.name), None)
    if home is None or now is None or now.host != home.host or was in (None, home.host):
        return []
    return [f"{now.name} moves back to {now.host}:{now.port}"]


def _task_records(resize: Resize, record: RunRecord) -> list[TaskRecord]:
    """The record's tasks for the resized plan: fresh entries, the backend's name kept."""
    return [TaskRecord(task=t.name, host=t.host, backend=record.backend, log_path=t.log_path,
                       progress_path=t.progress_path) for t in resize.plan.tasks]
