"""``tfl status`` and ``tfl stop`` for a recorded SSH run: ask its hosts, all at once.

The launcher watches its remote tasks through their agents; these functions are for
other processes (``tfl status RUN``, ``tfl stop`` when the launcher is gone). Each host
runs one agent request (``info`` or ``signal``) for all its recorded tasks. A pid counts
as the task only if its create time matches the recorded one, since pids get reused.
fabric is imported only when a host is actually asked.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from launcher.backends.base import TaskLive
from launcher.backends.ssh.connect import connect
from launcher.backends.ssh.wire import agent_request
from launcher.contract import PROGRESS_FILE
from launcher.hosts import SSHTarget
from launcher.parallel import parallel
from launcher.plan import LaunchPlan
from launcher.procs import launcher_identity
from launcher.runstore import RunRecord
from launcher.states import TaskState
from launcher.teardown import teardown

HostTasks = dict[str, tuple[SSHTarget, str, list[dict[str, Any]]]]


def _recorded(record: RunRecord) -> HostTasks:
    """host -> (how to reach it, its python, the recorded tasks there with a pid)."""
    launches = {t.name: t for t in LaunchPlan.from_dict(record.plan).tasks if t.ssh}
    hosts: HostTasks = {}
    for task in record.tasks:
        launch = launches.get(task.task)
        if launch is None or task.pid is None or launch.ssh is None:
            continue
        # Never accept a new host key here: the launch already recorded the host's key.
        target = replace(launch.ssh, accept_new_host_keys=False)
        entry = hosts.setdefault(launch.host, (target, launch.python, []))
        entry[2].append({"name": task.task, "pid": task.pid, "create_time": task.create_time, "start_ticks": task.start_ticks,
                         "progress_path": launch.env.get(PROGRESS_FILE, "")})
    return hosts


def _ask_hosts(record: RunRecord, request: dict[str, Any]) -> dict[str, Any]:
    hosts = _recorded(record)

    def ask(host: str) -> dict[str, Any]:
        target, python, tasks = hosts[host]
        conn = connect(target)
        try:
            answer: dict[str, Any] = agent_request(conn, python, {**request, "tasks": tasks})
            return answer
        finally:
            conn.close()

    answers: dict[str, Any] = {}
    for host, result in zip(hosts, parallel(ask, list(hosts)), strict=True):
        for task in hosts[host][2]:
            answers[task["name"]] = {"error": str(result)} if isinstance(result, Exception) else result[task["name"]]
    return answers


def remote_task_info(record: RunRecord) -> dict[str, dict[str, Any]]:
    """Each SSH task of the run with a pid: ``{"alive", "cpu_percent", "rss_mb", "progress"}``,
    asked on its host (all hosts at once), or ``{"error": "..."}`` when the host cannot be asked."""
    return _ask_hosts(record, {"mode": "info"})


def remote_signal(record: RunRecord, signum: int) -> dict[str, str]:
    """Signal the process group of each SSH task of the run that is still alive on its host:
    task -> "signalled" | "gone" | "error: ..."."""
    answers = _ask_hosts(record, {"mode": "signal", "signal": int(signum)})
    return {name: a if isinstance(a, str) else f"error: {a['error']}" for name, a in answers.items()}


def inspect(record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
    running = {t.task: t for t in record.tasks if t.state == TaskState.RUNNING}
    if not running:
        return {}
    if not ask:  # its agent kills a task whose launcher is gone
        alive = launcher_identity(record).find() is not None
        return {name: TaskLive(alive=alive) for name in running}
    live = {}
    for name, info in remote_task_info(record).items():
        if name not in running:
            continue
        if "error" in info:
            live[name] = TaskLive(alive=False, state="unreachable")
            continue
        created = running[name].create_time
        alive = bool(info["alive"])
        live[name] = TaskLive(alive=alive, state=None if alive else "gone", cpu_percent=info.get("cpu_percent"),
                              rss_mb=info.get("rss_mb"),
                              uptime_s=round(time.time() - created, 1) if alive and created else None)
    return live


def _signal_hosts(record: RunRecord, signum: int) -> None:
    remote_signal(record, signum)


def stop(record: RunRecord, grace: float) -> int:
    """SIGTERM, grace, SIGKILL (``launcher.teardown``) to the run's SSH tasks still alive on
    their hosts, every host at once per step. Their agents also kill them on their own once
    the launcher's connection is gone; this makes it immediate. Returns how many were alive.
    """
    if not any(t.pid for t in record.tasks):
        return 0
    alive = [name for name, info in remote_task_info(record).items() if info.get("alive")]
    if alive:
        teardown([record], signal=_signal_hosts, grace=grace, kill_wait=5.0,
                 alive=lambda r: any(info.get("alive") for info in remote_task_info(r).values()),
                 wait=lambda s: time.sleep(max(s, 0.2)))
    return len(alive)
