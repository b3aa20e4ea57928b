"""``tfl launch``: cluster spec -> plan -> preflight -> supervised run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

import psutil

from launcher.backends import Backend, make_backend
from launcher.errors import LaunchError, UsageError
from launcher.files import open_private, write_atomic
from launcher.logstream import LogFollower, tail_lines
from launcher.plan import LaunchPlan, build_plan, job_name
from launcher.remoteplan import RemoteOptions
from launcher.runstore import RunRecord, RunStore
from launcher.spec import ClusterSpec
from launcher.supervisor import BackendFactory, Supervisor, SupervisorConfig, initial_record


def make_plan(job: str, job_args: tuple[str, ...], spec: ClusterSpec, store: RunStore,
              remote: RemoteOptions = RemoteOptions(), virtual_devices: int | None = None) -> LaunchPlan:
    path = Path(job)
    if not path.is_file():
        raise UsageError(f"{job}: no such job script (give the path of a Python file, e.g. jobs/mnist.py)")
    run_id = store.new_run_id(job_name(job))
    for folder in remote.sync_dirs:
        if not os.path.isdir(folder):
            raise UsageError(f"--sync {folder}: no such directory (give a directory to copy to every SSH host)")
    return build_plan(spec, str(path.resolve()), job_args, run_id=run_id, run_dir=str(store.run_dir(run_id)),
                      python=sys.executable, cwd=os.getcwd(), remote=remote, virtual_devices=virtual_devices)


def preflight(plan: LaunchPlan, *, remote: bool = False) -> None:
    """Quick checks before anything starts: every local task's port is free. With ``remote``,
    also every SSH host's (reachable, authenticated, its python, the tasks' ports free; all
    hosts at once); without it, ``execute`` makes those checks as it reaches the hosts."""
    for task in plan.tasks:
        if task.backend == "local" and not task.task.type == "evaluator":
            _check_port_free(task.name, task.host, task.port)
    if remote and any(t.backend == "ssh" for t in plan.tasks):
        from launcher.doctor import preflight_remote

        preflight_remote(plan)


def _check_port_free(name: str, host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError:
            raise LaunchError(f"{name}: port {port} on {host} is already in use{_port_owner(port)}; "
                              "free it or give the task another port (or use --local N for free ports)") from None


def _port_owner(port: int) -> str:
    try:
        for conn in psutil.net_connections("tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f" by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except (psutil.Error, OSError):
        pass
    return ""


def execute(plan: LaunchPlan, store: RunStore, config: SupervisorConfig, out: TextIO | None, *,
            colour: bool = False, reserved: bool = False) -> RunRecord:
    """Start the plan and supervise it to the end, streaming every task's output to ``out``."""
    hosts = _ssh_hosts(plan)  # before the run exists: a host that fails its checks fails the launch cleanly
    record = initial_record(plan, created=time.time(), max_restarts=config.max_restarts)
    me = psutil.Process()
    record.launcher_pid, record.launcher_create_time = me.pid, me.create_time()
    store.create(record, reserved=reserved)
    supervisor = Supervisor(plan, record, store, config, backend_factory=_backends(hosts))
    follower = LogFollower([(t.name, t.log_path) for t in plan.tasks], out, colour=colour).start() if out else None
    try:
        with _stop_on_signals(supervisor):
            return supervisor.run()
    finally:
        if follower:
            follower.stop()
        if hosts is not None:
            hosts.close()


def _ssh_hosts(plan: LaunchPlan) -> Any:
    """Connections to every SSH host (opened in parallel, code shipped), or None without any."""
    if not any(t.backend == "ssh" for t in plan.tasks):
        return None
    from launcher.backends.ssh import prepare_hosts

    return prepare_hosts(plan)


def _backends(hosts: Any) -> BackendFactory:
    if hosts is None:
        return make_backend

    def factory(name: str, notify: Callable[[], None]) -> Backend:
        if name != "ssh":
            return make_backend(name, notify)
        from launcher.backends.ssh import SSHBackend

        return SSHBackend(notify=notify, pool=hosts)

    return factory


def detach(plan: LaunchPlan, store: RunStore, config: SupervisorConfig, timeout: float = 20.0) -> int:
    """Run the supervisor as a background process in its own session; returns its pid.

    Returns once the run is recorded, so ``tfl status`` sees it at once.
    """
    run_dir = Path(plan.run_dir)
    store.reserve(run_dir)  # 0700, never an existing dir; the launcher's store.create(reserved=True) fills it
    plan_file = run_dir / "plan.json"
    write_atomic(plan_file, json.dumps(plan.to_dict()))  # 0600: it holds every task's env
    with open_private(run_dir / "launcher.log") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "launcher", "_supervise", str(plan_file), json.dumps(asdict(config))],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "TFL_HOME": str(store.home)})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (run_dir / "state.json").exists() and store.load(plan.run_id).launcher_pid == child.pid:
            return child.pid
        if child.poll() is not None:
            tail = " | ".join(tail_lines(run_dir / "launcher.log", 3))
            raise LaunchError(f"the detached launcher exited with code {child.returncode}: {tail}")
        time.sleep(0.05)
    return child.pid


def supervise_detached(plan_file: Path, config_json: str, store: RunStore) -> RunRecord:
    """The body of a detached launcher (``tfl _supervise``)."""
    plan = LaunchPlan.from_dict(json.loads(plan_file.read_text()))
    return execute(plan, store, SupervisorConfig(**json.loads(config_json)), None, reserved=True)


@contextmanager
def _stop_on_signals(supervisor: Supervisor) -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP stop the run gracefully; a second one forces SIGKILL."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = 0

    def handler(signum: int, frame: object) -> None:
        nonlocal received
        received += 1
        supervisor.request_stop(force=received > 1)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
