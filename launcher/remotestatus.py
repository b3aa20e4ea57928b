"""``tfl status`` and ``tfl stop`` for SSH tasks: ask their hosts, all at once.

The launcher watches its remote tasks through their agents; these functions are for
other processes (``tfl status RUN``, ``tfl stop`` when the launcher is gone). Each host
runs one agent request (``info`` or ``signal``) for all its recorded tasks. A pid counts
as the task only if its create time matches the recorded one, since pids get reused.
fabric is imported only when a host is actually asked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from launcher.plan import LaunchPlan
from launcher.remoteplan import SSHTarget
from launcher.runstore import RunRecord
from launcher.sshconn import agent_request, connect, parallel


def _recorded(record: RunRecord) -> dict[str, tuple[SSHTarget, str, list[dict[str, Any]]]]:
    """host -> (how to reach it, its python, the recorded tasks there with a pid)."""
    launches = {t.name: t for t in LaunchPlan.from_dict(record.plan).tasks if t.backend == "ssh" and t.ssh}
    hosts: dict[str, tuple[SSHTarget, str, list[dict[str, Any]]]] = {}
    for task in record.tasks:
        launch = launches.get(task.task)
        if launch is None or task.pid is None or launch.ssh is None:
            continue
        # Never accept a new host key here: the launch already recorded the host's key.
        target = replace(SSHTarget.from_dict(launch.ssh), accept_new_host_keys=False)
        entry = hosts.setdefault(launch.host, (target, launch.argv[0], []))
        entry[2].append({"name": task.task, "pid": task.pid, "create_time": task.create_time,
                         "progress_path": launch.env.get("TFL_PROGRESS_FILE", "")})
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
    asked on its host (all hosts at once), or ``{"error": "..."}`` when the host cannot be asked.
    A pid counts as the task only if its create time matches the recorded one."""
    return _ask_hosts(record, {"mode": "info"})


def remote_signal(record: RunRecord, signum: int) -> dict[str, str]:
    """Signal the process group of each SSH task of the run that is still alive on its host:
    task -> "signalled" | "gone" | "error: ..."."""
    answers = _ask_hosts(record, {"mode": "signal", "signal": int(signum)})
    return {name: a if isinstance(a, str) else f"error: {a['error']}" for name, a in answers.items()}
