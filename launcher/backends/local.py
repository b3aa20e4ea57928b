"""Tasks as local processes, each the leader of its own session and process group."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

import psutil

from launcher import procs
from launcher.backends.base import TaskLive, TaskProcess
from launcher.checks import Check, HostTasks, diagnose, host_tasks, probe_request
from launcher.errors import LaunchError
from launcher.files import open_private
from launcher.logstream import attempt_banner
from launcher.plan import LaunchPlan, TaskLaunch
from launcher.runstore import RunRecord
from launcher.states import TaskState
from launcher.teardown import teardown


class LocalBackend:
    name = "local"
    concurrent_start = False

    def __init__(self, notify: Callable[[], None] = lambda: None) -> None:
        self._notify = notify

    # --- before a run -------------------------------------------------------------------
    def probe(self, hosts: Sequence[HostTasks], *, quick: bool) -> list[Check]:
        return diagnose(hosts, lambda h: ([], self._facts(h, quick)), quick=quick)

    def prepare(self, plan: LaunchPlan) -> list[Check]:
        return self.probe(host_tasks(plan), quick=True)

    @staticmethod
    def _facts(h: HostTasks, quick: bool) -> dict[str, Any] | None:
        """The agent's own probe: in this process for the quick checks (no python to start),
        under the host's python for the full ones (its packages are what counts). The agent is
        the one place host facts are gathered, whatever the backend."""
        from launcher.backends.ssh import agent
        from launcher.backends.ssh.wire import BOOTSTRAP, agent_input, python_failure

        if quick:
            facts = agent.probe(probe_request(h, quick=True))
            facts["executable"] = shutil.which(h.python) or h.python
            for port, held in facts["ports"].items():
                if held is not None:
                    facts["ports"][port] = held + _port_owner(int(port))
            return facts
        try:
            out = subprocess.run([h.python, "-u", "-c", BOOTSTRAP], input=agent_input(probe_request(h)),
                                 capture_output=True, timeout=60)
        except (FileNotFoundError, PermissionError):
            raise LaunchError(f"{h.host}: {python_failure(h.python, 127, b'no such file', h.host)}") from None
        if out.returncode != 0:
            raise LaunchError(f"{h.host}: {python_failure(h.python, out.returncode, out.stderr, h.host)}")
        result: dict[str, Any] = json.loads(out.stdout.decode().splitlines()[-1])
        return result

    # --- a live run ---------------------------------------------------------------------
    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        env = {**os.environ, **launch.env, "TFL_ATTEMPT": str(attempt)}
        if launch.cwd and not os.path.isdir(launch.cwd):
            raise LaunchError(f"{launch.name}: working directory {launch.cwd} does not exist (fix hosts.{launch.host}.workdir)")
        with open_private(launch.log_path) as log:
            if attempt:
                log.write(attempt_banner(launch.name, attempt).encode())
                log.flush()
            try:
                popen = subprocess.Popen(
                    launch.argv, env=env, cwd=launch.cwd, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
            except OSError as exc:
                raise LaunchError(f"{launch.name}: cannot run {launch.argv[0]}: {exc.strerror} "
                                  f"(fix hosts.{launch.host}.python or install it)") from None
        try:
            create_time: float | None = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            create_time = None  # already gone; poll() will report its exit code
        proc = TaskProcess(launch=launch, attempt=attempt, pid=popen.pid, create_time=create_time, pgid=popen.pid, handle=popen)
        threading.Thread(target=self._wait, args=(popen,), name=f"wait-{launch.name}", daemon=True).start()
        return proc

    def _wait(self, popen: subprocess.Popen[bytes]) -> None:
        # Exit is an event: the supervisor wakes at once instead of waiting for its next poll.
        popen.wait()
        self._notify()

    def poll(self, proc: TaskProcess) -> int | None:
        code: int | None = proc.handle.poll()
        return code

    def signal(self, proc: TaskProcess, signum: int) -> None:
        if proc.pgid is None:
            return
        try:
            os.killpg(proc.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already

    def alive(self, proc: TaskProcess) -> bool:
        if proc.handle.poll() is None:
            return True
        if proc.pgid is None:
            return False
        try:
            os.killpg(proc.pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def close(self) -> None:
        pass

    # --- a recorded run -----------------------------------------------------------------
    def inspect(self, record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
        found = {t.task: procs.find_process(t.pid, t.create_time) for t in record.tasks}
        if ask:  # cpu % is measured over an interval: prime every process, then read
            for proc in found.values():
                procs.cpu_percent(proc)
            time.sleep(0.1)
        live = {}
        for task in record.tasks:
            proc = found[task.task]
            gone = task.state == TaskState.RUNNING and proc is None  # recorded as running, vanished
            live[task.task] = TaskLive(
                alive=proc is not None, state="gone" if gone else None,
                cpu_percent=procs.cpu_percent(proc) if ask and proc else None, rss_mb=procs.rss_mb(proc),
                uptime_s=round(time.time() - task.create_time, 1) if proc and task.create_time else None)
        return live

    def stop_recorded(self, record: RunRecord, grace: float) -> int:
        """Every process of the run: the recorded tasks (pid and create time) and anything
        carrying its ``TFL_RUN_ID`` marker, by process group."""
        known = {p.pid: p for t in record.tasks if (p := procs.find_process(t.pid, t.create_time))}
        found = procs.marked_processes(record.run_id, known)
        teardown(found, signal=procs.signal_group, alive=procs.is_running, grace=grace, kill_wait=5.0)
        return len(found)


def _port_owner(port: int) -> str:
    try:
        for conn in psutil.net_connections("tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f", by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except (psutil.Error, OSError):
        pass
    return ""
