"""The task runner: what each Ray actor of a tfl run is, on its node. NODE SIDE.

Stdlib only (and the ``ray`` the actor runs in, never imported here): shipped with the job
kit in the run's ``py_modules``, so a node needs Ray and TensorFlow, not tfl. The backend
(``launcher.engines.ray``) wraps ``TaskRunner`` with ``ray.remote`` and calls it:

1. ``reserve()``: bind a port on this node and report node id, address and port. The socket
   is held (bound, not listening) so no other process can take the port while the launcher
   gathers every task's address.
2. ``start(argv, env, attempt)``: release the port and at once start the job script as a
   subprocess in its own session, TF_CONFIG in its environment (never on a command line),
   its output into a file here. The subprocess dies with the actor (``PR_SET_PDEATHSIG``):
   an actor's death, or its node's, never leaves TensorFlow running.
3. ``read(offset)``: new output since ``offset``, the progress file, the exit code, so the
   launcher writes them into the task's log and progress files on its machine.
4. ``signal(n)`` / ``alive()`` / ``info()``: the task's process group, as the supervisor
   and ``tfl stop`` / ``tfl status`` see it.
5. ``close()``: stop the task's group and remove the task's dirs here, its private temp dir among
   them (its TMPDIR: what a task killed with SIGKILL wrote there goes too; docs/security.md).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any

NODE_DIR = "{tfl-node}"  # as in launcher.engines.ray.plan (which the node side does not import)
PR_SET_PDEATHSIG = 1
ADDRESS_IN_USE = ("Address already in use", "Could not start gRPC server", "Failed to add port")
READ_LIMIT = 1 << 20  # bytes of output per read
TMP_PREFIX = "tfl-tmp-"  # launcher.engines.ssh.node.agent_tmp.PREFIX (the node side imports no other engine)
TMP_VARS = ("TMPDIR", "TEMP", "TMP")  # what Python's tempfile reads, each set to the task's private temp dir


def _kit_root() -> str:
    """The dir that holds the shipped ``launcher`` package (py_modules), for the job's PYTHONPATH."""
    here = os.path.abspath(__file__)  # <root>/launcher/engines/ray/node/runner.py
    for _ in range(5):
        here = os.path.dirname(here)
    return here


def _die_with_parent() -> None:  # pragma: no cover (runs in the child between fork and exec)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class TaskRunner:
    """One task of a run, on the node its bundle is on."""

    def __init__(self, run_id: str, slug: str) -> None:
        base = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tfl", "ray")
        os.makedirs(base, mode=0o700, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix=f"{run_id}-{slug}-", dir=base)  # 0700
        self.slug, self.run_id = slug, run_id
        self.tmp: str | None = None  # the task's private temp dir, made at its first start (``start``)
        self.sock: socket.socket | None = None
        self.popen: subprocess.Popen[bytes] | None = None
        self.log = os.path.join(self.dir, "output.log")
        self.started_at = 0
        # The job dir and the kit, copied from what Ray unpacked for this actor (its working_dir and
        # py_modules) into the task's own dir: Ray may collect its copies while the run still needs them
        # (a restart after another actor's death released them).
        self.workdir = os.path.join(self.dir, "job")
        self.kit = os.path.join(self.dir, "kit")
        shutil.copytree(os.getcwd(), self.workdir, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(os.path.join(_kit_root(), "launcher"), os.path.join(self.kit, "launcher"),
                        ignore=shutil.ignore_patterns("__pycache__"))

    def reserve(self) -> dict[str, Any]:
        """Bind a fresh port and hold it; this node's id and address, and the port."""
        import ray  # the actor's own Ray: there on every node

        self._release()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("", 0))
        self.sock = sock
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "host": _node_ip(), "port": sock.getsockname()[1],
                "pid": os.getpid()}

    def _release(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def start(self, argv: list[str], env: dict[str, str], attempt: int) -> dict[str, Any]:
        """Release the held port and start the job; its pid (and process group) and where its output begins."""
        if self.popen is not None and self.popen.poll() is None:
            raise RuntimeError(f"{self.slug}: the previous attempt is still running")
        env = {k: v.replace(NODE_DIR, self.dir) for k, v in env.items()}
        os.makedirs(os.path.join(self.dir, "progress"), mode=0o700, exist_ok=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.kit, env.get("PYTHONPATH")) if p)
        if self.tmp is None:  # in the node's temp dir (the TMPDIR the description gives, the worker's, /tmp): 0700, random
            self.tmp = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{self.run_id}-", dir=env.get(TMP_VARS[0]) or None)
        env.update(dict.fromkeys(TMP_VARS, self.tmp))
        argv = [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
        self.progress = env.get("TFL_PROGRESS_FILE")
        with open(self.log, "ab") as out:
            offset = self.started_at = out.tell()  # where this start's output begins (earlier output is relayed already)
            self._release()  # just before TensorFlow binds it
            self.popen = subprocess.Popen(argv, env={**os.environ, **env}, cwd=self.workdir, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
        return {"pid": self.popen.pid, "attempt": attempt, "offset": offset}

    def read(self, offset: int) -> dict[str, Any]:
        """Output from ``offset`` on, the progress file's text, and the exit code once exited."""
        code = self.popen.poll() if self.popen is not None else None
        data = b""
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                data = f.read(READ_LIMIT)
        except FileNotFoundError:
            pass
        progress = None
        if self.progress:
            try:
                with open(self.progress, "rb") as f:
                    progress = f.read()
            except OSError:
                pass
        more = len(data) == READ_LIMIT
        ended = None if more else code
        return {"data": data, "progress": progress, "exit": ended, "address_in_use": bool(ended) and self._address_in_use()}

    def _address_in_use(self) -> bool:
        """Whether the job's last output says its port was taken (TensorFlow's server could not bind it)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(max(self.started_at, os.path.getsize(self.log) - 65536))  # this start's output only
                tail = f.read().decode(errors="replace")
        except OSError:
            return False
        return any(marker in tail for marker in ADDRESS_IN_USE)

    def signal(self, signum: int) -> None:
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def alive(self) -> bool:
        """Whether any process of the task's group lives (its leader is kept unreaped until then)."""
        if self.popen is None:
            return False
        if self.popen.poll() is None:
            return True
        return bool(_group_members(self.popen.pid))

    def info(self) -> dict[str, Any]:

        return {"alive": self.alive(), "host": _node_ip(), "pid": self.popen.pid if self.popen else None}

    def close(self, grace: float = 5.0) -> None:
        """Stop the task's group and remove this task's dir on the node (idempotent)."""
        self._release()
        if self.popen is not None and self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


def _group_members(pgid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(name))
    return found
