"""The wire protocol between the launcher and the tfl agent on a host.

The remote command line is only ``python -u -c BOOTSTRAP``: the agent's source and its
request (JSON lines) follow on stdin, so neither TF_CONFIG nor any job argument passes
through a remote shell or shows in ``ps``. A one-shot request (probe, info, signal)
answers one JSON line; a ``run`` request streams frames (see ``agent.Frames``). Every
answer starts with ``MARK``; what the login shell printed before it is skipped.

The job kit (``launcher/__init__.py``, ``launcher/contract.py``, ``launcher/jobkit/``)
travels as one more tarball (``kit_archive``): tasks on a host need nothing of tfl.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import shlex
import tarfile
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from launcher.engines.ssh.connect import finish_command, send_all, start_command
from launcher.engines.ssh.failures import SSHError
from launcher.errors import UsageError

if TYPE_CHECKING:
    from fabric import Connection
    from paramiko import Channel

    from launcher.plan.launch_plan import TaskLaunch

HERE = Path(__file__).parent
# The agent's helper modules (as the agent imports them), then the agent itself.
AGENT_SOURCES = [["tfl_agent_files", (HERE / "node" / "agent_files.py").read_text()],
                 ["tfl_agent_firewall", (HERE / "node" / "agent_firewall.py").read_text()],
                 ["tfl_agent_tmp", (HERE / "node" / "agent_tmp.py").read_text()],
                 ["tfl_agent_tasks", (HERE / "node" / "agent_tasks.py").read_text()],
                 (HERE / "node" / "agent.py").read_text()]
# The whole remote command line: the agent's sources and its request follow on stdin.
BOOTSTRAP = ("import sys,json,types;s=json.loads(sys.stdin.readline())\n"
             "for n,c in s[:-1]:m=sys.modules[n]=types.ModuleType(n);exec(c,m.__dict__)\n"
             "exec(s[-1])  # tfl-agent")
MARK = b"\x1etfl\x1e"  # starts each of the agent's answers (agent.MARK)
LAUNCHER_DIR = HERE.parents[1]
KIT_FILES = (("__init__.py", "launcher/__init__.py"), ("contract.py", "launcher/contract.py"), ("jobkit", "launcher/jobkit"))
# Directories never worth shipping with --sync (virtualenvs, VCS data, caches).
LINE_BYTES = 3 << 14  # 48 KiB of tarball per base64 line of a Payload (a multiple of 3: each line decodes alone)
SEND_BLOCK = 1 << 20  # bytes of a Payload read and sent at a time
SKIP_DIRS = frozenset({".git", ".hg", ".venv", "venv", "__pycache__", ".mypy_cache", ".pytest_cache",
                       ".ruff_cache", "node_modules", ".ipynb_checkpoints"})


def agent_command(python: str) -> str:
    """The remote shell command that starts the agent under the host's python."""
    return f"exec {shlex.join([python, '-u', '-c', BOOTSTRAP])}"


# The agent's first stdin line, encoded once: it goes to every agent started (38 KB of JSON, 0.2 ms each).
_SOURCES_LINE = (json.dumps(AGENT_SOURCES) + "\n").encode()


def agent_input(request: dict[str, Any] | None) -> bytes:
    """The agent's stdin: its source, then the request (None: the request follows later)."""
    return _SOURCES_LINE + ((json.dumps(request) + "\n").encode() if request else b"")


def agent_request(conn: Connection, python: str, request: dict[str, Any], timeout: float = 60.0) -> Any:
    """Run one non-``run`` agent request (probe, info, signal) and return its JSON answer."""
    return agent_answer(conn, python, agent_start(conn, python, request, timeout), timeout)


def agent_start(conn: Connection, python: str, request: dict[str, Any], timeout: float = 60.0) -> Channel:
    """An agent started on the host with ``request``; ``agent_answer`` waits for its answer."""
    return start_command(conn, agent_command(python), agent_input(request), timeout)


def agent_answer(conn: Connection, python: str, chan: Channel, timeout: float = 60.0) -> Any:
    """The JSON answer of an ``agent_start``, waited for up to ``timeout`` s."""
    code, out, err = finish_command(conn, chan, "the tfl agent", timeout)
    if code != 0 or MARK not in out:
        raise SSHError(conn.host, python_failure(python, code, err, conn.host))
    return reply(out)


def reply(out: bytes) -> Any:
    """The agent's one-line answer in ``out``, after anything a login shell printed first."""
    return json.loads(out.rpartition(MARK)[2])




def kit_archive(dest: str) -> dict[str, str]:
    """The job kit as an ``unpack`` archive: ``dest/launcher/...``, at this launcher's version."""
    return {"dest": dest, "data": _kit_tarball()}


def kit_data() -> str:
    """The job kit for a ``probe`` request: the agent imports it from a private temp dir."""
    return _kit_tarball()


def python_failure(python: str, code: int | None, stderr: bytes, host: str) -> str:
    said = " | ".join(stderr.decode(errors="replace").strip().splitlines()[-2:]) or (
        f"exit status {code}" if code != 0 else "it ended without the agent's answer: is it a python?")
    if code == -1 and not stderr.strip():
        # paramiko's "no exit status": sshd sent exit-signal (the agent was killed) or the connection went
        return (f"the tfl agent under '{python}' ended with no exit status (killed by a signal, or its SSH connection "
                f"was lost); try again, and if it recurs check {host} and hosts.{host}.python")
    if code == 127:
        return f"python '{python}' not found ({said}); set hosts.{host}.python to a python that has tensorflow"
    return f"the tfl agent failed under '{python}' ({said}); set hosts.{host}.python to a Python >= 3.8"


class Payload:
    """A tarball sent after its request, as ``lines`` base64 lines (``LINE_BYTES`` each before encoding),
    kept in an unnamed temp file (0600, gone with its descriptor): its size never sits in memory, here
    or on the host (the agent spools it to disk the same way). Several hosts' threads send it at once."""

    def __init__(self, tarball: BinaryIO) -> None:
        self.file, self.lines = tempfile.TemporaryFile(), 0
        with tarball:
            tarball.seek(0)
            while block := tarball.read(LINE_BYTES):
                self.file.write(base64.b64encode(block) + b"\n")
                self.lines += 1
        self.file.flush()
        self.size = self.file.tell()

    def send(self, chan: Channel) -> None:
        fd, sent = self.file.fileno(), 0
        while sent < self.size:  # pread: no shared file offset between the hosts' threads
            block = os.pread(fd, min(SEND_BLOCK, self.size - sent), sent)
            send_all(chan, block)
            sent += len(block)

    def close(self) -> None:
        self.file.close()


class Tarballs:
    """The tarballs of one launch, each built once and shared by every host it goes to: the same
    files go to each host, only their destination differs. ``of``: inline (base64 in the request),
    for the small job kit; ``payload``: sent after the request (``Payload``), for the code, whatever
    its size. Safe from several threads; ``close`` drops the payloads' temp files."""

    def __init__(self) -> None:
        self._built: dict[tuple[tuple[str, str], ...], str] = {}
        self._payloads: dict[tuple[tuple[str, str], ...], Payload] = {}
        self._lock = threading.Lock()
        self.builds = 0  # how many were built (a test's proof)

    def of(self, items: list[tuple[str, str]]) -> str:
        key = tuple(items)
        with self._lock:  # one build per key; the others wait for it rather than build it again
            if key not in self._built:
                with _tarball(items) as tarball:
                    tarball.seek(0)
                    self._built[key] = base64.b64encode(tarball.read()).decode()
                self.builds += 1
            return self._built[key]

    def payload(self, items: list[tuple[str, str]]) -> Payload:
        key = tuple(items)
        with self._lock:
            if key not in self._payloads:
                self._payloads[key] = Payload(_tarball(items))
                self.builds += 1
            return self._payloads[key]

    def close(self) -> None:
        with self._lock:
            for payload in self._payloads.values():
                payload.close()
            self._payloads.clear()


_KIT = Tarballs()  # this launcher's kit, built once per process (hosts reached at once wait for the one build)


def _kit_tarball() -> str:
    return _KIT.of([(str(LAUNCHER_DIR / local), name) for local, name in KIT_FILES])


def archives(copies: Iterable[tuple[str, str]], tarballs: Tarballs | None = None) -> list[dict[str, str]]:
    """Files and directory contents to copy, as the agent's ``unpack`` request takes them:
    one gzipped tarball (base64) per destination directory (``tarballs``: the launch's, built once)."""
    tarballs = tarballs or Tarballs()
    return [{"dest": dest, "data": tarballs.of(items)} for dest, items in _by_dest(copies).items()]


def streamed_archives(copies: Iterable[tuple[str, str]], tarballs: Tarballs) -> tuple[list[dict[str, Any]], list[Payload]]:
    """``archives`` whose tarballs follow the request (``converse``'s ``payloads``) rather than sit in
    it: ``{"dest", "lines"}`` each, and the payloads to send, in that order."""
    by_dest = _by_dest(copies)
    payloads = [tarballs.payload(items) for items in by_dest.values()]
    return [{"dest": dest, "lines": p.lines} for dest, p in zip(by_dest, payloads, strict=True)], payloads


def _by_dest(copies: Iterable[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    by_dest: dict[str, list[tuple[str, str]]] = {}
    for local, remote in copies:
        dest = os.path.dirname(remote) if os.path.isfile(local) else remote
        by_dest.setdefault(dest, []).append((local, os.path.basename(remote) if os.path.isfile(local) else "."))
    return by_dest


def converse(chan: Channel, request: dict[str, Any], host: str, python: str, payloads: Iterable[Payload] = ()) -> dict[str, Any]:
    """One request to an agent waiting for more (a pre-started one) and its one-line answer;
    ``payloads`` (an unpack request's code) are sent right after the request's line."""
    answer = b""
    try:
        send_all(chan, (json.dumps(request) + "\n").encode())
        for payload in payloads:
            payload.send(chan)
        while not (MARK in answer and answer.endswith(b"\n")):
            data = chan.recv(65536)
            if not data:
                break
            answer += data
    except OSError as exc:  # socket.timeout included; or the agent is gone already (see below)
        if not chan.status_event.wait(1.0):
            raise SSHError(host, f"the tfl agent did not answer its {request['mode']} request ({type(exc).__name__} {exc})") from None
    if not (MARK in answer and answer.endswith(b"\n")):  # the agent is gone: its python is missing, too old, or crashed
        chan.status_event.wait(5.0)
        code = chan.exit_status if chan.exit_status_ready() else None
        stderr = chan.recv_stderr(65536) if chan.recv_stderr_ready() else b""
        raise SSHError(host, python_failure(python, code, stderr, host))
    result: dict[str, Any] = reply(answer)
    return result


def _tarball(items: list[tuple[str, str]]) -> BinaryIO:
    """The gzipped tarball of ``items``, in an unnamed temp file (a job dir's size never sits in memory)."""
    spool = tempfile.TemporaryFile()
    try:
        with tarfile.open(fileobj=spool, mode="w:gz") as tar:
            for local, name in items:
                tar.add(local, arcname=name, filter=functools.partial(_shipped, local=local))
    except BaseException:
        spool.close()
        raise
    return spool


def _shipped(info: tarfile.TarInfo, local: str) -> tarfile.TarInfo | None:
    """``info`` as shipped (None: a cache, left out). A symlink out of the directory, a FIFO or a device
    file is refused here, in one line naming it: the hosts' unpack (tarfile's "data" filter) would refuse
    it, host by host, in a line that blamed the workdir and the disk."""
    if any(p in SKIP_DIRS for p in info.name.split("/")) or info.name.endswith(".pyc"):
        return None
    name = info.name.removeprefix("./")
    if info.issym() and _escapes(info.name, info.linkname):
        raise UsageError(f"--sync {local}: {name} is a symlink to {info.linkname}, outside the directory, which the hosts "
                         "refuse to unpack; remove it, or point it inside the directory with a relative path")
    if info.isfifo() or info.isdev():
        kind = "a named pipe (FIFO)" if info.isfifo() else "a device file"
        raise UsageError(f"--sync {local}: {name} is {kind}, which the hosts refuse to unpack; remove it from the "
                         "directory, or move it out")
    return info


def _escapes(name: str, target: str) -> bool:
    return os.path.isabs(target) or os.path.normpath(os.path.join(os.path.dirname(name), target)).split("/")[0] == ".."


def cleanup_request(tasks: list[TaskLaunch]) -> dict[str, Any] | None:
    """What to remove on the host of ``tasks`` (already on that host's paths), or None."""
    dirs = tasks[0].dirs
    if dirs is None or not (dirs.remove or dirs.rmdir):
        return None
    return {"mode": "cleanup", "remove": list(dirs.remove), "rmdir": list(dirs.rmdir)}
