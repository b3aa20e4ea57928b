"""The one interface every backend implements, for the whole life of a run.

A backend owns the *mechanism* of running a plan's tasks somewhere: reaching the hosts,
starting, polling and signalling tasks, and later, from any terminal, looking at and
stopping what a recorded run left running. *Policy* (restarts, fail-fast, stalls) is the
supervisor's; *judging* host facts is ``launcher.engines.preflight``'s; rendering is the CLI's.
Commands call this interface and never ask which backend they hold.

Logs are not part of it: every backend delivers each task's output into the task's
``log_path`` on this machine (local tasks write it, SSH agents relay it), so ``tfl logs``
reads files whatever ran the tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from launcher.engines.preflight import Check, HostTasks
    from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
    from launcher.records.store import RunRecord


@dataclass
class TaskProcess:
    """A started task: enough to poll it, signal its process group and record it."""

    launch: TaskLaunch
    attempt: int
    pid: int | None  # None until the backend knows it (a Slurm task before its node has started it)
    create_time: float | None
    pgid: int | None
    handle: Any = field(default=None, repr=False)  # backend-private (a Popen, a channel…)
    start_ticks: int | None = None  # clock ticks since boot at its start, on its host (``records.identity.start_ticks``)
    # Filled in by ``poll`` where a backend learns them only later; the supervisor records them.
    host: str | None = None  # where the task runs, when that is known only once it runs (Slurm: its node)
    ended_by: str | None = None  # why it ended, when its exit code does not say (a Slurm job's NODE_FAIL, TIMEOUT…)
    unit_ended: bool = False  # ``ended_by`` is the run's: its whole unit ended under every task (a Slurm job scancelled)
    unreachable_since: float | None = None  # its host stopped answering then (wall time): it is lost, and so is the host


NO_ANSWER = "no answer"  # a TaskLive state: its host was asked and had not answered when status stopped waiting


@dataclass
class TaskLive:
    """What a recorded task looks like on its host now (``tfl status``)."""

    alive: bool
    state: str | None = None  # overrides the recorded state: "gone" (vanished), "unreachable", NO_ANSWER
    cpu_percent: float | None = None
    rss_mb: float | None = None
    uptime_s: float | None = None
    host: str | None = None  # where it runs, when the record does not say yet (a Slurm task's node)
    source: str | None = None  # "launcher": what the run's live launcher knows, its hosts not asked (SSH, many hosts)


@dataclass
class Cleanup:
    """What ``clean_recorded`` did on the run's hosts (not on this machine: the run store
    removes the run's own directory here)."""

    removed: list[str] = field(default_factory=list)  # "host:/path" of each directory removed
    left: list[str] = field(default_factory=list)  # what could not be removed, each with why
    bytes_freed: int = 0
    kept: list[str] = field(default_factory=list)  # the run's shared model dirs a host sees, never removed


@dataclass
class Stopped:
    """What ``stop_recorded`` did: how many of the run's processes it found alive and stopped,
    and the hosts it could not ask (each ``"host: why; what becomes of its tasks"``)."""

    alive: int = 0
    unreached: list[str] = field(default_factory=list)


class Backend(Protocol):
    name: str  # as recorded in the run's record; ``launcher.engines.registry.get(name)`` makes one
    # True when ``start`` is mostly waiting (a round trip to a host): the supervisor then
    # starts the group's tasks at once, from threads. A local fork is quicker one by one.
    concurrent_start: bool

    # --- before a run ---------------------------------------------------------------------
    def probe(self, hosts: Sequence[HostTasks], *, quick: bool) -> list[Check]:
        """Gather each host's facts on a connection of its own and judge them (``engines.preflight.judge``).
        ``quick``: python and ports only, what a launch needs; else everything ``tfl doctor`` shows."""
        ...

    def prepare(self, plan: LaunchPlan) -> list[Check]:
        """Get every host ready to start the plan's tasks (reach it, quick checks, ship the
        code) and return the checks; when one failed, nothing was shipped and nothing runs."""
        ...

    def resolve(self, plan: LaunchPlan) -> LaunchPlan:
        """The prepared plan with what only its hosts could tell filled in (a remote host's
        per-user dir, ``hosts.HOST_CACHE``): the plan that runs and is recorded."""
        ...

    # --- a live run -----------------------------------------------------------------------
    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        """Start the task in its own process group; output goes to ``launch.log_path``.

        Raises ``LaunchError`` when it cannot be started. Calls the ``notify`` given at
        construction whenever one of its tasks may have exited.
        """
        ...

    def poll(self, proc: TaskProcess) -> int | None:
        """Exit code (negative: killed by that signal) once the task has exited, else None."""
        ...

    def signal(self, proc: TaskProcess, signum: int) -> None:
        """Send ``signum`` to the task's whole process group; a group already gone is fine."""
        ...

    def alive(self, proc: TaskProcess) -> bool:
        """Whether any process of the task's group is still alive."""
        ...

    def close(self) -> None:
        """Release connections and threads; idempotent."""
        ...

    # --- a recorded run, from any terminal ------------------------------------------------
    def inspect(self, record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
        """Each recorded task with a pid, as its host sees it now. ``ask``: go and look even
        where that is costly (over SSH); else answer from what is at hand."""
        ...

    def stop_recorded(self, record: RunRecord, grace: float) -> Stopped:
        """Stop what is left of a run whose launcher is gone: SIGTERM, ``grace``, SIGKILL to
        every task still alive (``launcher.engines.teardown``). Idempotent; says how many it
        signalled, and which hosts it could not reach (never raised for one host)."""
        ...

    def clean_recorded(self, record: RunRecord) -> Cleanup:
        """Remove what the run left on its hosts besides its directory here (code shipped to
        SSH hosts, their run dirs), for ``tfl rm`` / ``tfl prune`` of a finished run. Only
        directories tfl made for this run; a host that cannot be reached is reported in
        ``left``, never raised. Idempotent."""
        ...


@runtime_checkable
class GroupBackend(Protocol):
    """A backend that runs the whole group as one unit of its own, besides ``Backend``: Slurm,
    where one job's batch script starts every task as steps, restarts the training group
    itself (``--max-restarts``) and keeps the evaluator running across restarts.

    With such a backend the supervisor stays the one state machine, but after a training
    failure it stops nothing itself (the unit's own policy, built from the same options, ends
    the other training tasks) and asks ``restarted`` whether a new attempt follows; the
    evaluator is not restarted with the group. Any other signal the supervisor sends a
    training task stops the whole unit (``signal``).
    """

    def run_data(self) -> dict[str, str]:
        """What the run's record keeps (``RunRecord.backend_data``) to find the unit again from
        any terminal, e.g. Slurm's job id; {} before the unit exists."""
        ...

    def restarted(self, attempt: int) -> bool | None:
        """After a training failure in ``attempt``: whether the group was started again as
        ``attempt + 1`` (True), will not be (False), or that is not known yet (None)."""
        ...

    def describe(self, record: RunRecord) -> dict[str, str]:
        """The unit's own state for ``tfl status`` (Slurm: job, state, pending reason, nodes)."""
        ...


@dataclass(frozen=True)
class GroupResize:
    """A group backend started an attempt with fewer training tasks (an elastic Slurm run lost nodes)."""

    attempt: int  # the attempt that runs at the new size
    from_tasks: int
    to_tasks: int
    lost: dict[str, str]  # each host lost, with why
    notes: tuple[str, ...] = ()  # renamed tasks ("worker:0 on n2 is now chief:0")


@runtime_checkable
class ResizingGroup(Protocol):
    """A group backend whose unit may go on with fewer training tasks (``--min-tasks``)."""

    def resized(self, attempt: int) -> GroupResize | None:
        """Once ``attempt`` started: how it was resized from the one before, or None (a plain restart)."""
        ...
