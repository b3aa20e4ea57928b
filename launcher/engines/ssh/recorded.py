"""``tfl status``, ``tfl stop`` and ``tfl rm`` for a recorded SSH run: ask its hosts, all at once.

The launcher watches its remote tasks through their agents; these functions are for
other processes (``tfl status RUN``, ``tfl stop`` when the launcher is gone). Each host
runs one agent request (``info`` or ``signal``) for all its recorded tasks. A pid counts
as the task only if its create time matches the recorded one, since pids get reused.
fabric is imported only when a host is actually asked.

``tfl status RUN`` of a run whose launcher is alive here asks no host once the run has more
than ``ASK_UP_TO`` of them: the launcher hears every agent every 3.3 s at least and records each task it
sees end, so its record is the truth at any size, and connecting to hundreds of hosts is not
(about 35 ms of CPU each, seconds at 256 hosts). A smaller run, or one whose launcher is
gone, is asked host by host, all at once, for at most ``STATUS_WAIT`` s: a host that has not
answered by then is shown as such (``NO_ANSWER``), never waited for.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Callable

from launcher.contract import MODEL_DIR, PROGRESS_FILE, RUN_DIR
from launcher.describe.hosts import HOST_CACHE, SSHTarget
from launcher.engines.base import NO_ANSWER, Cleanup, Stopped, TaskLive
from launcher.engines.parallel import parallel
from launcher.engines.ssh.connect import connect
from launcher.engines.ssh.failures import cause_of
from launcher.engines.ssh.firewall import unfence
from launcher.engines.ssh.node import agent_tmp
from launcher.engines.ssh.wire import agent_answer, agent_request, agent_start, cleanup_request
from launcher.limits import limit_error, own_fault
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.records.identity import launcher_identity
from launcher.records.states import TaskState
from launcher.records.store import RunRecord

if TYPE_CHECKING:
    from fabric import Connection
    from paramiko import Channel

HostTasks = dict[str, tuple[SSHTarget, str, list[dict[str, Any]]]]
ASK_UP_TO = 8  # hosts: a run this small is asked (cpu, memory) even while its launcher runs
STATUS_WAIT = 5.0  # seconds `tfl status RUN` waits for the hosts it asks (once fabric is imported)
ASKERS = 32  # hosts asked at once
KILL_WAIT = 5.0  # `tfl stop`: after SIGKILL, how long a host waits for its tasks to go


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


def _ask_hosts(record: RunRecord, request: dict[str, Any], wait: float | None = None) -> dict[str, Any]:
    """task -> its host's answer, ``{"error": ...}``, or (``wait``: the hosts not answered by then)
    ``{"no_answer": wait}``."""
    hosts = _recorded(record)

    def ask(host: str) -> dict[str, Any]:
        target, python, tasks = hosts[host]
        conn = connect(target, recorded=True)
        try:
            answer: dict[str, Any] = agent_request(conn, python, {**request, "tasks": tasks})
            return answer
        finally:
            conn.close()

    if wait is None:
        results = dict(zip(hosts, parallel(ask, list(hosts)), strict=True))
    else:
        import fabric  # noqa: F401  # its import (a second or more on a loaded machine) is ours, not the hosts' wait
        results = ask_within(ask, list(hosts), wait)
    answers: dict[str, Any] = {}
    if fault := next((f for r in results.values() if isinstance(r, Exception) and (f := own_fault(r))), None):
        raise limit_error(fault, "asking the hosts")  # the launcher's own limit: no host is unreachable for it
    for host, (_, _, tasks) in hosts.items():
        result = results.get(host)
        for task in tasks:
            answers[task["name"]] = ({"no_answer": wait} if result is None else {"error": str(result)}
                                     if isinstance(result, Exception) else result[task["name"]])
    return answers


def ask_within(ask: Callable[[str], dict[str, Any]], hosts: list[str], wait: float,
               workers: int = ASKERS) -> dict[str, dict[str, Any] | Exception]:
    """host -> ``ask(host)``'s answer or exception, for the hosts that answered within ``wait`` s.
    The askers are daemon threads: one stuck on a silent host never holds the command up."""
    results: dict[str, dict[str, Any] | Exception] = {}
    queue, lock, done = list(reversed(hosts)), threading.Lock(), threading.Event()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                host = queue.pop()
            try:
                result: dict[str, Any] | Exception = ask(host)
            except Exception as exc:  # reported per host
                result = exc
            with lock:
                results[host] = result
                if len(results) == len(hosts):
                    done.set()

    if not hosts:
        return {}
    for _ in range(min(workers, len(hosts))):
        threading.Thread(target=worker, name="status-ask", daemon=True).start()
    done.wait(wait)
    with lock:
        return dict(results)


def remote_task_info(record: RunRecord, wait: float | None = None) -> dict[str, dict[str, Any]]:
    """Each SSH task of the run with a pid: ``{"alive", "cpu_percent", "rss_mb", "progress"}``,
    asked on its host (all hosts at once), or ``{"error": "..."}`` when the host cannot be asked,
    or ``{"no_answer": wait}`` when it has not answered within ``wait`` s."""
    return _ask_hosts(record, {"mode": "info"}, wait)


def remote_signal(record: RunRecord, signum: int) -> dict[str, str]:
    """Signal the process group of each SSH task of the run that is still alive on its host:
    task -> "signalled" | "gone" | "error: ..."."""
    answers = _ask_hosts(record, {"mode": "signal", "signal": int(signum)})
    return {name: a if isinstance(a, str) else f"error: {a['error']}" for name, a in answers.items()}


def inspect(record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
    running = {t.task: t for t in record.tasks if t.state == TaskState.RUNNING}
    if not running:
        return {}
    launcher_alive = launcher_identity(record).alive()
    if not ask or (launcher_alive and len({t.host for t in record.tasks}) > ASK_UP_TO):
        # Its agent kills a task whose launcher is gone; a live launcher records each task it sees end.
        now = time.time()
        return {name: TaskLive(alive=launcher_alive, source="launcher" if launcher_alive else None,
                               uptime_s=round(now - t.create_time, 1) if launcher_alive and t.create_time else None)
                for name, t in running.items()}
    live = {}
    for name, info in remote_task_info(record, wait=STATUS_WAIT).items():
        if name not in running:
            continue
        if "no_answer" in info:  # alive as far as a live launcher knows: it hears the task's agent every 3.3 s at least
            live[name] = TaskLive(alive=launcher_alive, state=NO_ANSWER)
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


def stop(record: RunRecord, grace: float) -> Stopped:
    """SIGTERM, grace, SIGKILL to the run's SSH tasks still alive on their hosts (the agent's
    ``stop``: the same steps as ``launcher.engines.teardown``, waited for on the hosts). Every host
    gets one connection and one agent session, opened ``ASKERS`` at a time; then all of them run
    their stop at once and are waited for together, for the grace and the kill's wait at most.
    Their agents also kill them on their own once the launcher's connection is gone; this makes
    it immediate. Says how many were alive, and each host that could not be asked: its agent
    ends the tasks there on its own once it has lost the launcher. A
    run whose launcher is gone had no one to remove the code it shipped: that is done here.
    """
    hosts = _recorded(record)
    if not hosts:
        return Stopped()
    results = _stop_hosts(hosts, grace)
    if fault := next((f for r in results.values() if isinstance(r, Exception) and (f := own_fault(r))), None):
        raise limit_error(fault, "stopping the tasks")  # the launcher's own limit: no host is unreachable for it
    alive = sum(1 for r in results.values() if not isinstance(r, Exception) for outcome in r.values() if outcome != "gone")
    unreached = [f"{host}: {cause_of(result)}; its agent there ends them once it loses the launcher: at once when the "
                 f"launcher's connection closes, else {hosts[host][0].fence_after:g} s after its last word (ssh.fence_after)"
                 for host, result in results.items() if isinstance(result, Exception)]
    if not record.state.is_terminal:
        cleanup(record)
        unfence(record)  # its agents removed the tables when they lost the launcher: this makes sure
    return Stopped(alive, unreached)


def _stop_hosts(hosts: HostTasks, grace: float) -> dict[str, dict[str, str] | Exception]:
    """host -> its agent's ``stop`` answer (task -> outcome), or why there is none."""
    def begin(host: str) -> tuple[Connection, Channel]:
        target, python, tasks = hosts[host]
        conn = connect(target, recorded=True)
        try:
            request = {"mode": "stop", "tasks": tasks, "grace": grace, "kill_wait": KILL_WAIT}
            return conn, agent_start(conn, python, request, timeout=STATUS_WAIT)
        except BaseException:
            conn.close()
            raise

    started = dict(zip(hosts, parallel(begin, list(hosts), workers=ASKERS), strict=True))
    deadline = time.monotonic() + grace + KILL_WAIT + STATUS_WAIT  # the hosts stop their tasks at once
    results: dict[str, dict[str, str] | Exception] = {}
    try:
        for host, begun in started.items():
            if isinstance(begun, Exception):
                results[host] = begun
                continue
            try:
                results[host] = agent_answer(begun[0], hosts[host][1], begun[1], max(0.1, deadline - time.monotonic()))
            except Exception as exc:  # reported per host
                results[host] = exc
    finally:
        for begun in started.values():
            if not isinstance(begun, Exception):
                begun[0].close()
    return results


def run_dirs_there(record: RunRecord) -> dict[str, tuple[SSHTarget, str, list[str]]]:
    """host -> (how to reach it, its python, the directories tfl made there for this run).

    Those are the tasks' working dir and run dir (``TFL_RUN_DIR``) as the plan recorded them,
    each cut to its closest part named after the run: a working dir the cluster file gave
    (``hosts.<h>.workdir``) is not the run's, but the run dir inside it is.
    """
    hosts: dict[str, tuple[SSHTarget, str, list[str]]] = {}
    for launch in LaunchPlan.from_dict(record.plan).tasks:
        if launch.ssh is None:
            continue
        entry = hosts.setdefault(launch.host, (replace(launch.ssh, accept_new_host_keys=False), launch.python, []))
        for path in (launch.cwd, launch.env.get(RUN_DIR)):
            own = _own_dir(path, record.run_id)
            if own and own not in entry[2]:
                entry[2].append(own)
    for _, _, paths in hosts.values():  # a dir inside another one goes with it
        paths[:] = [p for p in paths if not any(p.startswith(q + "/") for q in paths)]
    return {host: entry for host, entry in hosts.items() if entry[2]}


def _own_dir(path: str | None, run_id: str) -> str | None:
    """The closest part of ``path`` named after the run: absolute, or in the host's private
    tfl dir (``{tfl-cache}``, resolved by the agent)."""
    if not path or not path.startswith(("/", HOST_CACHE + "/")) or ".." in PurePosixPath(path).parts:
        return None
    chain = [PurePosixPath(path), *PurePosixPath(path).parents]
    own = next((i for i, p in enumerate(chain) if p.name == run_id), None)
    if own is None:
        return None
    # In the per-user dir, runs/<run>/<host>: on a home shared by several hosts, only this host's part.
    return str(chain[own - 1] if path.startswith(HOST_CACHE) and own > 0 else chain[own])


def clean(record: RunRecord) -> Cleanup:
    """Remove the run's directories on every SSH host at once (the agent's ``remove``, which
    refuses anything not named after the run). An unreachable host is reported, not raised."""
    hosts = run_dirs_there(record)
    shared = model_dirs_by_host(record)
    tmp_parents = tmp_parents_by_host(record)

    def remove(host: str) -> dict[str, Any]:
        target, python, paths = hosts[host]
        conn = connect(target, recorded=True)
        try:
            answer: dict[str, Any] = agent_request(conn, python, {"mode": "remove", "run_id": record.run_id,
                                                                  "paths": paths, "keep": shared.get(host, []),
                                                                  "tmp_parents": tmp_parents.get(host, [])})
            return answer
        finally:
            conn.close()

    done = Cleanup()
    done.left += [f"{host}: {left}" for host, left in unfence(record).items() if left]
    for host, result in zip(hosts, parallel(remove, list(hosts)), strict=True):
        if isinstance(result, Exception):
            done.left.append(f"{host}: {cause_of(result)}; left {', '.join(hosts[host][2])} there")
            continue
        for path, outcome in result.items():
            if "error" in outcome:
                done.left.append(f"{host}:{path}: {outcome['error']}")
            elif "removed" in outcome:
                done.removed.append(f"{host}:{path}")
                done.bytes_freed += int(outcome["removed"])
            elif "kept" in outcome and path not in done.kept:
                done.kept.append(path)
    return done


def tmp_parents_by_host(record: RunRecord) -> dict[str, list[str]]:
    """host -> the TMPDIRs the plan gave its tasks: its agent made the run's temp dir in them (else in its own)."""
    given: dict[str, list[str]] = {}
    for launch in LaunchPlan.from_dict(record.plan).tasks:
        path = launch.env.get(agent_tmp.VARS[0])
        if launch.ssh is not None and path and path not in given.setdefault(launch.host, []):
            given[launch.host].append(path)
    return given


def model_dirs_by_host(record: RunRecord) -> dict[str, list[str]]:
    """host -> the model dirs on shared storage (``TFL_MODEL_DIR``) its tasks were given."""
    dirs: dict[str, list[str]] = {}
    for launch in LaunchPlan.from_dict(record.plan).tasks:
        path = launch.env.get(MODEL_DIR)
        if launch.ssh is not None and path and path not in dirs.setdefault(launch.host, []):
            dirs[launch.host].append(path)
    return dirs


def cleanup(record: RunRecord) -> None:
    """Remove what the run shipped to its hosts (best effort, every host at once)."""

    plan = LaunchPlan.from_dict(record.plan)
    hosts: dict[str, list[TaskLaunch]] = {}
    for task in plan.tasks:
        if task.ssh is not None:
            hosts.setdefault(task.host, []).append(task)

    def tidy(tasks: list[TaskLaunch]) -> None:
        request, target = cleanup_request(tasks), tasks[0].ssh
        if request is None or target is None:
            return
        conn = connect(replace(target, accept_new_host_keys=False), recorded=True)
        try:
            agent_request(conn, tasks[0].python, request, timeout=30.0)
        finally:
            conn.close()

    parallel(tidy, list(hosts.values()))
