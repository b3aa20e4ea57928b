"""The tfl agent: the one program tfl runs on a remote host (stdlib only, Python >= 3.8).

It is not installed there. The launcher starts ``python -u -c BOOTSTRAP`` over SSH and
sends this file's source (with ``agent_files.py`` and ``agent_firewall.py``, its file and
firewall work) as the first stdin line, then JSON request lines. So the remote command line shows
neither the job's arguments nor its environment (TF_CONFIG and the TFL_* variables travel in the
request, never through ``ps`` or a shell).

Every request but ``run`` is answered with one JSON line; the agent then reads the next request, until stdin
ends or a ``run`` request comes. So ``tfl launch`` checks the host, unpacks the code, then runs each task in its own SSH session.

Modes of a request:

``run``
    Start ``argv`` with ``env`` in ``cwd`` as the leader of a new session, report its
    pid on the first control frame, relay its output, obey ``{"signal": N}`` lines.
    Stdin reaching EOF or heartbeats stopping (the launcher or the connection is lost)
    kills the job's whole process group: a remote task never outlives its launcher.
``info`` / ``signal`` / ``stop``
    Liveness, cpu, memory and progress of recorded tasks / signal their groups / SIGTERM, the
    grace, SIGKILL, waited for here (``tfl stop``: every host at once), a pid only
    if its start matches the recorded one (pids get reused; also how a restart stops a lost
    attempt first: ``launcher.engines.ssh.restart``).
``probe``
    What ``tfl doctor`` checks: python, package versions, ports, disk, GPUs, and the job
    kit sent along imported as a task would (with ``quick``: python and ports only, what
    ``tfl launch`` checks first). Always: where the host's per-user tfl dir is.
``unpack`` / ``cleanup`` / ``storage`` / ``remove`` (``agent_files``)
    The run's private dirs, the shipped code and job kit, the kit's import check / their
    removal at the end / tokens proving shared storage (``tfl doctor``) / a finished run's
    dirs (``tfl rm``: only ones named after the run, no link).
``fence`` / ``unfence`` (``agent_firewall``)
    Install the run's nftables table and hold it while the launcher pings, removing it at
    the end or when the launcher is lost / remove it (``tfl stop``, ``tfl rm``).

Every reply starts with ``MARK``: whatever the login shell printed first (a chatty
``~/.bashrc``) comes before it and is skipped. Output of ``run`` is framed on stdout after
it (1 type byte, 4-byte length, payload) so that job output and control messages stay in
order: ``O`` output, ``C`` JSON control, ``P`` ping. The other modes print one JSON line.
"""

from __future__ import annotations  # annotations stay strings: the agent runs on Python >= 3.8

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any, cast

try:  # sent along with this file (launcher.engines.ssh.wire.BOOTSTRAP)
    import tfl_agent_files as files
    import tfl_agent_firewall as firewall
except ImportError:  # imported in the launcher itself
    from launcher.engines.ssh.node import agent_files as files
    from launcher.engines.ssh.node import agent_firewall as firewall

MARK = "\x1etfl\x1e"  # starts every reply; launcher.engines.ssh.wire.MARK
PING_EVERY = 2.0  # s of silence before a ping, unless the request says (``backend.agent_ping_every``)
LOST = threading.Event()  # the launcher is gone: stdin at EOF, or sshd hung up on us


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


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: unlike ``create_time`` (which
    adds the boot time, moved by any clock step), fixed for the process's life. None without /proc."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _die_with_agent() -> None:
    # Belt and braces on Linux: should the agent itself be SIGKILLed, the job leader follows.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass


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


class Commands(threading.Thread):
    """Reads the launcher's lines: signals and heartbeats; EOF means the launcher is gone."""

    def __init__(self, pgid: int) -> None:
        super().__init__(daemon=True)
        self.pgid, self.heard = pgid, time.monotonic()

    def run(self) -> None:
        for line in sys.stdin:
            self.heard = time.monotonic()
            try:
                command = json.loads(line)
            except ValueError:
                continue
            if "signal" in command:
                try:
                    os.killpg(self.pgid, int(command["signal"]))
                except (ProcessLookupError, PermissionError):
                    pass
        LOST.set()


def run(request: dict[str, Any], frames: Frames) -> int:
    for path in request.get("mkdirs", []):
        try:
            os.makedirs(path, exist_ok=True)
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
    frames.control({"pid": child.pid, "pgid": child.pid, "create_time": create_time(child.pid),
                    "start_ticks": start_ticks(child.pid)})
    commands = Commands(child.pid)
    commands.start()
    return relay(child, frames, commands, request)


def _zombie(pid: int) -> bool:
    """Exited, not yet reaped (its agent may be stuck): holds no port any more."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def relay(child: subprocess.Popen[bytes], frames: Frames, commands: Commands, request: dict[str, Any]) -> int:
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
            _killpg(child.pid, signal.SIGTERM)
        elif killing and now - killing > grace:
            _killpg(child.pid, signal.SIGKILL)
        if now - frames.sent > ping_every:  # any frame counts as a ping
            frames.send(b"P", b"")
        progress.forward(frames.control, now)


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _find(task: dict[str, Any]) -> tuple[int, Any] | None:
    """The task's live process as (pid, psutil.Process or None), or None when it is gone."""
    pid, recorded, ticks = task.get("pid"), task.get("create_time"), task.get("start_ticks")
    if pid is None or (recorded is None and ticks is None):
        return None
    now = start_ticks(pid) if ticks is not None else None
    if now is not None:
        if now != ticks:
            return None
    else:
        actual = create_time(pid)
        if actual is None or recorded is None or abs(actual - recorded) > 0.01:
            return None
    if _zombie(pid):
        return None  # exited, not yet reaped: holds no port, runs nothing
    try:
        import psutil

        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else (pid, proc)
    except ImportError:
        return (pid, None)
    except Exception:
        return None


def info(request: dict[str, Any]) -> dict[str, Any]:
    found = {t["name"]: _find(t) for t in request["tasks"]}
    for hit in found.values():
        if hit and hit[1]:
            hit[1].cpu_percent(None)
    time.sleep(0.1 if any(h and h[1] for h in found.values()) else 0)
    result = {}
    for task in request["tasks"]:
        hit = found[task["name"]]
        entry = {"alive": hit is not None, "cpu_percent": None, "rss_mb": None, "progress": None}
        if hit and hit[1]:
            try:
                entry["cpu_percent"] = hit[1].cpu_percent(None)
                entry["rss_mb"] = round(hit[1].memory_info().rss / 2**20, 1)
            except Exception:
                pass
        try:
            with open(task["progress_path"]) as f:
                entry["progress"] = json.load(f)
        except (OSError, ValueError, KeyError):
            pass
        result[task["name"]] = entry
    return result


def signal_tasks(request: dict[str, Any]) -> dict[str, str]:
    """``signal``: each recorded task still alive signalled ("signalled", else "gone"). ``stop``: SIGTERM, up to
    ``grace`` s for them to go, SIGKILL, up to ``kill_wait`` s ("stopped", "killed", "left": alive even so, "gone")."""
    stop = request["mode"] == "stop"
    alive = {t["name"]: t for t in request["tasks"] if _find(t) is not None}
    result = {t["name"]: "gone" if t["name"] not in alive else "left" if stop else "signalled" for t in request["tasks"]}
    steps = [(signal.SIGTERM, "grace", "stopped"), (signal.SIGKILL, "kill_wait", "killed")] if stop else [(request["signal"], "", "")]
    for signum, budget, outcome in steps:
        deadline = time.monotonic() + float(request.get(budget, 0))
        for task in alive.values():
            _killpg(int(task["pid"]), int(signum))
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            for name in [n for n, t in alive.items() if _find(t) is None]:
                result[name] = outcome
                del alive[name]
    return result


def probe(request: dict[str, Any]) -> dict[str, Any]:
    """Facts for ``tfl doctor``; the launcher judges them (this side only reports)."""
    ipv6 = bool(request.get("ipv6"))
    ports = {str(p): _port_state(int(p), ipv6) for p in request.get("ports", [])}
    facts: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable, "ports": ports,
                             "tfl_cache": files.tfl_cache()}
    if request.get("kit"):
        facts.update(kit=files.kit_probe(request["kit"]), packages=files.packages())
    if request.get("quick"):
        return facts
    facts.update(packages=files.packages(), disk=_disk(files.expand(request.get("workdir") or "/")), gpus=_gpus())
    return facts


def _port_state(port: int, ipv6: bool = False) -> str | None:
    """None when free; else what holds it. Binds every interface of the task's address family,
    as TensorFlow's server does."""
    family = socket.AF_INET6 if ipv6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("::" if ipv6 else "0.0.0.0", port))
            return None
        except OSError as exc:
            return exc.strerror or "in use"


def _disk(path: str) -> dict[str, Any]:
    while path and not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"
    stat = os.statvfs(path)
    return {"path": path, "free_gb": round(stat.f_bavail * stat.f_frsize / 1e9, 1)}


def _gpus() -> list[str] | None:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None  # no nvidia-smi here: not a GPU host, or its driver is not installed
    return [line for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def main() -> None:
    handlers = {"info": info, "signal": signal_tasks, "stop": signal_tasks, "probe": probe, "unpack": files.unpack,
                "storage": files.storage, "cleanup": files.cleanup, "remove": files.remove, "unfence": firewall.drop}
    while True:
        line = sys.stdin.readline()
        if not line:
            return  # stdin ended: the requests are done, or the launcher gave up on a pre-started agent
        request = json.loads(line)
        mode = request.get("mode")
        if mode == "run":
            for signum in (signal.SIGHUP, signal.SIGTERM):
                # sshd hung up or is shutting down: as good as losing the launcher, so the
                # relay loop kills the job's group before the agent exits.
                signal.signal(signum, lambda *_: LOST.set())
            frames = Frames()
            frames.raw(MARK.encode())  # the frames follow it
            code = run(request, frames)
            sys.exit(code if 0 <= code < 256 else 128 - code)
        if mode == "fence":  # holds the run's nftables table on this host until the end (agent_firewall)
            sys.exit(firewall.hold(request, _answer))
        _answer(handlers[mode](request))


def _answer(message: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
