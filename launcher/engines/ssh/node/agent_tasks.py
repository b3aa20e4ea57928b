"""The tfl agent's task side (stdlib only, Python >= 3.8): every task of a run on this host.

``agent.py`` hands its stdin and stdout here on a ``tasks`` request, the last request of a
host's one SSH session: ``Session`` then reads the launcher's lines, ``{"id": N, "run": {...}}``
to start task N (the job as the leader of a new session, its pid reported first), ``{"id": N,
"signal": S}`` to signal its group, and any line at all as a ping. Each task's output and control
messages go back as frames tagged with its id (``Tagged``), in order, and ``{"gone": CODE}`` once
its leader has exited and its whole group is gone. Stdin ending, or the launcher silent for the
request's ``heartbeat_timeout``, kills every task's group (SIGTERM, the grace, SIGKILL): a remote
task never outlives its launcher. The agent leaves once the launcher is gone and every task with it.

Frames: 1 type byte, a 4-byte length, the payload; ``O`` output and ``C`` JSON control carry the
task's id as the payload's first 4 bytes; ``P`` is a ping (the host's, empty).
"""

from __future__ import annotations  # annotations stay strings: the agent runs on Python >= 3.8

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Any, Callable, Protocol, cast

try:  # sent along with the agent (launcher.engines.ssh.wire.BOOTSTRAP)
    import tfl_agent_files as files
    import tfl_agent_tmp as tmp
except ImportError:  # imported in the launcher itself
    from launcher.engines.ssh.node import agent_files as files
    from launcher.engines.ssh.node import agent_tmp as tmp

MARK = "\x1etfl\x1e"  # starts every reply; launcher.engines.ssh.wire.MARK
# launcher.contract's names (the agent is sent alone: no import): what marks a task's processes
MARKS = ("TFL_RUN_ID", "TFL_RUN_DIR", "TFL_ATTEMPT", "TFL_TASK")
LEFTOVER_GRACE = 2.0  # what the tasks left outside their groups: SIGTERM, this long, then SIGKILL
PING_EVERY = 2.0  # s of silence before a ping, unless the request says (``backend.agent_ping_every``)
LOST = threading.Event()  # the launcher is gone: stdin at EOF, silent too long, or sshd hung up on us
ID_BYTES = 4


def create_time(pid: int) -> float | None:
    """The process's start time, computed the way psutil does so both always agree.

    From /proc where there is one (importing psutil would cost the agent's start as much
    again as the interpreter's own); psutil elsewhere.
    """
    try:
        with open("/proc/%d/stat" % pid) as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return ticks / os.sysconf("SC_CLK_TCK") + btime
    except FileNotFoundError:
        if os.path.exists("/proc/self/stat"):
            return None  # Linux, and the process is gone
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # psutil missing, or the process gone
        return None


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/PID/stat after the command's name (state first); [] without it."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: unlike ``create_time`` (which
    adds the boot time, moved by any clock step), fixed for the process's life. None without /proc."""
    try:
        return int(_stat(pid)[19])
    except (ValueError, IndexError):
        return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _prctl() -> Any:
    try:
        import ctypes

        return ctypes.CDLL(None).prctl
    except Exception:  # not Linux
        return None


# Looked up here, once: the child of a fork in a process with threads (one per task) may call
# nothing that takes a lock another thread could have held, so no import and no dlopen there.
_PRCTL = _prctl()


def _die_with_agent() -> None:
    # Belt and braces on Linux: should the agent itself be SIGKILLed, the job leader follows. The
    # signal comes when the thread that started it ends: its task's thread, which outlives its group.
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Frames:
    """Writes frames to stdout; a broken connection makes writes no-ops, never errors."""

    def __init__(self, fd: int = 1) -> None:
        self.lock, self.fd, self.broken = threading.Lock(), fd, False
        self.sent = 0.0  # monotonic time the last frame was begun: stamped before its write, never after it is read

    def send(self, kind: bytes, payload: bytes) -> None:
        self.raw(kind + len(payload).to_bytes(4, "big") + payload)

    def raw(self, data: bytes) -> None:
        if self.broken:
            return
        with self.lock:
            try:
                self.sent = time.monotonic()
                while data:
                    data = data[os.write(self.fd, data):]
            except OSError:
                self.broken = True

    def control(self, message: dict[str, Any]) -> None:
        self.send(b"C", json.dumps(message).encode())


class Tagged:
    """One task's frames on its host's session: each ``O`` and ``C`` frame starts with the task's id."""

    def __init__(self, frames: Frames, ident: int) -> None:
        self.frames, self.tag = frames, ident.to_bytes(ID_BYTES, "big")

    @property
    def sent(self) -> float:  # a frame of any task counts as the host's ping
        return self.frames.sent

    @property
    def broken(self) -> bool:
        return self.frames.broken

    def send(self, kind: bytes, payload: bytes) -> None:
        self.frames.send(kind, payload if kind == b"P" else self.tag + payload)

    def control(self, message: dict[str, Any]) -> None:
        self.send(b"C", json.dumps(message).encode())


class Session:
    """The launcher's lines for this host's tasks; ``serve`` returns once the launcher is gone
    and every task's group with it."""

    def __init__(self, frames: Frames, request: dict[str, Any]) -> None:
        self.frames, self.heard = frames, time.monotonic()
        self.heartbeat_timeout = float(request.get("heartbeat_timeout") or 30.0)
        self.ping_every = float(request.get("ping_every") or PING_EVERY)
        self._lock = threading.Lock()
        self._groups: dict[int, int] = {}  # task id -> its process group
        self._early: dict[int, list[int]] = {}  # signals for a task not started yet: sent once it is
        self._threads: list[threading.Thread] = []
        self._marks: set[tuple[str, ...]] = set()  # each task started here: its MARKS values
        self._ending = threading.Lock()  # held while an earlier attempt's leftovers are ended (``_next_attempt``)
        self._tmp = tmp.RunTmp()  # the run's private temp dir here: each task's TMPDIR

    def serve(self) -> int:
        threading.Thread(target=self._commands, daemon=True).start()
        while not LOST.wait(0.5):
            now = time.monotonic()
            if now - self.heard > self.heartbeat_timeout:
                LOST.set()  # the launcher fell silent: each task's relay fences its group
            elif now - self.frames.sent > self.ping_every:  # no task running here, or all silent: the host pings
                self.frames.send(b"P", b"")
        for thread in list(self._threads):
            thread.join()
        end_leftovers(self._marks)
        self._tmp.remove()  # its tasks and what they left are gone: so goes what they wrote there
        return 0

    def _commands(self) -> None:
        for line in sys.stdin:
            self.heard = time.monotonic()
            try:
                command = json.loads(line)
                ident = int(command["id"]) if "id" in command else None
            except (ValueError, TypeError):
                continue
            if ident is not None and "run" in command:
                thread = threading.Thread(target=self._task, args=(ident, command["run"]), daemon=True)
                self._threads.append(thread)
                thread.start()
            elif ident is not None and "signal" in command:
                self._signal(ident, int(command["signal"]))
        LOST.set()

    def _signal(self, ident: int, signum: int) -> None:
        with self._lock:
            pgid = self._groups.get(ident)
            if pgid is None:
                self._early.setdefault(ident, []).append(signum)
                return
        killpg(pgid, signum)

    def _started(self, ident: int, pgid: int) -> None:
        with self._lock:
            self._groups[ident] = pgid
            early = self._early.pop(ident, [])
        for signum in early:
            killpg(pgid, signum)

    def _task(self, ident: int, request: dict[str, Any]) -> None:
        frames = Tagged(self.frames, ident)
        env = request.get("env") or {}
        if env.get(MARKS[0]):
            self._next_attempt(tuple(str(env.get(name, "")) for name in MARKS))
        try:
            code = run(self._tmp.task(request), frames, self, lambda pgid: self._started(ident, pgid))
        except tmp.TmpError as exc:
            frames.control({"error": str(exc)})
            code = 126
        except Exception as exc:  # noqa: BLE001 - said to the launcher, never a silent task
            frames.control({"error": "the agent failed: %s: %s" % (type(exc).__name__, exc)})
            code = 126
        frames.control({"gone": code})

    def _next_attempt(self, mark: tuple[str, ...]) -> None:
        """The first task of a restart here: what the earlier attempts' tasks left outside their
        groups (their groups are torn down by now) is ended before it starts, so that it cannot hold
        this attempt's ports or files. The attempt's other tasks wait for that on ``_ending``."""
        with self._ending:
            with self._lock:
                earlier = {m for m in self._marks if m[:2] == mark[:2] and m[2] != mark[2]}
                self._marks -= earlier
                self._marks.add(mark)
            if earlier:
                end_leftovers(earlier)


class Heard(Protocol):
    """What a task's relay needs of the launcher's side: when it was last heard (monotonic)."""

    heard: float


def run(request: dict[str, Any], frames: Tagged, heard: Heard, started: Callable[[int], None]) -> int:
    """Start the task, report its pid, relay it until its group is gone; its exit code."""
    for path in request.get("mkdirs", []):
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)  # in the run's private dir, and as private
        except OSError as exc:
            frames.control({"error": "cannot create %s: %s" % (path, exc.strerror)})
            return 126
    cwd = request["cwd"]
    if not os.path.isdir(cwd):
        frames.control({"error": "working directory %s does not exist" % cwd})
        return 126
    env = dict(os.environ, **request["env"])
    if "PYTHONPATH" in request["env"] and os.environ.get("PYTHONPATH"):
        # The plan's entries (the shipped job kit first) go before the host's own.
        env["PYTHONPATH"] = request["env"]["PYTHONPATH"] + os.pathsep + os.environ["PYTHONPATH"]
    try:
        child = subprocess.Popen(
            request["argv"], env=env, cwd=cwd, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_agent)
    except OSError as exc:
        frames.control({"error": "cannot run %s: %s" % (request["argv"][0], exc.strerror)})
        return 127
    started(child.pid)
    frames.control({"pid": child.pid, "pgid": child.pid, "create_time": create_time(child.pid),
                    "start_ticks": start_ticks(child.pid)})
    return relay(child, frames, heard, request)


def relay(child: subprocess.Popen[bytes], frames: Tagged | Frames, commands: Heard, request: dict[str, Any]) -> int:
    """Relay output until the leader has exited and its group is gone; kill it if we are lost."""
    heartbeat_timeout, grace = request.get("heartbeat_timeout", 30.0), request.get("grace", 5.0)
    ping_every = float(request.get("ping_every") or PING_EVERY)
    progress = files.Progress(request.get("progress_file"))
    fd, eof, reported = cast(IO[bytes], child.stdout).fileno(), False, False
    code: int | None = None
    killing = 0.0
    while True:
        idle = True
        if not eof and select.select([fd], [], [], 0.1)[0]:
            data = os.read(fd, 65536)
            idle, eof = not data, not data
            if data:
                frames.send(b"O", data)
        elif eof and code is None:
            time.sleep(0.1)
        if code is None:
            code = child.poll()
            idle = idle and code is None  # once it has exited, drain the pipe before reporting
        if code is not None and idle and not reported:
            progress.forward(frames.control, time.monotonic(), final=True)
            frames.control({"exit": code})
            reported = True
        if reported and not group_alive(child.pid):
            while not eof and select.select([fd], [], [], 0)[0]:  # what the group wrote last
                data = os.read(fd, 65536)
                eof = not data
                if data:
                    frames.send(b"O", data)
            return code  # the leader and every process of its group are gone: like a local task
        if eof and code is not None:
            time.sleep(0.1)  # the leader is gone and the pipe closed, yet its group lives on
        now = time.monotonic()
        if not killing and (LOST.is_set() or frames.broken or now - commands.heard > heartbeat_timeout):
            killing = now
            killpg(child.pid, signal.SIGTERM)
        elif killing and now - killing > grace:
            killpg(child.pid, signal.SIGKILL)
        if now - frames.sent > ping_every:  # any frame counts as a ping
            frames.send(b"P", b"")
        progress.forward(frames.control, now)


def killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def end_leftovers(marks: set[tuple[str, ...]]) -> list[int]:
    """What this session's tasks started outside their process groups (a daemon's double fork and
    setsid) outlives them: found by the environment they inherit (``MARKS``: the run's id and dir,
    the attempt and the task, so neither a later attempt here in another session nor another
    host's task on the same machine is taken), ended as the local engine ends them (SIGTERM,
    ``LEFTOVER_GRACE``, SIGKILL). Only this user's processes. The pids found."""
    left = [pid for pid in _own_pids() if _mark_of(pid) in marks] if marks else []
    for pid in left:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + LEFTOVER_GRACE
    while [pid for pid in left if _running(pid)] and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        if _running(pid):
            _kill(pid, signal.SIGKILL)
    return left


def _own_pids() -> list[int]:
    uid, me = os.getuid(), os.getpid()
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                if os.stat("/proc/" + name).st_uid == uid:
                    pids.append(int(name))
            except OSError:
                continue
    return pids


def _mark_of(pid: int) -> tuple[str, ...] | None:
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            pairs = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    except OSError:
        return None
    if MARKS[0].encode() not in pairs:
        return None
    return tuple(pairs.get(name.encode(), b"").decode(errors="replace") for name in MARKS)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie is gone: only its parent's wait remains)."""
    return _stat(pid)[:1] not in ([], [b"Z"])


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
