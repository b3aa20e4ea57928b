"""4. (SSH part) Time until every task has started on 1, 2, 4, 8 hosts reached over SSH.

The hosts are loopback addresses 127.0.0.2 … 127.0.0.9 served by one private sshd (its
own host key, client key and known_hosts, in the bench's temp dir); nothing listens on
or connects to any other address. One tiny task per host, the job and the job kit shipped
by tfl (every launch ships the kit) into each host's private run dir.

Every SSH session starts the account's login shell, and bash started by sshd sources
~/.bashrc. That file is the account's, not tfl's (on the machine the report was made on,
root's runs `pyenv init`), so the hosts are measured twice: with a plain login shell (the
private sshd sets SHLVL=1 in its sessions, which makes bash skip ~/.bashrc), which the
target is judged on, and with the account's ~/.bashrc as it is.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench.common import PYTHON, TINY, BenchError, Workspace, assert_none_left, tfl_command
from bench.config import Config
from bench.procs import run_launcher
from bench.runs import GroupRun, free_ports

SSHD = "/usr/sbin/sshd"
HOSTS = tuple(f"127.0.0.{i}" for i in range(2, 10))


def availability() -> str | None:
    """None when the SSH measurement can run, else why not."""
    if importlib.util.find_spec("launcher.engines.ssh") is None:
        return "not measured: SSH backend not available at the time (launcher/engines/ssh/ missing)"
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        return f"not measured: {SSHD} or ssh-keygen not installed (apt-get install openssh-server)"
    return None


SHELLS = {"plain": "plain login shell", "bashrc": "this account's ~/.bashrc"}


@dataclass
class SSHLaunch:
    all_started_s: float
    launcher_cpu_s: float
    sessions_cpu_s: float  # sshd's sessions: the session processes, their shells, tfl's agents, the tasks
    connections: int  # SSH connections the launch opened (sshd's "Accepted publickey" lines)
    sessions: int  # … and sessions ("Starting session: command")

    @property
    def cpu_s(self) -> float:
        return self.launcher_cpu_s + self.sessions_cpu_s


def bashrc_differs() -> bool:
    """Whether sshd's sessions here would source a ~/.bashrc (the account's shell is bash and has one)."""
    return pwd.getpwuid(os.getuid()).pw_shell.endswith("bash") and (Path.home() / ".bashrc").is_file()


def ssh_scaling(cfg: Config, ws: Workspace) -> tuple[dict[str, dict[int, list[SSHLaunch]]] | None, str]:
    """shell ("plain", "bashrc") -> hosts -> launches. The account's ~/.bashrc is measured at the
    smallest and largest N only, and only where there is one."""
    why = availability()
    if why:
        return None, why
    results: dict[str, dict[int, list[SSHLaunch]]] = {}
    shells = {"plain": cfg.ssh_ns}
    if bashrc_differs():
        shells["bashrc"] = (min(cfg.ssh_ns), max(cfg.ssh_ns))
    for shell, ns in shells.items():
        sshd_dir = ws.root / f"sshd-{shell}"
        server, port = _start_sshd(sshd_dir, HOSTS[:max(ns)], skip_bashrc=shell == "plain")
        try:
            times: dict[int, list[SSHLaunch]] = {n: [] for n in ns}
            for rep in range(cfg.reps):
                for n in (ns if rep % 2 == 0 else tuple(reversed(ns))):
                    times[n].append(_launch(ws, sshd_dir, server.pid, port, n, rep))
            results[shell] = times
        finally:
            server.terminate()
            server.wait(10)
    return results, (f"SSH: one tiny task per host on {', '.join(HOSTS[:max(cfg.ssh_ns)])} (loopback aliases of this "
                     f"machine, one private sshd); `tfl launch --cluster` ships the job and the job "
                     f"kit to each host. {cfg.reps} repetitions; "
                     "the ratio is to the 1-host run of the same repetition.")


def _launch(ws: Workspace, sshd_dir: Path, sshd_pid: int, port: int, n: int, rep: int) -> SSHLaunch:
    home = ws.home(f"ssh-{n}-r{rep}")
    hosts = HOSTS[:n]
    addresses = [f"{h}:{p}" for h, p in zip(hosts, free_ports(n), strict=True)]
    workdirs = {h: home / "hosts" / h for h in hosts}
    for d in workdirs.values():
        d.mkdir(parents=True)
    cluster = home / "cluster.json"
    cluster.write_text(json.dumps({
        "cluster": {"chief": addresses[:1], "worker": addresses[1:]},
        "ssh": {"user": "root", "port": port, "identity_file": str(sshd_dir / "client_key"),
                "known_hosts": str(sshd_dir / "known_hosts"), "connect_timeout": 10},
        "hosts": {h: {"python": PYTHON, "workdir": str(d)} for h, d in workdirs.items()},
    }, indent=1))
    sessions_before = _reaped_cpu(sshd_pid)
    log_before = (sshd_dir / "sshd.log").stat().st_size
    spawned = time.time()
    usage = run_launcher([*tfl_command(), "launch", str(TINY), "--cluster", str(cluster), "--", "--sleep", "0.5"],
                         ws.env(home), timeout=300)
    (run_dir,) = (home / "runs").iterdir()
    assert_none_left(home)
    if usage.exit_code != 0:
        logs = " | ".join(p.read_text(errors="replace")[-300:] for p in sorted((run_dir / "logs").glob("*.log")))
        raise BenchError(f"tfl launch over SSH on {n} host(s) exited {usage.exit_code}: {logs}")
    started = GroupRun(usage.wall_s, run_dir, spawned, usage).all_started_s(n)
    sessions = _reaped_cpu(sshd_pid, settle=True) - sessions_before
    with open(sshd_dir / "sshd.log", "rb") as f:
        f.seek(log_before)
        said = f.read().decode(errors="replace")
    return SSHLaunch(started, usage.own_cpu_s + usage.children_cpu_s, sessions,
                     said.count("Accepted publickey"), said.count("Starting session: command"))


def _reaped_cpu(sshd_pid: int, settle: bool = False) -> float:
    """CPU seconds of every session sshd has reaped so far (its cutime + cstime).

    ``settle``: first wait (up to 5 s) until sshd has reaped the sessions that just ended.
    """
    if settle:
        deadline = time.monotonic() + 5
        while psutil.Process(sshd_pid).children() and time.monotonic() < deadline:
            time.sleep(0.02)
    times = psutil.Process(sshd_pid).cpu_times()
    return float(times.children_user + times.children_system)


def _start_sshd(directory: Path, hosts: tuple[str, ...], skip_bashrc: bool) -> tuple[subprocess.Popen[bytes], int]:
    if not all(h.startswith("127.") for h in hosts):
        raise BenchError(f"refusing to start sshd on a non-loopback address: {hosts}")
    directory.mkdir(parents=True)
    for key in ("host_ed25519", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / key)], check=True)
    shutil.copy(directory / "client_key.pub", directory / "authorized_keys")
    port = free_ports(1)[0]
    (directory / "sshd_config").write_text("\n".join([
        *(f"ListenAddress {h}:{port}" for h in hosts),
        f"HostKey {directory / 'host_ed25519'}", f"PidFile {directory / 'sshd.pid'}",
        f"AuthorizedKeysFile {directory / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "StrictModes no", "UsePAM no", "MaxSessions 64", "MaxStartups 64", "LogLevel VERBOSE",
        # bash takes a session with SHLVL >= 1 for a nested shell and skips ~/.bashrc.
        *(["SetEnv SHLVL=1"] if skip_bashrc else []), "",
    ]))
    host_key = " ".join((directory / "host_ed25519.pub").read_text().split()[:2])
    (directory / "known_hosts").write_text("".join(f"[{h}]:{port} {host_key}\n" for h in hosts))
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege separation dir
    log = open(directory / "sshd.log", "wb")
    server = subprocess.Popen([SSHD, "-D", "-e", "-f", str(directory / "sshd_config")], stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise BenchError(f"sshd exited with {server.returncode}: {(directory / 'sshd.log').read_text()[-500:]}")
        try:
            for h in hosts:
                socket.create_connection((h, port), timeout=1).close()
            return server, port
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise BenchError(f"sshd did not listen on {hosts} port {port}")
