"""A restart after a *silent* SSH connection: the old remote task must be gone first.

A connection that falls silent (network down, host stalled) is marked lost after the
heartbeat timeout, but the old task's agent only notices on its own side later, and until
then the task holds its port: a restarted task there could not bind it. Real sshd, real
agents; the silence is made by stopping (SIGSTOP) the worker's agent, which then neither
talks nor kills its task, exactly what the launcher sees of a dead network.
"""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from launcher.describe.ports import free_port
from launcher.describe.spec import load_cluster
from launcher.engines.ssh import backend as ssh_backend
from launcher.engines.ssh import pool as ssh_pool
from launcher.plan.run_options import SupervisorConfig
from launcher.records.states import RunState
from launcher.records.store import RunStore
from launcher.runs import launch as core
from tests.procs import pid_alive, tfl_processes
from tests.sshd import Sshd, cluster_file

pytestmark = pytest.mark.ssh

BINDS_ITS_PORT = """
    import json, os, socket, sys, time
    config = json.loads(os.environ["TF_CONFIG"])
    port = int(config["cluster"][config["task"]["type"]][config["task"]["index"]].rsplit(":", 1)[1])
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TensorFlow's gRPC server does
    try:
        server.bind(("", port))
        server.listen()
    except OSError as exc:
        print("cannot bind", port, exc, flush=True)
        sys.exit(1)
    attempt = os.environ["TFL_ATTEMPT"]
    print("serving", os.environ["TFL_TASK"], "attempt", attempt, flush=True)
    time.sleep(600 if attempt == "0" else 0.5)
"""


def silence_the_agent_of(run_dir: Path, task: str, stopped: list[psutil.Process]) -> None:
    """Once ``task`` serves, SIGSTOP its agent: its connection falls silent, its task lives on."""
    log = run_dir / "logs" / f"{task.replace(':', '-')}.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and f"serving {task} attempt 0" in log.read_text():
            (job,) = [p for p in tfl_processes(run_id=run_dir.name) if p.environ().get("TFL_TASK") == task]
            agent = job.parent()
            assert agent is not None and "tfl-agent" in " ".join(agent.cmdline())
            agent.suspend()
            stopped.append(agent)
            return
        time.sleep(0.05)


def test_restart_after_a_silent_connection_waits_for_the_old_task(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ssh_backend, "HEARTBEAT_TIMEOUT", 6.0)  # 30 s in real life; the agents ping every 2 s
    monkeypatch.setattr(ssh_pool, "HEARTBEAT_TIMEOUT", 6.0)
    job = tmp_path / "src" / "job.py"
    job.parent.mkdir()
    job.write_text(textwrap.dedent(BINDS_ITS_PORT))
    workdirs = {"127.0.0.2": tfl_home / "hosts" / "a", "127.0.0.3": tfl_home / "hosts" / "b"}
    for workdir in workdirs.values():
        workdir.mkdir(parents=True)  # a workdir the cluster file names must exist
    tasks = {"chief": [f"127.0.0.2:{free_port()}"], "worker": [f"127.0.0.3:{free_port()}"]}
    store = RunStore(tfl_home)
    plan = core.make_plan(str(job), (), load_cluster(cluster_file(tmp_path / "c.json", sshd, tasks, workdirs)), store)
    stopped: list[psutil.Process] = []
    silencer = threading.Thread(target=silence_the_agent_of, args=(Path(plan.run_dir), "worker:0", stopped))
    silencer.start()
    try:
        record = core.execute(core.prepare(plan), store, SupervisorConfig(max_restarts=1, grace_period=2.0), None)
    finally:
        silencer.join()
        for agent in stopped:
            agent.resume()  # it finds its launcher gone and exits
    assert stopped, "the worker never served"
    log = (Path(plan.run_dir) / "logs" / "worker-0.log").read_text()
    assert record.state == RunState.SUCCEEDED, f"{record.message}; worker log: {log[-800:]}"
    assert "cannot bind" not in log and "serving worker:0 attempt 1" in log
    assert len(record.restarts) == 1 and "no word from the agent" in "".join(f.reason for f in record.failures) + log
    deadline = time.monotonic() + 15
    while any(pid_alive(a.pid) for a in stopped) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(pid_alive(a.pid) for a in stopped), "the silenced agent outlived the test"
    assert tfl_processes(run_id=plan.run_id) == []


def test_the_launcher_kills_a_lost_attempt_that_ignores_sigterm_and_leaves_an_unrelated_pid_alone() -> None:
    """The restart wait runs in the launcher (launcher.engines.ssh.restart), through the agent's
    own signal and info requests: here answered by the agent's functions in this process."""
    import subprocess
    import sys

    from launcher.engines.ssh.node import agent
    from launcher.engines.ssh.restart import stop_lost_attempt

    def ask(request: dict[str, object]) -> object:
        return {"signal": agent.signal_tasks, "info": agent.info}[str(request["mode"])](request)

    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                 "print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, start_new_session=True)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"up\n"
    me = {"pid": stubborn.pid, "create_time": agent.create_time(stubborn.pid), "start_ticks": agent.start_ticks(stubborn.pid)}
    someone_else = {**me, "start_ticks": me["start_ticks"] - 1}  # same pid, another start: not ours
    try:
        assert stop_lost_attempt(ask, "worker:0", someone_else, grace=0.2) is None
        assert stubborn.poll() is None
        started = time.monotonic()
        note = stop_lost_attempt(ask, "worker:0", me, grace=0.2, wait=30)
        assert stubborn.wait(30) == -9 and time.monotonic() - started < 30  # a hang guard; SIGKILL came after 0.2 s
        assert note is not None and note.startswith(f"tfl: stopped this task's previous attempt (pid {stubborn.pid})")
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()
