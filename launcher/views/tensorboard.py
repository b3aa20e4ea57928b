"""``tfl tensorboard``: TensorBoard on a run's model dir, for as long as the command runs.

The model dir is where the job kit writes: the chief's ``TFL_MODEL_DIR`` (shared storage,
when the cluster file names one), else ``<TFL_RUN_DIR>/model``, unless the job was given
``--model-dir``. When this machine cannot read it (the chief ran on another host, no shared
storage here), the command says how to reach it through SSH instead of starting anything: TensorBoard
there gets a private temp dir too (``REMOTE_TMPDIR``).

TensorBoard runs with its own stand-in for TensorFlow (its ``notf`` switch): reading local
event files needs nothing more, and it starts in seconds instead of importing TensorFlow.
It listens on the loopback address only, and stops with the command (Ctrl-C, SIGTERM, or
the command dying: it gets SIGTERM then). Its temp files go to a private dir of the run dir's
(``TMPDIR``), removed when it stops: left to itself TensorBoard writes its pid, port and logdir
into ``/tmp/.tensorboard-info``, a fixed dir it makes 0777 without the sticky bit, where any
user can delete or swap (symlink) its files, or make that dir first so that TensorBoard fails.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from launcher.contract import CHIEF, MODEL_DIR, MODEL_SUBDIR, RUN_DIR
from launcher.describe.hosts import SSHTarget
from launcher.engines.teardown import teardown
from launcher.errors import LaunchError, UsageError
from launcher.files import open_private
from launcher.plan.launch_plan import LaunchPlan
from launcher.records.store import RunRecord
from launcher.tasklog import tail_lines

HOST = "127.0.0.1"
TMP_PREFIX = "tensorboard-tmp-"  # TensorBoard's private TMPDIR in the run dir: also what marks it as the run's
DEFAULT_PORT = 6006
# TensorBoard without TensorFlow: its `tensorboard.compat.notf` switch, then its own main.
NO_TF_MAIN = ("import sys, types; sys.modules['tensorboard.compat.notf'] = types.ModuleType('tensorboard.compat.notf'); "
              "from tensorboard.main import run_main; run_main()")

# The remote TensorBoard's TMPDIR, as here: a private dir (mktemp -d: 0700, a random name) removed when it ends, never
# the shared /tmp/.tensorboard-info. For the remote login shell (POSIX, as the quoting of the rest), without a single
# quote in it, so that the whole command stays one readable single-quoted argument of ssh.
REMOTE_TMPDIR = ('d=$(mktemp -d "${TMPDIR:-/tmp}/' + TMP_PREFIX + 'XXXXXXXX") && trap "rm -rf -- \\"\\$d\\"" EXIT && '
                 'trap "exit 129" HUP INT TERM && TMPDIR=$d ')


@dataclass(frozen=True)
class ModelDir:
    path: str
    host: str | None = None  # the host it is on, when this machine cannot read it
    ssh: SSHTarget | None = None
    python: str = sys.executable  # the python there


def model_dir_of(record: RunRecord) -> ModelDir:
    """Where the run's chief writes its model dir, and whether it is readable here."""
    given = model_dir_arg(record.job_args)
    if not record.plan:
        return ModelDir(given or f"{record.run_dir}/{MODEL_SUBDIR}")
    tasks = LaunchPlan.from_dict(record.plan).tasks
    chief = next((t for t in tasks if t.task.type == CHIEF), None) or next(t for t in tasks if t.task.is_training)
    path = given or chief.env.get(MODEL_DIR) or f"{chief.env.get(RUN_DIR, record.run_dir)}/{MODEL_SUBDIR}"
    if given and not os.path.isabs(given) and chief.cwd:
        path = os.path.join(chief.cwd, given)
    if chief.ssh is None or "://" in path or os.path.isdir(path):
        return ModelDir(path)
    return ModelDir(path, chief.host, chief.ssh, chief.python)


def model_dir_arg(args: list[str]) -> str | None:
    """The job's own ``--model-dir`` among its arguments, as given, or None."""
    for i, arg in enumerate(args):
        if arg == "--model-dir" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--model-dir="):
            return arg.split("=", 1)[1]
    return None


def reach_hint(run_id: str, where: ModelDir, port: int) -> str:
    """How to see a model dir that lies on another host: TensorBoard there, a tunnel here. ``-t``: a
    terminal there, so that Ctrl-C here (or the connection lost: its SIGHUP) reaches TensorBoard and the
    shell whose trap removes its temp dir; without one sshd tells the remote command nothing as ssh goes."""
    assert where.ssh is not None and where.host is not None
    ssh = ["ssh", "-t", *ssh_options(where.ssh), "-L", f"{port}:{HOST}:{port}", _login(where.ssh.user, where.host)]
    remote = REMOTE_TMPDIR + shlex.join([where.python, "-m", "tensorboard.main", "--logdir", where.path, "--port", str(port),
                                         "--host", HOST])
    return "\n".join([f"run {run_id}: its model dir {where.path} is on {where.host}, not readable here; start TensorBoard "
                      "there through an SSH tunnel:",
                      f"  {shlex.join(ssh)} {shlex.quote(remote)}",
                      f"then open http://{HOST}:{port}/"])


def ssh_options(target: SSHTarget) -> list[str]:
    """ssh's options that reach ``target`` the way tfl did: its port and key, the cluster file's known_hosts
    and ssh config, and its bastion (``ssh.jump``, logged into with the same key and known_hosts, as tfl
    does: a ProxyCommand, since ``ssh -J`` would not pass them on). A ProxyJump of the ssh config is ssh's own."""
    options = ["-p", str(target.port), *(["-i", target.identity_file] if target.identity_file else [])]
    options += ["-o", f"UserKnownHostsFile={target.known_hosts_file}"] if target.known_hosts else []
    options += ["-F", target.config] if target.config else []
    if target.jump == "none":
        return [*options, "-o", "ProxyJump=none"]
    if target.jump:
        from launcher.describe.fields import split_jump  # pydantic's: `tfl status` imports this module

        user, host, jump_port = split_jump(target.jump)
        bastion = ["ssh", *options[2:], "-o", "ProxyJump=none", *(["-p", str(jump_port)] if jump_port else []),
                   "-W", "%h:%p", _login(user or target.user, host)]
        options += ["-o", f"ProxyCommand={shlex.join(bastion)}"]
    return options


def _login(user: str | None, host: str) -> str:
    return f"{user + '@' if user else ''}{host}"


def free_port(wanted: int | None) -> int:
    """``wanted`` if it is free on the loopback address, else a one-line error; without it,
    the first free port from 6006."""
    for port in [wanted] if wanted is not None else range(DEFAULT_PORT, DEFAULT_PORT + 100):
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
                return port
            except OSError:
                continue
    if wanted is not None:
        raise UsageError(f"--port {wanted}: {HOST}:{wanted} is in use; give another port or leave --port out")
    raise UsageError(f"no free port on {HOST} from {DEFAULT_PORT} to {DEFAULT_PORT + 99}; give one with --port")


def serve(record: RunRecord, port: int | None, out: TextIO, *, ready_timeout: float = 120.0) -> int:
    """TensorBoard on the run's model dir until Ctrl-C or SIGTERM (exit code 0), or until it
    fails (its exit code); or, for a model dir on another host, how to reach it (0)."""
    where = model_dir_of(record)
    if where.host is not None:
        out.write(reach_hint(record.run_id, where, port or DEFAULT_PORT) + "\n")
        return 0
    port = free_port(port)
    log_path = Path(record.run_dir) / "tensorboard.log"
    main = ["-m", "tensorboard.main"] if "://" in where.path else ["-c", NO_TF_MAIN]  # a URL needs TensorFlow's file systems
    private_tmp = tempfile.mkdtemp(prefix=TMP_PREFIX, dir=record.run_dir)  # 0700; left by a kill -9, goes with tfl rm
    try:
        with open_private(log_path) as log:  # 0600 as every file of the run dir, whatever the umask
            proc = subprocess.Popen([sys.executable, *main, "--logdir", where.path, "--port", str(port), "--host", HOST],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent, env={**os.environ, "TMPDIR": private_tmp})
    except BaseException:
        shutil.rmtree(private_tmp, ignore_errors=True)
        raise
    try:
        with _interrupt_on_sigterm():
            _wait_ready(proc, port, log_path, ready_timeout)
            out.write(f"TensorBoard for run {record.run_id}: http://{HOST}:{port}/\n"
                      f"  logdir {where.path}; its log {log_path}; Ctrl-C stops it\n")
            if "://" not in where.path and not has_events(where.path):
                out.write(f"  no event files under {where.path} yet: TensorBoard shows them as the job writes them\n")
            out.flush()
            code = proc.wait()  # it ends on its own only when it fails
        raise LaunchError(f"TensorBoard exited with code {code}: {' | '.join(tail_lines(log_path, 3))}")
    except KeyboardInterrupt:
        return 0
    finally:
        teardown([proc], signal=lambda p, n: p.send_signal(n) if p.poll() is None else None,
                 alive=lambda p: p.poll() is None, grace=5.0)
        shutil.rmtree(private_tmp, ignore_errors=True)


def serving() -> dict[str, int]:
    """Run dir (real path) -> the pid of a TensorBoard that ``tfl tensorboard`` serves it with now, among this
    user's processes: its TMPDIR is the private dir ``serve`` made in that run dir."""
    import psutil

    found: dict[str, int] = {}
    for proc in psutil.process_iter(["uids", "cmdline"]):
        try:
            uids, argv = proc.info["uids"], proc.info["cmdline"] or []
            if uids is None or uids.real != os.getuid() or "--logdir" not in argv:
                continue
            tmp = proc.environ().get("TMPDIR", "")
        except psutil.Error:  # gone, or a zombie
            continue
        if os.path.basename(tmp).startswith(TMP_PREFIX):
            found.setdefault(os.path.realpath(os.path.dirname(tmp)), proc.pid)
    return found


def has_events(path: str) -> bool:
    """Whether TensorBoard finds anything to show under ``path`` (its event files)."""
    return any(name.startswith("events.out.tfevents") for _, _, files in os.walk(path) for name in files)


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"TensorBoard exited with code {proc.returncode} before it served: "
                              f"{' | '.join(tail_lines(log_path, 3))}")
        if _listens(proc.pid, port):
            return
        time.sleep(0.1)
    raise LaunchError(f"TensorBoard did not listen on {HOST}:{port} within {timeout:g} s (see {log_path})")


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself listens on ``port``. Not "something answers there": a program that
    took the port between ``free_port``'s look and TensorBoard's bind (another `tfl tensorboard` picking
    6006 in the seconds before this one's TensorBoard binds it) answers too, and its URL would be said."""
    import psutil

    try:
        return any(conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
                   for conn in psutil.Process(pid).net_connections("tcp"))
    except psutil.NoSuchProcess:  # gone: the caller's poll says how it ended
        return False
    except (psutil.Error, OSError):  # a /proc that does not tell (a sandbox's): whatever answers on the port
        with socket.socket() as sock:
            return sock.connect_ex((HOST, port)) == 0


def _die_with_parent() -> None:
    """In the child: SIGTERM when tfl itself dies (Linux), so TensorBoard never outlives it."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextmanager
def _interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM and SIGHUP end the command like Ctrl-C does (TensorBoard is stopped first)."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
