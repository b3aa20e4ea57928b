"""Tasks on remote hosts, each run by a tfl agent over its own SSH channel.

Per task, one SSH session runs the agent (``agent.py``) under the host's python. The agent gets
argv, environment and cwd as JSON on stdin (so neither TF_CONFIG nor any job argument
passes through a remote shell or shows in ``ps``), starts the job as the leader of a new
session, and sends back its pid, its output, progress updates and finally its exit code.
Output goes into the task's local log file, where the usual follower prefixes it.

Teardown: a signal becomes a ``{"signal": N}`` line, which the agent sends to the job's
process group. The agent pings when it has sent nothing for ``agent_ping_every`` (3.3) s, which
the lost-host watch times; we ping it four times per its fence (``ping_every``), every 2 s at least. The agent kills
the group when its stdin ends or our pings stop for ``ssh.fence_after`` (launcher killed,
connection dropped), and we report the task as failed (exit code ``CONNECTION_LOST``) when the
agent falls silent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from launcher.contract import ATTEMPT, PROGRESS_FILE
from launcher.engines.base import Cleanup, TaskLive, TaskProcess
from launcher.engines.preflight import Check, HostTasks
from launcher.engines.ssh.connect import SSHError, reach
from launcher.engines.ssh.firewall import Firewalls
from launcher.engines.ssh.pool import HEARTBEAT_TIMEOUT, HostPool
from launcher.engines.ssh.prepare import cleanup_hosts, prepare_hosts
from launcher.engines.ssh.probe import probe_hosts
from launcher.engines.ssh.restart import PREDECESSOR_WAIT, stop_lost_attempt
from launcher.engines.ssh.watch import CHECK_EVERY, SILENT_AFTER, HostWatch, reachable
from launcher.engines.ssh.wire import MARK, agent_request, python_failure
from launcher.files import open_private, write_atomic
from launcher.limits import FOLLOW_OPEN, OWN_ERRNOS, check_open_files, limit_error
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.run_options import DEFAULT_GRACE_S
from launcher.records.store import RunRecord
from launcher.tasklog import attempt_banner

if TYPE_CHECKING:
    from paramiko import Channel

HEARTBEAT_EVERY = 2.0  # s at least between two of our pings to an agent
# Our pings per ``ssh.fence_after``: at the shortest fence (5 s) a ping every HEARTBEAT_EVERY, as
# always; a longer fence is pinged less often (30 s: every 7.5 s), and an idle launcher of hundreds
# of tasks sends as much fewer SSH messages (each costs it a packet encrypted, MACed and sent).
PINGS_PER_FENCE = 4
# The agent's SIGTERM -> SIGKILL delay when it has lost us or got SIGTERM itself (its sshd or
# machine going away): the task's notice, so it gets the grace to save the agreed checkpoint.
KILL_GRACE = DEFAULT_GRACE_S
START_TIMEOUT = 60.0  # for the agent to report the job's pid (python startup on a busy host)
CONNECTION_LOST = 255  # ssh's own exit status for "the connection failed"
PING = {"ping": 1}
# An agent's pings per ``watch.SILENT_AFTER``: each is a packet this launcher decrypts and hands from
# its connection's thread to the task's reader thread, two wakeups, most of what an idle launcher of
# hundreds of tasks spends (an agent's ping costs it about three of its own to an agent). At 5 s, a
# ping every 3.3 s (the agent's old 2 s cost 50 % more); one late by more than 1.7 s costs a probe
# of a host that answers, nothing more.
AGENT_PINGS_PER_SILENCE = 1.5


class RemoteTask:
    """One task's agent channel: output to the log, control frames to us, lines to the agent."""

    def __init__(self, chan: Channel, launch: TaskLaunch, attempt: int, notify: Callable[[], None],
                 confirm: Callable[[RemoteTask], None] = lambda task: None) -> None:
        """``confirm``: called when the connection ends without the task's exit (``HostWatch.confirm``)."""
        self.chan, self.launch, self._notify, self._confirm = chan, launch, notify, confirm
        self.header: dict[str, Any] = {}
        self.exit_code: int | None = None
        self.lost = False  # the connection ended before the agent reported an exit: the task may live on
        self.lost_since: float | None = None  # its host stopped answering then (wall time; ``watch``)
        self.host, self.port = launch.host, launch.ssh.port if launch.ssh else 22
        self.heard, self.heard_wall = time.monotonic(), time.time()
        self.ping_due, self.ping_every = 0.0, ping_every(self.fence_after)  # monotonic; ``pings_due``
        self._cause: str | None = None
        self.started, self.closed = threading.Event(), threading.Event()
        self._send_lock = threading.Lock()
        self._log = open_private(launch.log_path)
        if attempt:
            self._write(attempt_banner(launch.name, attempt).encode())
        threading.Thread(target=self._read, name=f"ssh-{launch.name}", daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        """A line to the agent; a channel already gone is fine (the agent has cleaned up)."""
        with self._send_lock:
            try:
                self.chan.sendall((json.dumps(message) + "\n").encode())
            except (OSError, EOFError):
                pass

    def close(self) -> None:
        self.chan.close()

    def running(self) -> bool:
        """Started, and neither exited nor lost."""
        return "pid" in self.header and self.exit_code is None and not self.closed.is_set()

    def declare_lost(self, cause: str, since: float) -> None:
        """Its host stopped answering (``watch``): end our side now; the agent there fences the task."""
        if self._cause is None:
            self._cause, self.lost_since = cause, since
            if not self.closed.is_set():
                threading.Thread(target=self.chan.close, daemon=True).start()  # wakes ``_read``, which finishes

    def _read(self) -> None:
        buffer, cause, marked = b"", None, False
        try:
            while data := self.chan.recv(65536):
                self.heard, self.heard_wall = time.monotonic(), time.time()
                buffer += data
                if not marked:  # what the login shell printed comes first: the frames follow the agent's MARK
                    marked = MARK in buffer
                    buffer = buffer.partition(MARK)[2] if marked else buffer[-len(MARK):]
                buffer = self._frames(buffer) if marked else buffer
        except OSError as exc:  # socket.timeout: the agent fell silent
            cause = f"no word from the agent for {HEARTBEAT_TIMEOUT:g} s ({type(exc).__name__})"
        finally:
            self._finish(cause)

    def _frames(self, buffer: bytes) -> bytes:
        while len(buffer) >= 5:
            size = int.from_bytes(buffer[1:5], "big")
            if len(buffer) < 5 + size:
                break
            kind, payload, buffer = buffer[:1], buffer[5:5 + size], buffer[5 + size:]
            if kind == b"O":
                self._write(payload)
            elif kind == b"C":
                self._control(json.loads(payload))
        return buffer

    def _control(self, message: dict[str, Any]) -> None:
        if "pid" in message or "error" in message:
            self.header = message
            self.started.set()
        elif "exit" in message:
            self.exit_code = int(message["exit"])
            self._notify()
        elif "progress" in message:
            # Mirrored locally: `tfl status` and the stall watchdog read it without SSH.
            write_atomic_quietly(self.launch.progress_path, message["progress"])

    def _finish(self, cause: str | None) -> None:
        try:
            stderr = self.chan.recv_stderr(65536) if self.chan.recv_stderr_ready() else b""
        except OSError:
            stderr = b""
        self.header.setdefault("stderr", stderr.decode(errors="replace"))
        if self.exit_code is None and "pid" in self.header:
            if self._cause is None:
                self._confirm(self)  # may find its host lost
            self.exit_code, self.lost = CONNECTION_LOST, True
            said = stderr.decode(errors="replace").strip().splitlines()[-1:]  # an agent that crashed says why
            why = self._cause or cause or (f"the agent failed: {said[0]}" if said else "the connection closed")
            self._write(f"tfl: lost {self.launch.name} on {self.launch.host}: {why}; the agent there stops the task "
                        f"when it notices (at most {self.fence_after:g} s)\n".encode())
        self._log.close()
        self.chan.close()
        self.closed.set()
        self.started.set()
        self._notify()

    @property
    def fence_after(self) -> float:
        return self.launch.ssh.fence_after if self.launch.ssh else HEARTBEAT_TIMEOUT

    @property
    def cause(self) -> str | None:
        return self._cause

    def log(self, text: str) -> None:
        """A line of tfl's own in the task's log (before its agent says anything)."""
        self._write(text.encode())

    def _write(self, data: bytes) -> None:
        self._log.write(data)
        self._log.flush()


def agent_ping_every(silent_after: float = SILENT_AFTER) -> float:
    """Seconds an agent may stay silent before it pings us (its run request says so): seldom, yet
    within the watch's silence (``SILENT_AFTER``) and well within the channel's ``HEARTBEAT_TIMEOUT``."""
    return min(silent_after / AGENT_PINGS_PER_SILENCE, HEARTBEAT_TIMEOUT / 4)


def ping_every(fence_after: float) -> float:
    """Seconds between our pings to an agent whose fence is ``fence_after``."""
    return max(HEARTBEAT_EVERY, fence_after / PINGS_PER_FENCE)


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


def write_atomic_quietly(path: str, text: str) -> None:
    try:
        write_atomic(Path(path), text)
    except OSError:
        pass


def descriptors_needed(hosts: int, tasks: int) -> int:
    """What a launch holds open at most: a connection per host, a log per task (the agents'
    channels share their host's connection), the console's open logs, and the launcher's own."""
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
        chan = self._pool.agent(launch)
        try:
            task = RemoteTask(chan, launch, attempt, self._notify, self._watch.confirm)
        except OSError as exc:  # its log: out of descriptors is the launcher's own limit
            chan.close()
            if exc.errno in OWN_ERRNOS:
                raise limit_error(exc, "starting the tasks") from None
            raise
        if note:
            task.log(note)
        task.send(self._request(launch, attempt))  # a dead channel shows as a missing pid below
        if not task.started.wait(START_TIMEOUT):
            task.close()
            raise SSHError(launch.host, f"the tfl agent did not start within {START_TIMEOUT:g} s", launch.name)
        if "pid" not in task.header:
            task.closed.wait(5.0)
            code = chan.exit_status if chan.exit_status_ready() else None
            cause = task.header.get("error") or python_failure(python, code, task.header.get("stderr", "").encode(), launch.host)
            raise SSHError(launch.host, cause, launch.name)
        self._tasks.append(task)
        self._attempts.setdefault(launch.name, []).append(task)
        self._ensure_pinger()
        return TaskProcess(launch=launch, attempt=attempt, pid=task.header["pid"], pgid=task.header["pgid"],
                           create_time=task.header.get("create_time"), handle=task, start_ticks=task.header.get("start_ticks"))

    @staticmethod
    def _request(launch: TaskLaunch, attempt: int) -> dict[str, Any]:
        progress = launch.env.get(PROGRESS_FILE)
        return {
            "mode": "run", "argv": list(launch.argv), "env": {**launch.env, ATTEMPT: str(attempt)},
            "cwd": launch.cwd, "mkdirs": [os.path.dirname(progress)] if progress else [], "progress_file": progress,
            "heartbeat_timeout": launch.ssh.fence_after if launch.ssh else HEARTBEAT_TIMEOUT, "grace": KILL_GRACE,
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
        proc.handle.send({"signal": int(signum)})

    def alive(self, proc: TaskProcess) -> bool:
        return not proc.handle.closed.is_set()

    def close(self) -> None:
        """Ends the run's side of every agent, then removes what the run shipped (once) and the
        run's firewall tables."""
        self._closing.set()
        for task in self._tasks:
            task.close()
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
            live = [t for t in self._tasks if not t.closed.is_set()]
            for task in pings_due(live, time.monotonic()):
                task.send(PING)
            self._watch.check(live)

    # --- a recorded run -----------------------------------------------------------------
    def inspect(self, record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
        """``ask``: every host of the run is asked (over SSH, all at once). Without it, a
        running task counts as alive while its launcher is: its agent kills it without one."""
        from launcher.engines.ssh import recorded

        return recorded.inspect(record, ask=ask)

    def stop_recorded(self, record: RunRecord, grace: float) -> int:
        from launcher.engines.ssh import recorded

        return recorded.stop(record, grace)

    def clean_recorded(self, record: RunRecord) -> Cleanup:
        from launcher.engines.ssh import recorded

        return recorded.clean(record)
