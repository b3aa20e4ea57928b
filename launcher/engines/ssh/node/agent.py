"""The tfl agent: the one program tfl runs on a remote host (stdlib only, Python >= 3.8).

It is not installed there. The launcher starts ``python -u -c BOOTSTRAP`` over SSH and
sends this file's source (with ``agent_files.py``, ``agent_firewall.py``, ``agent_tmp.py`` and
``agent_tasks.py``, its file, firewall, temp dir and task work) as the first stdin line, then JSON request lines. So the remote
command line shows neither the job's arguments nor its environment (TF_CONFIG and the TFL_*
variables travel in the request, never through ``ps`` or a shell).

Every request but ``tasks`` and ``fence`` is answered with one JSON line; the agent then reads the
next request, until stdin ends. So ``tfl launch`` checks the host, unpacks the code, then runs all
of the host's tasks in that same SSH session.

Modes of a request:

``tasks``
    The host's tasks (``agent_tasks``): each ``{"id": N, "run": {...}}`` line starts ``argv`` with
    ``env`` in ``cwd`` as the leader of a new session, reports its pid, relays its output, obeys
    ``{"id": N, "signal": S}`` lines. Stdin reaching EOF or heartbeats stopping (the launcher or
    the connection is lost) kills every task's process group: a remote task never outlives
    its launcher.
``info`` / ``signal`` / ``stop``
    Liveness, cpu, memory and progress of recorded tasks / signal their groups / SIGTERM, the
    grace, SIGKILL, waited for here (``tfl stop``: every host at once), a pid only
    if its start matches the recorded one (pids get reused; also how a restart stops a lost
    attempt first: ``launcher.engines.ssh.restart``).
``probe``
    What ``tfl doctor`` checks: python, package versions, ports, disk, GPUs, and the job
    kit sent along imported as a task would (with ``quick``: python and ports only, what
    ``tfl launch`` checks first). Always: where the host's per-user tfl dir is, and which of the
    cluster's names (``names``: the other training hosts, which its tasks dial) it cannot resolve.
``unpack`` / ``cleanup`` / ``storage`` / ``remove`` (``agent_files``)
    The run's private dirs, the shipped code and job kit, the kit's import check / their
    removal at the end / tokens proving shared storage (``tfl doctor``) / a finished run's
    dirs (``tfl rm``: only ones named after the run, no link), and its private temp dirs
    (``agent_tmp``: each task's TMPDIR, which the tasks' session removes as it ends).
``fence`` / ``unfence`` (``agent_firewall``)
    Install the run's nftables table and hold it while the launcher pings, removing it at
    the end or when the launcher is lost / remove it (``tfl stop``, ``tfl rm``).

Every reply starts with ``MARK``: whatever the login shell printed first (a chatty
``~/.bashrc``) comes before it and is skipped. The tasks' output is framed on stdout after it
(1 type byte, 4-byte length, payload; ``agent_tasks``) so that job output and control messages
stay in order: ``O`` output, ``C`` JSON control, ``P`` ping. The other modes print one JSON line.
"""

from __future__ import annotations  # annotations stay strings: the agent runs on Python >= 3.8

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

try:  # sent along with this file (launcher.engines.ssh.wire.BOOTSTRAP)
    import tfl_agent_files as files
    import tfl_agent_firewall as firewall
    import tfl_agent_tasks as tasks
    import tfl_agent_tmp as run_tmp
except ImportError:  # imported in the launcher itself
    from launcher.engines.ssh.node import agent_files as files
    from launcher.engines.ssh.node import agent_firewall as firewall
    from launcher.engines.ssh.node import agent_tasks as tasks
    from launcher.engines.ssh.node import agent_tmp as run_tmp

MARK = tasks.MARK  # starts every reply; launcher.engines.ssh.wire.MARK
RESOLVERS = 16  # names of the cluster resolved at once (``_unresolved``)
create_time, start_ticks, group_alive, killpg = tasks.create_time, tasks.start_ticks, tasks.group_alive, tasks.killpg


def _zombie(pid: int) -> bool:
    """Exited, not yet reaped (its agent may be stuck): holds no port any more."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


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
            killpg(int(task["pid"]), int(signum))
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
                             "tfl_cache": files.tfl_cache(), "unresolved": _unresolved(request.get("names", []))}
    if request.get("kit"):
        facts.update(kit=files.kit_probe(request["kit"]), packages=files.packages())
    if request.get("quick"):
        return facts
    facts.update(packages=files.packages(), disk=_disk(files.expand(request.get("workdir") or "/")), gpus=_gpus())
    if request.get("firewall"):  # "ssh": {"firewall": true}: what the launch's fence needs here
        facts["firewall"] = firewall.can_fence()
    return facts


def _unresolved(names: list[str]) -> dict[str, str]:
    """The names of the cluster this host cannot resolve (its tasks dial them), with why. Asked
    RESOLVERS at a time: a resolver that times out costs one timeout, not one per host."""
    from concurrent.futures import ThreadPoolExecutor

    if not names:
        return {}
    with ThreadPoolExecutor(min(RESOLVERS, len(names))) as pool:
        asked = {name: pool.submit(_resolve_problem, name) for name in names}
    return {name: why for name, future in asked.items() if (why := future.result()) is not None}


def _resolve_problem(name: str) -> str | None:
    try:
        socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return str(getattr(exc, "strerror", None) or exc)
    return None


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
                "storage": files.storage, "cleanup": files.cleanup,
                "remove": lambda r: {**files.remove(r), **run_tmp.remove_request(r)}, "unfence": firewall.drop}
    while True:
        line = sys.stdin.readline()
        if not line:
            return  # stdin ended: the requests are done, or the launcher gave up on a pre-started agent
        request = json.loads(line)
        mode = request.get("mode")
        if mode == "tasks":  # the host's tasks, until the launcher is gone (agent_tasks)
            for signum in (signal.SIGHUP, signal.SIGTERM):
                # sshd hung up or is shutting down: as good as losing the launcher, so each
                # task's relay kills its group before the agent exits.
                signal.signal(signum, lambda *_: tasks.LOST.set())
            frames = tasks.Frames()
            frames.raw(MARK.encode())  # the frames follow it
            sys.exit(tasks.Session(frames, request).serve())
        if mode == "fence":  # holds the run's nftables table on this host until the end (agent_firewall)
            sys.exit(firewall.hold(request, _answer))
        _answer(handlers[mode](request))


def _answer(message: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
