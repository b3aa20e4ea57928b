"""SSH hosts for real: a real sshd on 127.0.0.2 and 127.0.0.3 (loopback only), real tfl.

The "remote" hosts are this machine, so remote tasks are local processes started by sshd:
the ``tfl_home`` fixture's process-table scan sees them (their TFL_RUN_DIR lies in a
workdir under the test's home) and fails the test if any outlives it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.contract import TEARDOWN_SIGNAL
from launcher.describe.ports import free_port
from launcher.engines.ssh.recorded import remote_signal, remote_task_info
from launcher.records.store import RunStore
from tests.procs import pid_alive, tfl_processes
from tests.sshd import NOWHERE, Sshd, cluster_file

pytestmark = pytest.mark.ssh
runner = CliRunner()

INFO_JOB = """
    import json, os, sys, time
    cmdlines = [open(f"/proc/{p}/cmdline").read().replace("\\0", " ") for p in (os.getpid(), os.getppid())]
    print("info", json.dumps({
        "args": sys.argv[1:], "cwd": os.getcwd(), "declared": os.environ.get("DECLARED"),
        "leak": os.environ.get("TFL_TEST_LOCAL_ONLY"), "cmdlines": cmdlines,
        "data": open("data/input.txt").read() if os.path.exists("data/input.txt") else None,
        "shipped_git": os.path.exists(".git"), "pgid_is_pid": os.getpgid(0) == os.getpid(),
    }), flush=True)
"""
SLEEP_JOB = """
    import os, sys, time
    print("ready", os.environ["TFL_TASK"], flush=True)
    if os.environ["TFL_TASK"] == "worker:0" and "--fail-worker" in sys.argv:
        time.sleep(0.5)
        print("boom: worker is failing", flush=True)
        sys.exit(3)
    time.sleep(120)
"""


def write_job(directory: Path, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


def two_hosts(tmp_path: Path, sshd: Sshd, home: Path, worker_host: str = "127.0.0.3", **extra: Any) -> Path:
    """chief on 127.0.0.2, worker on ``worker_host``; distinct ports (TF binds every interface)."""
    workdirs = {"127.0.0.2": home / "hosts" / "w2", worker_host: home / "hosts" / "w3 it's $(touch x); `id`"}
    tasks = {"chief": [f"127.0.0.2:{free_port()}"], "worker": [f"{worker_host}:{free_port()}"]}
    return cluster_file(tmp_path / "cluster.json", sshd, tasks, workdirs, **extra)


def tfl(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True, timeout=timeout)


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def only_run(home: Path) -> str:
    (run,) = [p.name for p in (home / "runs").iterdir()]
    return run


def test_two_hosts_get_args_env_code_and_stream_logs_back(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                          child_env: dict[str, str]) -> None:
    src = tmp_path / "src"
    job = write_job(src, INFO_JOB)
    (src / "data").mkdir()
    (src / "data" / "input.txt").write_text("hello")
    (src / ".git").mkdir()
    (src / ".git" / "config").write_text("not shipped")
    cluster = two_hosts(tmp_path, sshd, tfl_home, env={"DECLARED": "yes"})
    hostile = ["a b", "it's", '"q"', "x;y", "$(touch pwned)", "`touch pwned2`", "*", "", "ü", "--flag=1"]
    env = {**child_env, "TFL_TEST_LOCAL_ONLY": "leak"}
    log_before = len(sshd.log())
    result = tfl(["launch", str(job), "--cluster", str(cluster), "--sync", str(src), "--", *hostile], env)
    assert result.returncode == 0, result.stderr
    # Per host one connection and one session for its task (whose agent also checked the host
    # and unpacked the code and kit): no probe or copy sessions of their own. And once the run
    # has ended, one more per host to remove what was shipped there.
    sshd_said = sshd.log()[log_before:]
    assert sshd_said.count("Accepted publickey") == 2 and sshd_said.count("Starting session: command") == 2 + 2, sshd_said
    infos = {}
    for task in ("chief:0", "worker:0"):
        line = next(x for x in result.stdout.splitlines() if x.startswith(f"[{task}]") and " info " in x)
        infos[task] = json.loads(line.split(" info ", 1)[1])
    workdirs = json.loads(cluster.read_text())["hosts"]
    for task, host in (("chief:0", "127.0.0.2"), ("worker:0", "127.0.0.3")):
        info = infos[task]
        assert info["args"] == hostile and info["cwd"] == workdirs[host]["workdir"]
        assert info["declared"] == "yes" and info["leak"] is None  # declared env only, not ours
        assert info["data"] == "hello" and info["shipped_git"] is False and info["pgid_is_pid"]
        job_cmd, agent_cmd = info["cmdlines"]
        assert "tfl-agent" in agent_cmd and "TF_CONFIG" not in agent_cmd + job_cmd and "cluster" not in agent_cmd + job_cmd
    assert not list(tmp_path.rglob("pwned*")) and not list(tfl_home.rglob("pwned*"))
    run = only_run(tfl_home)
    log = (tfl_home / "runs" / run / "logs" / "worker-0.log").read_text()
    assert log.startswith("info ") and json.loads(log.split(" ", 1)[1])["args"] == hostile
    view = json.loads(tfl(["status", run, "--json"], child_env).stdout)
    assert view["state"] == "succeeded" and [t["exit_code"] for t in view["tasks"]] == [0, 0]
    assert [t["host"] for t in view["tasks"]] == ["127.0.0.2", "127.0.0.3"] and all(t["pid"] for t in view["tasks"])


def test_failure_on_one_host_stops_the_other(sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    job = write_job(tmp_path / "src", SLEEP_JOB)
    start = time.monotonic()
    result = tfl(["launch", str(job), "--cluster", str(two_hosts(tmp_path, sshd, tfl_home)), "--", "--fail-worker"], child_env)
    assert result.returncode == 1, result.stderr
    assert "root cause: worker:0 on 127.0.0.3" in result.stderr and "exit code 3" in result.stderr
    assert "| boom: worker is failing" in result.stderr and "stopped because of it: chief:0" in result.stderr
    assert time.monotonic() - start < 90  # a hang guard: the chief sleeps 120 s; it was stopped, not waited for
    tasks = {t.task: t for t in RunStore(tfl_home).load(only_run(tfl_home)).tasks}
    assert tasks["chief:0"].state.value == "stopped" and tasks["chief:0"].exit_code == -signal.Signals[TEARDOWN_SIGNAL]


def start_sleepers(sshd: Sshd, tmp_path: Path, home: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    job = write_job(tmp_path / "src", SLEEP_JOB)
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--cluster",
                                 str(two_hosts(tmp_path, sshd, home))], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: (home / "runs").exists() and len(list((home / "runs").glob("*/logs/*.log"))) == 2 and
             all("ready" in p.read_text() for p in (home / "runs").glob("*/logs/*.log")))
    # A task's output can arrive a moment before the launcher has recorded its pid.
    wait_for(lambda: all(t.pid for t in RunStore(home).load(only_run(home)).tasks))
    return launcher, only_run(home)


def test_sigint_to_the_launcher_leaves_no_remote_task(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                      child_env: dict[str, str]) -> None:
    launcher, run = start_sleepers(sshd, tmp_path, tfl_home, child_env)
    try:
        tasks = tfl_processes(run_id=run)
        assert len(tasks) == 2 and all("tfl-agent" in " ".join(p.parent().cmdline()) for p in tasks)
        assert len(tfl_processes(home=str(tfl_home))) == 2  # what the fixture's proof sees, run dirs on the hosts or not
        record = RunStore(tfl_home).load(run)
        info = remote_task_info(record)  # what `tfl status RUN` asks each host
        assert all(i["alive"] and i["rss_mb"] > 0 for i in info.values()) and set(info) == {"chief:0", "worker:0"}
        view = json.loads(tfl(["status", run, "--json"], child_env).stdout)
        assert view["alive"] == 2 and all(t["rss_mb"] for t in view["tasks"])
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(30)
    assert launcher.returncode == 130
    assert tfl_processes(run_id=run) == []  # gone when the launcher returns, not later
    assert not any(i["alive"] for i in remote_task_info(RunStore(tfl_home).load(run)).values())


def test_killed_launcher_or_dropped_connection_takes_remote_tasks_down(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                                       child_env: dict[str, str]) -> None:
    launcher, run = start_sleepers(sshd, tmp_path, tfl_home, child_env)
    pids = [p.pid for p in tfl_processes(run_id=run)]
    launcher.kill()  # no teardown at all: the agents see their SSH channel close
    launcher.wait()
    # A process that is exiting has no readable environment (tfl_processes no longer sees its marker) a moment
    # before it is a zombie: wait for the pids themselves too.
    wait_for(lambda: not tfl_processes(run_id=run) and not any(pid_alive(p) for p in pids), timeout=10)
    record = RunStore(tfl_home).load(run)
    assert set(remote_signal(record, signal.SIGTERM).values()) == {"gone"}  # `tfl stop`'s remote half: idempotent


def launch_error(args: list[str]) -> str:
    result = runner.invoke(app, ["launch", *args])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("tfl: error:")]
    assert "Traceback" not in result.output and len(errors) == 1 and result.stderr.strip().endswith(errors[0])
    return errors[0]


@pytest.mark.parametrize("problem", ["nothing listening", "auth refused", "unknown host key", "python missing", "port busy",
                                     "workdir unusable", "tensorflow missing"])
def test_host_problems_are_one_clear_line_and_nothing_runs(problem: str, sshd: Sshd, tmp_path: Path,
                                                           tfl_home: Path) -> None:
    job = write_job(tmp_path / "src", SLEEP_JOB)
    worker_host, extra, expected = "127.0.0.3", {}, ""
    if problem == "nothing listening":
        worker_host, expected = NOWHERE, f"{NOWHERE}: connection refused on port {sshd.port}; is sshd running there"
    elif problem == "auth refused":
        stranger = tmp_path / "stranger"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
        extra = {"ssh": {"identity_file": str(stranger)}}
        expected = f"127.0.0.2: ssh authentication refused for root with {stranger}"
    elif problem == "unknown host key":
        known = sshd.known_hosts_for(("127.0.0.2",), tmp_path / "known_hosts")
        extra = {"ssh": {"known_hosts": str(known)}}
        expected = (f"127.0.0.3: host key of [127.0.0.3]:{sshd.port} is not in {known}")
    elif problem == "python missing":
        extra = {"hosts": {"127.0.0.3": {"python": "/no/such/python3"}}}
        expected = "127.0.0.3: python '/no/such/python3' not found"
    elif problem == "workdir unusable":
        (tmp_path / "a-file").write_text("")
        extra = {"hosts": {"127.0.0.3": {"workdir": str(tmp_path / "a-file" / "w")}}}  # the code cannot be unpacked there
        expected = (f"127.0.0.3: working dir {tmp_path / 'a-file' / 'w'} cannot be made (NotADirectoryError: Not a directory); "
                    "fix: set hosts.127.0.0.3.workdir to a directory of your own")
    elif problem == "tensorflow missing":  # refused once the run's dirs, code and kit are on the host
        bare = tmp_path / "python-without-site"
        bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
        bare.chmod(0o755)
        extra = {"hosts": {"127.0.0.3": {"python": str(bare)}}}
        expected = f"127.0.0.3: tensorflow is not installed for {bare}"
    cluster = two_hosts(tmp_path, sshd, tfl_home, worker_host=worker_host, **extra)
    on_hosts = {h: set(os.listdir(sshd.home(h) / ".cache" / "tfl" / "runs")) if (sshd.home(h) / ".cache" / "tfl" / "runs").is_dir()
                else set() for h in sshd.hosts}
    with socket.socket() as busy:
        if problem == "port busy":
            port = int(json.loads(cluster.read_text())["cluster"]["worker"][0].rsplit(":", 1)[1])
            busy.bind(("127.0.0.3", port))
            busy.listen()
            expected = f"127.0.0.3: port {port} of worker:0 is in use"
        message = launch_error([str(job), "--cluster", str(cluster)])
    assert message.startswith(f"tfl: error: {expected}"), message
    if problem == "unknown host key":
        assert f"ssh-keyscan -p {sshd.port} 127.0.0.3 >> {tmp_path / 'known_hosts'}" in message
    assert not (tfl_home / "runs").exists() or not list((tfl_home / "runs").iterdir())  # no task was started
    assert tfl_processes(home=str(tfl_home)) == []
    for host, before in on_hosts.items():  # no run record here: what it left on a host, no `tfl rm` could find
        runs = sshd.home(host) / ".cache" / "tfl" / "runs"
        assert (set(os.listdir(runs)) if runs.is_dir() else set()) == before, host


def test_start_failure_on_one_host_stops_tasks_already_started(sshd: Sshd, tmp_path: Path, tfl_home: Path) -> None:
    job = write_job(tmp_path / "src", SLEEP_JOB)
    (tmp_path / "a-file").write_text("")
    bad_workdir = tmp_path / "a-file" / "w"  # with --no-sync the code is taken to be there: fails at start only
    cluster = two_hosts(tmp_path, sshd, tfl_home, hosts={"127.0.0.3": {"workdir": str(bad_workdir)}})
    (tfl_home / "hosts" / "w2").mkdir(parents=True)  # the chief's is there
    message = launch_error([str(job), "--cluster", str(cluster), "--no-sync"])
    assert message == f"tfl: error: worker:0 on 127.0.0.3: working directory {bad_workdir} does not exist", message
    record = RunStore(tfl_home).load(only_run(tfl_home))
    chief = record.task("chief:0")
    assert chief.pid is not None and chief.state.value == "stopped" and record.state.value == "failed"
    assert tfl_processes(run_id=record.run_id) == []


def test_a_port_that_is_not_sshd_is_named_as_such(tmp_path: Path) -> None:
    from launcher.describe.hosts import SSHTarget
    from launcher.engines.ssh.connect import connect
    from launcher.engines.ssh.failures import SSHError

    with socket.socket() as silent:  # accepts connections, never says a word
        silent.bind((NOWHERE, 0))
        silent.listen()
        target = SSHTarget(NOWHERE, silent.getsockname()[1], connect_timeout=0.5, known_hosts=str(tmp_path / "kh"))
        with pytest.raises(SSHError, match=rf"^{NOWHERE}: port \d+ answers, but no SSH server spoke within 0.5 s"):
            connect(target)


def test_restart_after_a_remote_task_dies(sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    job = write_job(tmp_path / "src", """
        import os, time
        print("attempt", os.environ["TFL_ATTEMPT"], flush=True)
        if os.environ["TFL_ATTEMPT"] == "0" and os.environ["TFL_TASK"] == "worker:0":
            os.kill(os.getpid(), 9)
        time.sleep(0.3)
    """)
    cluster = two_hosts(tmp_path, sshd, tfl_home, storage={"path": str(tmp_path)})  # restarts need one
    result = tfl(["launch", str(job), "--cluster", str(cluster), "--max-restarts", "1"], child_env)
    assert result.returncode == 0, result.stderr
    assert "restart 1: worker:0 on 127.0.0.3: killed by SIGKILL" in result.stderr
    log = (tfl_home / "runs" / only_run(tfl_home) / "logs" / "worker-0.log").read_text()
    assert log.startswith("attempt 0") and "--- tfl: attempt 1 of worker:0" in log and log.rstrip().endswith("attempt 1")


def test_tfl_stop_after_launcher_kill9_on_ssh_hosts(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                     child_env: dict[str, str]) -> None:
    launcher, run = start_sleepers(sshd, tmp_path, tfl_home, child_env)
    kits = [sshd.home(h) / ".cache" / "tfl" / "runs" / run / h / "kit" for h in ("127.0.0.2", "127.0.0.3")]
    assert all(k.is_dir() for k in kits)
    launcher.kill()
    launcher.wait()
    stopped = tfl(["stop", run, "--grace-period", "2"], child_env)
    assert stopped.returncode == 0 and stopped.stdout.startswith(f"run {run}: stopped")
    assert tfl_processes(run_id=run) == []
    assert not any(k.exists() for k in kits)  # no launcher was left to remove what it shipped: `tfl stop` did
    assert RunStore(tfl_home).load(run).state.value == "stopped"
    again = tfl(["stop", run], child_env)
    assert again.returncode == 0 and "already stopped; nothing to stop" in again.stdout


def test_tfl_stop_names_each_host_it_could_not_reach_and_what_becomes_of_its_tasks(
        sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    launcher, run = start_sleepers(sshd, tmp_path, tfl_home, child_env)
    launcher.kill()
    launcher.wait()
    store = RunStore(tfl_home)
    record = store.load(run)
    plan = record.plan
    cut = json.loads(json.dumps(plan))
    for task in cut["tasks"]:
        if task["host"] == "127.0.0.3":
            task["ssh"]["host"] = NOWHERE  # as if the host had gone: nothing answers there
    record.plan = cut
    store.save(record)
    stopped = tfl(["stop", run, "--grace-period", "2"], child_env)
    assert stopped.returncode == 0, stopped.stderr
    lines = stopped.stdout.splitlines()
    # the agents fenced their tasks when the killed launcher's connections closed: 0 or 1 still alive on 127.0.0.2
    assert re.fullmatch(rf"run {run}: stopped [01] process\(es\) left by a launcher that was gone", lines[0]), lines
    assert len(lines) == 2 and lines[1].startswith(f"  not reached: 127.0.0.3: connection refused on port {sshd.port}"), lines
    assert lines[1].endswith("its agent there ends them once it loses the launcher: at once when the launcher's "
                             "connection closes, else 30 s after its last word (ssh.fence_after)"), lines
    wait_for(lambda: tfl_processes(run_id=run) == [], timeout=10)
    record = store.load(run)
    record.plan = plan
    store.save(record)
    again = tfl(["stop", run], child_env)  # the host is back: nothing left there to stop, nothing said of it
    assert again.returncode == 0 and again.stdout.strip() == f"run {run}: already stopped; nothing to stop", again.stdout


def test_detach_checks_hosts_before_returning_then_runs(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                        child_env: dict[str, str]) -> None:
    """--detach returns once the background launcher has checked the hosts and recorded the run: a
    bad host is its one line on the terminal (no run dir left); a good cluster runs to the end in
    the background. The hosts are reached once each, by the background launcher (no preflight
    of the foreground's own on a second connection per host)."""
    job = write_job(tmp_path / "src", INFO_JOB)
    bad = two_hosts(tmp_path, sshd, tfl_home, hosts={"127.0.0.3": {"python": "/no/such/python3"}})
    failed = tfl(["launch", str(job), "--cluster", str(bad), "--detach"], child_env)
    assert failed.returncode == 2 and failed.stderr.startswith("tfl: error: 127.0.0.3: python '/no/such/python3' not found")
    assert "Traceback" not in failed.stderr and "detached launcher" not in failed.stderr, failed.stderr
    assert not (tfl_home / "runs").exists() or not list((tfl_home / "runs").iterdir())
    good = two_hosts(tmp_path, sshd, tfl_home)
    logins = sshd.log().count("Accepted publickey")
    started = tfl(["launch", str(job), "--cluster", str(good), "--detach"], child_env)
    assert started.returncode == 0, started.stderr
    assert sshd.log().count("Accepted publickey") - logins == 2  # one connection per host, the run's own
    run = started.stdout.strip()
    # The record, read here (a `tfl status` per poll would start a Python each 50 ms), then `tfl status` once.
    wait_for(lambda: RunStore(tfl_home).load(run).state.is_terminal, timeout=90)
    assert json.loads(tfl(["status", run, "--json"], child_env).stdout)["state"] == "succeeded"
    log = (tfl_home / "runs" / run / "logs" / "worker-0.log").read_text()
    assert log.startswith("info ") and json.loads(log.split(" ", 1)[1])["cwd"].endswith("$(touch x); `id`")
    wait_for(lambda: tfl_processes(home=str(tfl_home)) == [])


def test_a_host_s_tasks_run_under_one_agent_in_one_session_and_a_restart_uses_it_again(
        sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """Three tasks on 127.0.0.2, one on 127.0.0.3: each host runs one agent (one SSH session, one remote
    python) whatever its tasks; the task killed there restarts under that same agent."""
    job = write_job(tmp_path / "src", """
        import os, time
        print("agent", os.getppid(), "attempt", os.environ["TFL_ATTEMPT"], flush=True)
        if os.environ["TFL_ATTEMPT"] == "0" and os.environ["TFL_TASK"] == "worker:1":
            time.sleep(0.5)
            os.kill(os.getpid(), 9)
        time.sleep(2)
    """)
    tasks = {"chief": [f"127.0.0.2:{free_port()}"], "worker": [f"127.0.0.2:{free_port()}", f"127.0.0.2:{free_port()}",
                                                               f"127.0.0.3:{free_port()}"]}
    workdirs = {"127.0.0.2": tfl_home / "hosts" / "a", "127.0.0.3": tfl_home / "hosts" / "b"}
    cluster = cluster_file(tmp_path / "cluster.json", sshd, tasks, workdirs, storage={"path": str(tmp_path)})
    result = tfl(["launch", str(job), "--cluster", str(cluster), "--max-restarts", "1"], child_env)
    assert result.returncode == 0, result.stderr
    logs = {name: (tfl_home / "runs" / only_run(tfl_home) / "logs" / f"{name}.log").read_text()
            for name in ("chief-0", "worker-0", "worker-1", "worker-2")}
    agents = {name: {int(a) for a in re.findall(r"^agent (\d+) attempt", log, re.M)} for name, log in logs.items()}
    assert all(len(found) == 1 for found in agents.values()), agents  # both attempts of each under one agent
    first_host = agents["chief-0"] | agents["worker-0"] | agents["worker-1"]
    assert len(first_host) == 1 and agents["worker-2"] != first_host, agents  # one agent per host
    assert "attempt 1" in logs["worker-1"] and "--- tfl: attempt 1 of worker:1" in logs["worker-1"]
    assert tfl_processes(run_id=only_run(tfl_home)) == []
