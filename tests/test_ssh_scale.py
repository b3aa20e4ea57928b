"""Costs that must not grow faster than the hosts (issue 29), on a real sshd with many loopback
hosts (127.0.8.x: loopback only): the job's tarball built once per launch, and a launcher short
of file descriptors that says so in one line and never calls a reachable host lost."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from launcher.describe.hosts import RemoteOptions
from launcher.describe.kinds import load_description
from launcher.engines.base import Stopped
from launcher.engines.ssh import recorded, wire
from launcher.records.store import RunStore
from launcher.runs import launch as core
from tests.procs import pid_alive, tfl_processes
from tests.sshd import SSHD, Sshd, cluster_file, start_sshd, stop_sshd

pytestmark = pytest.mark.ssh

HOSTS = tuple(f"127.0.8.{i}" for i in range(1, 17))  # sshd listens on 16 addresses at most
GO_JOB = """
    import os, sys, time
    print("ready", os.environ["TFL_TASK"], flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.2)
"""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not Path(SSHD).exists():
        pytest.skip(f"{SSHD} not installed")
    server = start_sshd(tmp_path_factory.mktemp("sshd-many"), hosts=HOSTS)
    yield server
    stop_sshd(server)


def many_tasks(tmp_path: Path, server: Sshd, hosts: int, per_host: int, port: int = 31000, **extra: Any) -> Path:
    names = HOSTS[:hosts]
    addresses = [f"{h}:{port + k}" for h in names for k in range(per_host)]
    return cluster_file(tmp_path / "c.json", server, {"chief": addresses[:1], "worker": addresses[1:]},
                        {h: None for h in names}, **extra)


def test_the_job_tarball_is_built_once_for_every_host(many: Sshd, tmp_path: Path, tfl_home: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    job = tmp_path / "src" / "job.py"
    job.parent.mkdir()
    job.write_text("print('hi')\n")
    (job.parent / "data.bin").write_bytes(bytes(range(256)) * 64)
    built: list[list[tuple[str, str]]] = []
    real = wire._tarball

    def counting(items: list[tuple[str, str]]) -> bytes:
        built.append(items)
        return real(items)

    monkeypatch.setattr(wire, "_tarball", counting)
    monkeypatch.setattr(wire, "_KIT", wire.Tarballs())  # the kit as a fresh launcher builds it
    spec = load_description(many_tasks(tmp_path, many, 6, 1))
    plan = core.make_plan(str(job), (), spec, RunStore(tfl_home), RemoteOptions(ship_code=True, sync_dirs=(str(job.parent),)))
    prepared = core.prepare(plan)
    try:
        assert all(list(many.home(host).rglob("data.bin")) for host in HOSTS[:6])  # every host got the code
    finally:
        prepared.backend.close()
    kit = [items for items in built if any(name == "launcher/jobkit" for _, name in items)]
    assert len(kit) == 1 and len(built) == 2, built  # the job's once and the kit's once, for 6 hosts (was 6 + 1)


def run_launch(tmp_path: Path, server: Sshd, home: Path, nofile: str, hosts: int, per_host: int,
               timeout: float = 150) -> tuple[subprocess.CompletedProcess[str], Path]:
    job = tmp_path / "src" / "job.py"
    job.parent.mkdir(exist_ok=True)
    job.write_text(textwrap.dedent(GO_JOB))
    go = tmp_path / "go"
    go.touch()  # every task leaves once it has said it is ready
    command = ["prlimit", f"--nofile={nofile}", sys.executable, "-m", "launcher", "launch",
               "--cluster", str(many_tasks(tmp_path, server, hosts, per_host)), str(job), str(go)]
    env = {"PATH": "/usr/bin:/bin", "TFL_HOME": str(home), "HOME": str(tmp_path)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout), job


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) missing")
def test_a_low_soft_fd_limit_is_raised_to_the_hard_one(many: Sshd, tmp_path: Path, tfl_home: Path) -> None:
    """16 hosts × 3 tasks need more than 40 descriptors: with the hard limit higher, it works."""
    done, _ = run_launch(tmp_path, many, tfl_home, "40:4096", 16, 3)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "succeeded" in done.stdout + done.stderr
    assert tfl_processes(home=str(tfl_home)) == []


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) missing")
def test_too_few_fds_fail_at_once_in_one_line_naming_the_limit_not_a_host(many: Sshd, tmp_path: Path,
                                                                          tfl_home: Path) -> None:
    done, _ = run_launch(tmp_path, many, tfl_home, "40", 16, 3)
    said = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(said) == 1, done.stderr
    assert "file descriptors" in said[0] and "ulimit -n" in said[0] and "40" in said[0], said
    assert not any(host in said[0] for host in HOSTS), said  # the launcher's limit, no host blamed
    assert "lost" not in said[0] and "unreachable" not in said[0]
    assert "Traceback" not in done.stderr
    assert tfl_processes(home=str(tfl_home)) == []


DEAF_JOB = """
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the SIGKILL after the grace ends it
    print("ready", os.environ["TFL_TASK"], flush=True)
    time.sleep(600)
"""


def _wait(check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout  # a hang guard
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_stop_of_a_run_whose_launcher_is_gone_asks_each_host_once_and_all_wait_together(
        many: Sshd, tmp_path: Path, tfl_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tfl stop` once asked every host again for each look at whether its tasks had gone (a
    connection per host per look, minutes at 256 hosts): now one session per host runs the whole
    SIGTERM, grace, SIGKILL there, every host at once."""
    hosts = 6
    job = tmp_path / "src" / "job.py"
    job.parent.mkdir()
    job.write_text(textwrap.dedent(DEAF_JOB))
    cluster = many_tasks(tmp_path, many, hosts, 1, ssh={"fence_after": 300})  # frozen, the launcher's agents wait
    env = {"PATH": "/usr/bin:/bin", "TFL_HOME": str(tfl_home), "HOME": str(tmp_path)}
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", "--cluster", str(cluster), str(job)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = RunStore(tfl_home)
    try:
        _wait(lambda: len(runs := store.list()) == 1 and len(runs[0].tasks) == hosts and all(t.pid for t in runs[0].tasks))
        os.kill(launcher.pid, signal.SIGSTOP)  # as good as gone: it pings no more, and its connections stay open
        record = store.list()[0]
        pids = [t.pid for t in record.tasks if t.pid]
        connects: list[str] = []
        real = recorded.connect
        monkeypatch.setattr(recorded, "connect",
                        lambda target, **how: connects.append(target.host) or real(target, **how))
        assert recorded.stop(record, grace=1.0) == Stopped(hosts)
        assert not any(pid_alive(pid) for pid in pids)  # SIGTERM ignored: the SIGKILL after the grace ended them
        assert sorted(connects) == sorted(HOSTS[:hosts] * 2), connects  # the stop's and the cleanup's, once per host
    finally:
        launcher.kill()
        launcher.wait(30)
    _wait(lambda: tfl_processes(home=str(tfl_home)) == [])  # the agents left with the launcher's connections


class _Settings:
    def ssh_settings(self, **override: Any) -> dict[str, Any]:
        return {"user": "nobody", "port": 22, "known_hosts": "/dev/null", **override}


class _CountedTasks(tuple):  # type: ignore[type-arg]
    scans = 0

    def __iter__(self) -> Iterator[Any]:
        _CountedTasks.scans += 1
        return super().__iter__()


def test_getting_hosts_ready_reads_the_plan_s_tasks_a_few_times_not_once_per_host(
        tmp_path: Path, tfl_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare_hosts`` looked for each host's tasks in every task of the plan, twice per host:
    hosts × tasks. No host is reached here: the pool, the agents' answers and the firewall are stand-ins."""
    import dataclasses

    from launcher.engines.ssh import prepare

    hosts = [f"198.51.100.{i}" for i in range(1, 41)]
    addresses = [f"{h}:{31000 + k}" for h in hosts for k in range(2)]
    cluster = cluster_file(tmp_path / "c.json", _Settings(), {"chief": addresses[:1], "worker": addresses[1:]},
                           {h: None for h in hosts})
    job = tmp_path / "job.py"
    job.write_text("print('hi')\n")
    plan = core.make_plan(str(job), (), load_description(cluster), RunStore(tfl_home), RemoteOptions())
    plan = dataclasses.replace(plan, tasks=_CountedTasks(plan.tasks))
    started: list[str] = []

    class Pool:
        def start_agent_ahead(self, launch: Any) -> str:
            started.append(launch.name)
            return launch.host

    class Firewalls:
        def ensure(self, plan: Any, host: str) -> None:
            return None

    def answer(chan: str, request: dict[str, Any], host: str, python: str, payloads: Any = ()) -> dict[str, Any]:
        return {"python": "3.11", "executable": python, "ports": {}, "tfl_cache": f"/cache/{host}"} if request["mode"] == "probe" else {}

    monkeypatch.setattr(prepare, "converse", answer)
    monkeypatch.setattr(wire, "_KIT", wire.Tarballs())
    _CountedTasks.scans = 0
    caches: dict[str, str] = {}
    checks = prepare.prepare_hosts(plan, Pool(), caches, Firewalls())  # type: ignore[arg-type]
    assert not [c for c in checks if c.status == "fail"] and sorted(caches) == sorted(hosts)
    assert sorted(started) == sorted(t.name for t in plan.tasks if t.name in ("chief:0",) or t.port == 31000)
    assert len(started) == len(hosts)  # one agent per host started ahead, its first task's; it runs all of the host's
    assert _CountedTasks.scans <= 4, _CountedTasks.scans  # was 2 per host and more: 80+ for 40 hosts
