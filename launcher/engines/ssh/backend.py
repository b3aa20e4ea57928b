"""Tasks on remote hosts, all of a host's tasks run by one tfl agent over one SSH session.

Per host, one SSH session runs the agent (``node/agent.py``): the host's first agent, which checked
the host and unpacked the code, then takes a ``tasks`` request (``session.HostSession``). Each task
is one ``{"id": N, "run": ...}`` line with its argv, environment and cwd as JSON (so neither
TF_CONFIG nor any job argument passes through a remote shell or shows in ``ps``); the agent starts
the job as the leader of a new session and sends back, tagged with the task's id, its pid, its
output, progress updates, its exit code, and ``gone`` once its group is. Output goes into the
task's local log file, where the usual follower prefixes it.

Teardown: a signal becomes a ``{"id": N, "signal": S}`` line, which the agent sends to the job's
process group. The agent pings when it has sent nothing for ``agent_ping_every`` (3.3) s, which
the lost-host watch times; we ping it four times per its fence (``ping_every``), every 2 s at least.
The agent kills every task's group when its stdin ends or our pings stop for ``ssh.fence_after``
(launcher killed, connection dropped), and we report each of the host's tasks as failed (exit
code ``CONNECTION_LOST``) when the agent falls silent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Callable, Protocol, TypeVar

from launcher.contract import ATTEMPT, PROGRESS_FILE
from launcher.engines.base import Cleanup, Stopped, TaskLive, TaskProcess
from launcher.engines.preflight import Check, HostTasks
from launcher.engines.ssh.connect import reach, send_all
from launcher.engines.ssh.failures import SSHError
from launcher.engines.ssh.firewall import Firewalls
from launcher.engines.ssh.pool import HEARTBEAT_TIMEOUT, HostPool
from launcher.engines.ssh.prepare import cleanup_hosts, prepare_hosts
from launcher.engines.ssh.probe import probe_hosts
from launcher.engines.ssh.restart import PREDECESSOR_WAIT, stop_lost_attempt
from launcher.engines.ssh.session import CONNECTION_LOST, HostSession, RemoteTask, ping_every
from launcher.engines.ssh.watch import CHECK_EVERY, SILENT_AFTER, HostWatch, reachable
from launcher.engines.ssh.wire import agent_request, python_failure
from launcher.limits import FOLLOW_OPEN, OWN_ERRNOS, check_open_files, limit_error
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.run_options import DEFAULT_GRACE_S
from launcher.records.store import RunRecord

__all__ = ["CONNECTION_LOST", "HEARTBEAT_TIMEOUT", "SSHBackend", "agent_ping_every", "ping_every", "pings_due"]

# The agent's SIGTERM -> SIGKILL delay when it has lost us or got SIGTERM itself (its sshd or
# machine going away): the task's notice, so it gets the grace to save the agreed checkpoint.
KILL_GRACE = DEFAULT_GRACE_S
START_TIMEOUT = 60.0  # for the agent to report the job's pid (python startup on a busy host)
# At the run's end, how long every agent at once gets to exit: its tasks' leftovers outside their groups
# get SIGTERM, 2 s (agent_tasks.LEFTOVER_GRACE), then SIGKILL; the launch returns once that is done.
AGENT_END_WAIT = 10.0
PING = {"ping": 1}
# An agent's pings per ``watch.SILENT_AFTER``: each is a packet this launcher decrypts and hands from
# its connection's thread to the task's reader thread, two wakeups, most of what an idle launcher of
# hundreds of tasks spends (an agent's ping costs it about three of its own to an agent). At 5 s, a
# ping every 3.3 s (the agent's old 2 s cost 50 % more); one late by more than 1.7 s costs a probe
# of a host that answers, nothing more.
AGENT_PINGS_PER_SILENCE = 1.5


def agent_ping_every(silent_after: float = SILENT_AFTER) -> float:
    """Seconds an agent may stay silent before it pings us (its run request says so): seldom, yet
    within the watch's silence (``SILENT_AFTER``) and well within the channel's ``HEARTBEAT_TIMEOUT``."""
    return min(silent_after / AGENT_PINGS_PER_SILENCE, HEARTBEAT_TIMEOUT / 4)


class Pinged(Protocol):
    ping_due: float  # monotonic
    ping_every: float


P = TypeVar("P", bound=Pinged)


def pings_due(tasks: Sequence[P], now: float) -> list[P]:
    """The tasks to ping at ``now`` (monotonic), each then due again ``ping_every`` later."""
    due = [t for t in tasks if now >= t.ping_due]
    for task in due:
        task.ping_due = now + task.ping_every
    return due


def fence_after(launch: TaskLaunch) -> float:
    """The task's host's ``ssh.fence_after``: the agent's dead-man timer there."""
    return launch.ssh.fence_after if launch.ssh else HEARTBEAT_TIMEOUT


def descriptors_needed(hosts: int, tasks: int) -> int:
    """What a launch holds open at most: a connection per host (its agent's session and requests
    share it), a log per task, the console's open logs, and the launcher's own."""
    return 24 + hosts + tasks + min(tasks, FOLLOW_OPEN)


class SSHBackend:
    """The Backend protocol over SSH (see ``engines.base``)."""

    concurrent_start = True  # each start is a round trip to its host's agent

    name = "ssh"

    def __init__(self, notify: Callable[[], None] = lambda: None) -> None:
        self._notify = notify
        self._pool = HostPool()
        self._plan: LaunchPlan | None = None
        self._caches: dict[str, str] = {}  # host -> its per-user tfl dir, once ready (``hosts.HOST_CACHE``)
        self._cleaned = False
        self._tasks: list[RemoteTask] = []
        self._sessions: dict[str, HostSession] = {}  # host -> its agent session (``session``)
        self._session_locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        self._attempts: dict[str, list[RemoteTask]] = {}  # task name -> its attempts here, in order
        self._closing = threading.Event()
        self._pinger: threading.Thread | None = None
        self._pinger_lock = threading.Lock()
        self._watch = HostWatch(notify, probe=self._reach)
        self._firewalls = Firewalls(self._pool)

    def _reach(self, host: str, port: int) -> bool:
        """The lost-host probe, the way the host is reached: straight, or through its bastion."""
        target = next((t.ssh for t in self._plan.tasks if t.host == host and t.ssh), None) if self._plan else None
        return reach(target) if target is not None else reachable(host, port)

    # --- before a run -------------------------------------------------------------------
    def probe(self, hosts: Sequence[HostTasks], *, quick: bool) -> list[Check]:
        checks = probe_hosts(hosts, quick=quick)
        for check in checks:  # reached again: a host lost earlier in the run may take tasks again
            if check.name == "ssh" and check.status == "ok" and self._watch.forget(check.host):
                self._pool.drop(check.host)  # its connections from before the loss are dead
        return checks

    def prepare(self, plan: LaunchPlan) -> list[Check]:
        self._plan = plan
        hosts = len({t.host for t in plan.tasks})
        check_open_files(descriptors_needed(hosts, len(plan.tasks)), f"this launch ({hosts} hosts, {len(plan.tasks)} tasks)")
        try:
            return prepare_hosts(plan, self._pool, self._caches, self._firewalls)
        except BaseException:
            self.close()
            raise

    def resolve(self, plan: LaunchPlan) -> LaunchPlan:
        return plan.on_hosts(self._caches)

    # --- a live run ---------------------------------------------------------------------
    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        lost = self._watch.lost(launch.host)
        if lost is not None:  # never wait on a host known lost
            raise SSHError(launch.host, f"{lost.describe()}; nothing starts there again in this run", launch.name)
        python = launch.python
        # A host back after a loss lost its table with it (its agent's fence): installed again first.
        refused = self._firewalls.ensure(self._plan, launch.host) if self._plan is not None else None
        if refused is not None:
            raise SSHError(launch.host, refused, launch.name)
        note = self._stop_lost_attempt(launch)
        session = self._session(launch)
        try:
            task = RemoteTask(session, launch, attempt, self._notify, self._watch.confirm)
        except OSError as exc:  # its log: out of descriptors is the launcher's own limit
            if exc.errno in OWN_ERRNOS:
                raise limit_error(exc, "starting the tasks") from None
            raise
        if note:
            task.log(note)
        task.run(self._request(launch, attempt))  # a dead session shows as a missing pid below
        if not task.started.wait(START_TIMEOUT):
            session.close()
            raise SSHError(launch.host, f"the tfl agent did not start within {START_TIMEOUT:g} s", launch.name)
        if "pid" not in task.header:
            task.closed.wait(5.0)
            cause = task.header.get("error") or python_failure(python, session.exit_status(),
                                                               task.header.get("stderr", "").encode(), launch.host)
            raise SSHError(launch.host, cause, launch.name)
        self._tasks.append(task)
        self._attempts.setdefault(launch.name, []).append(task)
        self._ensure_pinger()
        return TaskProcess(launch=launch, attempt=attempt, pid=task.header["pid"], pgid=task.header["pgid"],
                           create_time=task.header.get("create_time"), handle=task, start_ticks=task.header.get("start_ticks"))

    def _session(self, launch: TaskLaunch) -> HostSession:
        """The host's agent session: the one open, else its agent started ahead (or a new one) turned into it."""
        with self._session_locks[launch.host]:
            session = self._sessions.get(launch.host)
            if session is None or session.closed.is_set():
                chan = self._pool.agent(launch)
                try:
                    send_all(chan, (json.dumps(self._tasks_request(launch)) + "\n").encode())
                except (OSError, EOFError) as exc:
                    chan.close()
                    raise SSHError(launch.host, f"the SSH session closed at once ({exc})", launch.name) from None
                port = launch.ssh.port if launch.ssh else 22
                session = self._sessions[launch.host] = HostSession(chan, launch.host, port, fence_after(launch))
            return session

    @staticmethod
    def _tasks_request(launch: TaskLaunch) -> dict[str, Any]:
        """What turns the host's agent into its tasks' session (``node/agent_tasks``)."""
        return {"mode": "tasks", "heartbeat_timeout": fence_after(launch), "ping_every": agent_ping_every()}

    @staticmethod
    def _request(launch: TaskLaunch, attempt: int) -> dict[str, Any]:
        progress = launch.env.get(PROGRESS_FILE)
        return {
            "argv": list(launch.argv), "env": {**launch.env, ATTEMPT: str(attempt)},
            "cwd": launch.cwd, "mkdirs": [os.path.dirname(progress)] if progress else [], "progress_file": progress,
            "heartbeat_timeout": fence_after(launch), "grace": KILL_GRACE,
            "ping_every": agent_ping_every(),
        }

    def _stop_lost_attempt(self, launch: TaskLaunch) -> str | None:
        """The task's previous attempt, lost with its connection, stopped first (``restart``)."""
        lost = [t for t in self._attempts.get(launch.name, []) if t.lost]  # not a walk of every task: starts stay linear
        if not lost or launch.ssh is None:
            return None
        conn = self._pool.get(launch.ssh)
        return stop_lost_attempt(lambda request: agent_request(conn, launch.python, request, timeout=PREDECESSOR_WAIT),
                                 launch.name, lost[-1].header)

    def poll(self, proc: TaskProcess) -> int | None:
        task: RemoteTask = proc.handle
        code = task.exit_code
        if code is not None and task.lost_since is not None:
            proc.ended_by, proc.unreachable_since = task.cause, task.lost_since
        return code

    def signal(self, proc: TaskProcess, signum: int) -> None:
        proc.handle.signal(int(signum))

    def alive(self, proc: TaskProcess) -> bool:
        return not proc.handle.closed.is_set()

    def close(self) -> None:
        """Ends the run's side of every agent, then removes what the run shipped (once) and the
        run's firewall tables."""
        self._closing.set()
        sessions = list(self._sessions.values())
        ending = [s for s in sessions if not s.closed.is_set() and self._watch.lost(s.host) is None]
        for session in ending:  # every agent at once; a lost host's is not waited for
            session.end()
        deadline = time.monotonic() + AGENT_END_WAIT
        for session in ending:
            session.closed.wait(max(0.0, deadline - time.monotonic()))
        for session in sessions:
            session.close()
        if self._plan is not None and self._caches and not self._cleaned:
            self._cleaned = True
            # A host known lost keeps its copy (``tfl rm`` removes it once it is back): no wait on it.
            cleanup_hosts(self.resolve(self._plan), self._pool, [h for h in self._caches if self._watch.lost(h) is None])
        self._firewalls.release(lambda host: self._watch.lost(host) is not None)
        self._pool.close()

    def _ensure_pinger(self) -> None:
        with self._pinger_lock:  # tasks start from several threads at once
            if self._pinger is None:
                self._pinger = threading.Thread(target=self._ping, name="ssh-heartbeat", daemon=True)
                self._pinger.start()

    def _ping(self) -> None:
        while not self._closing.wait(CHECK_EVERY):
            open_sessions = [s for s in list(self._sessions.values()) if not s.closed.is_set()]
            for session in pings_due(open_sessions, time.monotonic()):
                session.send(PING)
            self._watch.check([t for t in self._tasks if not t.closed.is_set()])

    # --- a recorded run -----------------------------------------------------------------
    def inspect(self, record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
        """``ask``: every host of the run is asked (over SSH, all at once). Without it, a
        running task counts as alive while its launcher is: its agent kills it without one."""
        from launcher.engines.ssh import recorded

        return recorded.inspect(record, ask=ask)

    def stop_recorded(self, record: RunRecord, grace: float) -> Stopped:
        from launcher.engines.ssh import recorded

        return recorded.stop(record, grace)

    def clean_recorded(self, record: RunRecord) -> Cleanup:
        from launcher.engines.ssh import recorded

        return recorded.clean(record)
