"""A real sshd on loopback hosts for the SSH tests (only loopback addresses, ever).

One sshd per test session listens on 127.0.0.2 and 127.0.0.3 at one free port, with its
own host key and an ``authorized_keys`` holding a fresh client key. Tests get a
``known_hosts`` naming both hosts and write cluster files with ``cluster_file``.

Each host's sessions get a HOME and a TMPDIR of their own (``Sshd.home``, sshd's ``SetEnv`` per
listening address), as two machines would: the per-user dir tfl keeps runs in differs between the
hosts, a test may give one host a ``~/.bashrc`` of its own, and what a host's tasks leave in its
temp dir (a task or agent a test kills with SIGKILL) stays in the test's dir, not in this machine's /tmp. The account's real home and
``~/.bashrc`` are never used. ``start_sshd(..., namespace=...)`` starts one in a mount
namespace of its own, where a bind mount shows that host another directory at some path.
Without /usr/sbin/sshd the SSH tests are skipped, except in CI (CI=true) where that fails.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol

import pytest

from launcher.describe.ports import free_port

SSHD = "/usr/sbin/sshd"
HOSTS = ("127.0.0.2", "127.0.0.3")
NOWHERE = "127.0.0.4"  # a loopback address where nothing listens


@dataclass
class Sshd:
    dir: Path
    port: int
    client_key: Path
    known_hosts: Path
    host_key_line: str  # "ssh-ed25519 AAAA…" (the server's public key)
    proc: subprocess.Popen[bytes]
    hosts: tuple[str, ...] = HOSTS

    def home(self, host: str) -> Path:
        """The HOME of ``host``'s sessions (and so its ``~/.cache/tfl`` and ``~/.bashrc``)."""
        return self.dir / f"home-{host}"

    def known_hosts_for(self, hosts: tuple[str, ...], path: Path) -> Path:
        named = (h if self.port == 22 else f"[{h}]:{self.port}" for h in hosts)  # ssh's own spelling
        path.write_text("".join(f"{n} {self.host_key_line}\n" for n in named))
        return path

    def ssh_settings(self, **override: Any) -> dict[str, Any]:
        # A private sshd lets in only the user who started it: root in CI, anyone else elsewhere.
        return {"user": pwd.getpwuid(os.getuid()).pw_name, "port": self.port, "identity_file": str(self.client_key),
                "known_hosts": str(self.known_hosts), "connect_timeout": 5, **override}

    def log(self) -> str:
        return (self.dir / "sshd.log").read_text(errors="replace")


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def start_sshd(directory: Path, hosts: tuple[str, ...] = HOSTS, keys_from: Sshd | None = None,
               namespace: tuple[Path, Path] | None = None, netns: str | None = None, port: int | None = None,
               max_startups: str | None = "64", wait: bool = True) -> Sshd:
    """``keys_from``: reuse that sshd's keys (one known_hosts for both). ``namespace`` (source,
    target): run in a mount namespace of its own where ``source`` is bind-mounted on ``target``.
    ``netns``: run in that network namespace (``tests.netbed``'s hosts), on ``port`` (default: a free one).
    ``max_startups``: sshd's MaxStartups (None: sshd's default, 10:30:100). ``wait``: until it listens
    (connecting from here; a host this namespace cannot reach is waited for by its caller)."""
    directory.mkdir(parents=True, exist_ok=True)
    if keys_from is None:
        _keygen(directory / "host_ed25519")
        _keygen(directory / "client_key")
    else:
        for name in ("host_ed25519", "host_ed25519.pub", "client_key", "client_key.pub"):
            shutil.copy(keys_from.dir / name, directory / name)
    shutil.copy(directory / "client_key.pub", directory / "authorized_keys")
    port = port or free_port()
    for host in hosts:
        (directory / f"home-{host}").mkdir(mode=0o700, exist_ok=True)
        (directory / f"tmp-{host}").mkdir(mode=0o700, exist_ok=True)
    config = directory / "sshd_config"
    config.write_text("\n".join([
        *(f"ListenAddress {h}:{port}" for h in hosts),
        f"HostKey {directory / 'host_ed25519'}", f"PidFile {directory / 'sshd.pid'}",
        f"AuthorizedKeysFile {directory / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "StrictModes no", "UsePAM no", "MaxSessions 64", *([f"MaxStartups {max_startups}"] if max_startups else []), "LogLevel VERBOSE",
        *(f"Match LocalAddress {h}\n  SetEnv HOME={directory / f'home-{h}'} TMPDIR={directory / f'tmp-{h}'}" for h in hosts), "",
    ]))
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation dir
    log = open(directory / "sshd.log", "wb")
    command = [SSHD, "-D", "-e", "-f", str(config)]
    if namespace is not None:  # the mount is private to sshd and its sessions: the rest of the machine sees nothing
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"',
                   "sh", str(namespace[0]), str(namespace[1]), *command]
    if netns is not None:  # `ip netns exec` execs sshd: the pid is sshd's
        command = ["ip", "netns", "exec", netns, *command]
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    host_key_line = " ".join((directory / "host_ed25519.pub").read_text().split()[:2])
    server = Sshd(directory, port, directory / "client_key", directory / "known_hosts", host_key_line, proc, hosts)
    server.known_hosts_for(hosts, server.known_hosts)
    if wait:
        _wait_listening(server)
    return server


def _wait_listening(server: Sshd, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {server.proc.returncode}: {server.log()}")
        try:
            for host in server.hosts:
                socket.create_connection((host, server.port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd not listening on {server.hosts} port {server.port}: {server.log()}")


def stop_sshd(server: Sshd) -> None:
    server.proc.terminate()
    server.proc.wait(10)
    for host in server.hosts:
        with socket.socket() as sock:
            assert sock.connect_ex((host, server.port)) != 0, f"sshd still listening on {host}:{server.port}"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not os.path.exists(SSHD):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{SSHD} is missing; CI must install openssh-server (see .ci/run)")
        pytest.skip(f"{SSHD} not installed (apt-get install openssh-server); SSH tests need a real sshd")
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    stop_sshd(server)


class Hosts(Protocol):
    """What reaches the test hosts: an ``Sshd`` on loopback, a ``tests.netbed.NetBed``."""

    def ssh_settings(self, **override: Any) -> dict[str, Any]: ...


def cluster_file(path: Path, server: Hosts, tasks: dict[str, list[str]], workdirs: dict[str, Path | None],
                 python: str | Path = sys.executable, **extra: Any) -> Path:
    """A cluster file whose hosts are reached over the test sshd, running ``python`` (this venv's:
    it has tfl; ``tests.hostenv``'s: it has not). A workdir None: the host's default."""
    hosts: dict[str, dict[str, Any]] = {h: {"python": str(python), **({"workdir": str(w)} if w else {})}
                                        for h, w in workdirs.items()}
    for host, settings in extra.pop("hosts", {}).items():
        hosts.setdefault(host, {}).update(settings)
    data = {"cluster": tasks, "ssh": server.ssh_settings(**extra.pop("ssh", {})), "hosts": hosts, **extra}
    path.write_text(json.dumps(data, indent=1))
    return path
