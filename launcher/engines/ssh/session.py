"""One host's agent session: every task of the run on that host, over one SSH channel.

The host's agent (``node/agent_tasks.py``) starts each task on a ``{"id": N, "run": ...}`` line
and sends back frames tagged with the task's id: its pid, its output, progress, its exit code,
and ``gone`` once its whole process group is. ``HostSession`` reads them in one thread per host
and hands each to its ``RemoteTask``, which writes the task's log and keeps its state. So a task
costs the launcher a request and a few frames, not an SSH session, a remote python and a thread.

The channel's end (the connection dropped, the agent killed, the host lost) ends every task of
the host that had not gone: each is then lost (exit code ``CONNECTION_LOST``), and the agent
there fences them (stdin at EOF, or our pings stopped).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from launcher.engines.ssh.pool import HEARTBEAT_TIMEOUT
from launcher.engines.ssh.wire import MARK
from launcher.files import open_private, write_atomic
from launcher.plan.launch_plan import TaskLaunch
from launcher.tasklog import attempt_banner

if TYPE_CHECKING:
    from paramiko import Channel

CONNECTION_LOST = 255  # ssh's own exit status for "the connection failed"
ID_BYTES = 4  # agent_tasks.ID_BYTES
HEARTBEAT_EVERY = 2.0  # s at least between two of our pings to an agent
# Our pings per ``ssh.fence_after``: at the shortest fence (5 s) a ping every HEARTBEAT_EVERY, as
# always; a longer fence is pinged less often (30 s: every 7.5 s), and an idle launcher of hundreds
# of hosts sends as much fewer SSH messages (each costs it a packet encrypted, MACed and sent).
PINGS_PER_FENCE = 4


def ping_every(fence_after: float) -> float:
    """Seconds between our pings to an agent whose fence is ``fence_after``."""
    return max(HEARTBEAT_EVERY, fence_after / PINGS_PER_FENCE)


class HostSession:
    """The host's agent channel: frames in (one reader thread), lines out (one lock)."""

    def __init__(self, chan: Channel, host: str, port: int, fence_after: float) -> None:
        self.chan, self.host, self.port, self.fence_after = chan, host, port, fence_after
        self.heard, self.heard_wall = time.monotonic(), time.time()
        self.ping_due, self.ping_every = 0.0, ping_every(fence_after)  # monotonic; ``backend.pings_due``
        self.stderr = ""
        self.closed = threading.Event()
        self._tasks: dict[int, RemoteTask] = {}
        self._next = 0
        self._lock, self._send_lock = threading.Lock(), threading.Lock()
        self._cause: str | None = None  # why we ended it (its host lost)
        threading.Thread(target=self._read, name=f"ssh-{host}", daemon=True).start()

    def add(self, task: RemoteTask) -> int:
        """A new task of this session: its id."""
        with self._lock:
            self._next += 1
            self._tasks[self._next] = task
            ended = self.closed.is_set()
        if ended:  # the session ended before: the task ends with it at once
            task.finish(self._cause or "the connection closed", self.stderr)
        return self._next

    def send(self, message: dict[str, Any]) -> None:
        """A line to the agent; a channel already gone is fine (the agent has cleaned up)."""
        with self._send_lock:
            try:
                self.chan.sendall((json.dumps(message) + "\n").encode())
            except (OSError, EOFError):
                pass

    def end(self) -> None:
        """Say we are done: EOF on the agent's stdin. It fences what is left of the tasks, ends what
        they left outside their groups (``agent_tasks.end_leftovers``: SIGTERM, a grace, SIGKILL) and
        exits; ``closed`` is set once it has (the backend waits for that, so that nothing of the run
        is alive on the host when the launch returns)."""
        with self._send_lock:
            try:
                self.chan.shutdown_write()
            except (OSError, EOFError):
                pass  # gone already: nothing to wait for

    def close(self, cause: str | None = None) -> None:
        """End our side: the agent fences every task of the host (``cause``: why, for their logs)."""
        if cause is not None and self._cause is None:
            self._cause = cause
        if not self.closed.is_set():
            threading.Thread(target=self.chan.close, daemon=True).start()  # wakes ``_read``, which finishes

    def exit_status(self) -> int | None:
        return self.chan.exit_status if self.chan.exit_status_ready() else None

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
            if kind in (b"O", b"C"):
                task = self._tasks.get(int.from_bytes(payload[:ID_BYTES], "big"))
                if task is not None:
                    task.frame(kind, payload[ID_BYTES:])
        return buffer

    def _finish(self, cause: str | None) -> None:
        try:
            stderr = self.chan.recv_stderr(65536) if self.chan.recv_stderr_ready() else b""
        except OSError:
            stderr = b""
        self.stderr = stderr.decode(errors="replace")
        self.chan.close()
        with self._lock:
            self.closed.set()
            left = list(self._tasks.values())
        for task in left:
            task.finish(self._cause or cause, self.stderr)


class RemoteTask:
    """One task on its host's session: output to its log, control frames to its state."""

    def __init__(self, session: HostSession, launch: TaskLaunch, attempt: int, notify: Callable[[], None],
                 confirm: Callable[[RemoteTask], None] = lambda task: None) -> None:
        """``confirm``: called when the session ends without the task's exit (``HostWatch.confirm``)."""
        self.session, self.launch, self._notify, self._confirm = session, launch, notify, confirm
        self.header: dict[str, Any] = {}
        self.exit_code: int | None = None
        self.lost = False  # the session ended before the agent reported an exit: the task may live on
        self.lost_since: float | None = None  # its host stopped answering then (wall time; ``watch``)
        self.host, self.port = session.host, session.port
        self._cause: str | None = None
        self.started, self.closed = threading.Event(), threading.Event()
        self._done = threading.Lock()
        self._log = open_private(launch.log_path)
        if attempt:
            self._write(attempt_banner(launch.name, attempt).encode())
        self.ident = session.add(self)

    @property
    def heard(self) -> float:  # the host's agent pings for all of its tasks
        return self.session.heard

    @property
    def heard_wall(self) -> float:
        return self.session.heard_wall

    def run(self, request: dict[str, Any]) -> None:
        self.session.send({"id": self.ident, "run": request})

    def signal(self, signum: int) -> None:
        self.session.send({"id": self.ident, "signal": signum})

    def running(self) -> bool:
        """Started, and neither exited nor lost."""
        return "pid" in self.header and self.exit_code is None and not self.closed.is_set()

    def declare_lost(self, cause: str, since: float) -> None:
        """Its host stopped answering (``watch``): end our side now; the agent there fences the task."""
        if self._cause is None:
            self._cause, self.lost_since = cause, since
            self.session.close(cause)

    def frame(self, kind: bytes, payload: bytes) -> None:
        if kind == b"O":
            self._write(payload)
            return
        message = json.loads(payload)
        if "pid" in message or "error" in message:
            self.header = message
            self.started.set()
        elif "exit" in message:
            self.exit_code = int(message["exit"])
            self._notify()
        elif "progress" in message:
            # Mirrored locally: `tfl status` and the stall watchdog read it without SSH.
            write_atomic_quietly(self.launch.progress_path, message["progress"])
        elif "gone" in message:  # its whole group is gone: like a local task's end
            self.finish(None, "")

    def finish(self, cause: str | None, stderr: str) -> None:
        """The task's end: its group gone (``cause`` None), or its session ended first. Once."""
        if not self._done.acquire(blocking=False):
            return
        self.header.setdefault("stderr", stderr)
        if self.exit_code is None and "pid" in self.header:
            if self._cause is None:
                self._confirm(self)  # may find its host lost
            self.exit_code, self.lost = CONNECTION_LOST, True
            said = stderr.strip().splitlines()[-1:]  # an agent that crashed says why
            why = self._cause or cause or (f"the agent failed: {said[0]}" if said else "the connection closed")
            self._write(f"tfl: lost {self.launch.name} on {self.launch.host}: {why}; the agent there stops the task "
                        f"when it notices (at most {self.fence_after:g} s)\n".encode())
        self._log.close()
        self.closed.set()
        self.started.set()
        self._notify()

    @property
    def fence_after(self) -> float:
        return self.session.fence_after

    @property
    def cause(self) -> str | None:
        return self._cause

    def log(self, text: str) -> None:
        """A line of tfl's own in the task's log (before its agent says anything)."""
        self._write(text.encode())

    def _write(self, data: bytes) -> None:
        if self._log.closed:  # ended already (its session was gone when it was made): nothing more to say
            return
        self._log.write(data)
        self._log.flush()


def write_atomic_quietly(path: str, text: str) -> None:
    try:
        write_atomic(Path(path), text)
    except OSError:
        pass
