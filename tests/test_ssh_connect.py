"""The SSH connection path against a real sshd on loopback: known_hosts read once per process,
bastions (a loopback host reached through the other one), retries of opens an sshd drops
(MaxStartups), and failed opens that leave no fd or thread behind."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.describe.hosts import SSHTarget
from launcher.describe.ports import free_port
from launcher.engines.ssh import connect as connect_mod
from launcher.engines.ssh import hostkeys, identity
from launcher.engines.ssh.connect import connect, exec_command, reach
from launcher.engines.ssh.failures import SSHError
from tests.sshd import NOWHERE, Sshd, start_sshd, stop_sshd

pytestmark = pytest.mark.ssh
LINES = 5000


def target(sshd: Sshd, host: str, **override: Any) -> SSHTarget:
    settings = sshd.ssh_settings(**override)
    return SSHTarget(host=host, **settings)


def big_known_hosts(sshd: Sshd, path: Path, wrong_key_for: str | None = None, other_key: str = "") -> Path:
    """``LINES`` lines: the sshd's hosts (127.0.0.2 hashed, as `HashKnownHosts yes` writes it) among others."""
    import paramiko

    keytype, blob = sshd.host_key_line.split()
    lines = [f"gpu{i}.example.com,10.{i // 65536}.{i // 256 % 256}.{i % 256} {keytype} {blob}" for i in range(LINES - 2)]
    for host in sshd.hosts:
        name = f"[{host}]:{sshd.port}"
        line_key = other_key if host == wrong_key_for else f"{keytype} {blob}"
        shown = paramiko.HostKeys.hash_host(name) if host == "127.0.0.2" else name
        lines.insert(LINES // 2, f"{shown} {line_key}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_known_hosts_of_5000_lines_is_read_once_for_many_connections_and_a_wrong_key_is_refused(
        sshd: Sshd, tmp_path: Path) -> None:
    known = big_known_hosts(sshd, tmp_path / "known_hosts")
    before = hostkeys.PARSES[0]
    for _ in range(3):
        for host in sshd.hosts:
            conn = connect(target(sshd, host, known_hosts=str(known)))
            assert exec_command(conn, "echo ok")[1] == b"ok\n"
            conn.close()
    assert hostkeys.PARSES[0] - before == 1  # six connections, one read
    with known.open("a") as f:  # the file changed: read again, once
        f.write("late.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGZha2VrZXlmYWtla2V5ZmFrZWtleWZha2VrZXk\n")
    connect(target(sshd, "127.0.0.2", known_hosts=str(known))).close()
    assert hostkeys.PARSES[0] - before == 2

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    wrong = big_known_hosts(sshd, tmp_path / "wrong_known_hosts", wrong_key_for="127.0.0.3", other_key=other)
    with pytest.raises(SSHError, match=r"HOST KEY CHANGED for \[127\.0\.0\.3\]"):
        connect(target(sshd, "127.0.0.3", known_hosts=str(wrong)))
    connect(target(sshd, "127.0.0.2", known_hosts=str(wrong))).close()  # its hashed line is still right


def test_a_new_host_key_accepted_is_appended_once_and_known_from_then_on(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("gpu1.example.com " + sshd.host_key_line + "\n")
    first = known.read_text()
    connect(target(sshd, "127.0.0.2", known_hosts=str(known), accept_new_host_keys=True)).close()
    parses = hostkeys.PARSES[0]
    connect(target(sshd, "127.0.0.2", known_hosts=str(known))).close()  # now known, without accepting
    assert hostkeys.PARSES[0] == parses  # the cache learnt the line it appended
    text = known.read_text()
    assert text.startswith(first) and text.count(f"[127.0.0.2]:{sshd.port}") == 1, text



def test_a_known_hosts_file_made_by_accepting_a_key_is_0600_whatever_the_umask(tmp_path: Path) -> None:
    """Made as the umask said it was 0666 under umask 000 (and a missing grandparent dir 0777, where
    its dir could be swapped): anyone could add a key for any host."""
    made, kept = tmp_path / "a" / "new" / "known_hosts", tmp_path / "known_hosts"
    kept.write_text("")
    os.chmod(kept, 0o644)
    old = os.umask(0)
    try:
        for path in (made, kept):
            hostkeys.append(str(path), "[127.0.0.2]:2222", "ssh-ed25519", "AAAA")
    finally:
        os.umask(old)
    modes = [stat.S_IMODE(p.stat().st_mode) for p in (made, made.parent, made.parent.parent, kept)]
    assert modes == [0o600, 0o700, 0o700, 0o644]
    assert made.read_text() == kept.read_text() == "[127.0.0.2]:2222 ssh-ed25519 AAAA\n"

def test_the_identity_file_is_read_once_for_many_connections_and_again_when_replaced(sshd: Sshd, tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_bytes(sshd.client_key.read_bytes())
    key.chmod(0o600)
    before = identity.LOADS[0]
    for _ in range(2):
        for host in sshd.hosts:
            conn = connect(target(sshd, host, identity_file=str(key)))
            assert conn.connect_kwargs["pkey"] is not None and "key_filename" not in conn.connect_kwargs
            assert exec_command(conn, "echo ok")[1] == b"ok\n"
            conn.close()
    assert identity.LOADS[0] - before == 1  # four connections, one read
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    os.replace(tmp_path / "other", key)  # another key now: read again, and refused by the sshd
    with pytest.raises(SSHError, match="ssh authentication refused"):
        connect(target(sshd, "127.0.0.2", identity_file=str(key)))
    assert identity.LOADS[0] - before == 2


def test_an_identity_file_that_needs_a_passphrase_is_left_to_paramiko(sshd: Sshd, tmp_path: Path) -> None:
    key = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(key)], check=True)
    with pytest.raises(SSHError) as info:
        connect(target(sshd, "127.0.0.2", identity_file=str(key)))
    assert "\n" not in str(info.value) and str(info.value).startswith("127.0.0.2: ")

def test_an_identity_file_that_is_missing_or_a_directory_says_which(tmp_path: Path) -> None:
    for path, said in ((tmp_path / "none", "not found"), (tmp_path, "is a directory, not a private key")):
        with pytest.raises(SSHError, match="^127.0.0.2: identity file .* " + said + r" \(fix ssh.identity_file"):
            connect(SSHTarget(host="127.0.0.2", port=1, identity_file=str(path)))


def test_an_identity_file_open_to_others_is_refused_as_openssh_refuses_it(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    for mode in (0o644, 0o640, 0o604):  # OpenSSH: "UNPROTECTED PRIVATE KEY FILE", the key ignored, the login refused
        key.chmod(mode)
        with pytest.raises(SSHError) as info:
            connect(SSHTarget(host="127.0.0.2", port=1, identity_file=str(key)))
        assert str(info.value) == (f"127.0.0.2: identity file {key} is open to others (mode {mode:04o}), and OpenSSH "
                                   f"refuses such a private key (make it yours alone: chmod 600 {key})")
    key.chmod(0o600)  # yours alone: on to the host (port 1: nothing listens)
    with pytest.raises(SSHError, match="connection refused"):
        connect(SSHTarget(host="127.0.0.2", port=1, identity_file=str(key)))


def test_a_host_behind_a_bastion_rides_the_one_bastion_connection(sshd: Sshd, tmp_path: Path) -> None:
    jump = f"127.0.0.2:{sshd.port}"
    conns = [connect(target(sshd, "127.0.0.3", jump=jump)) for _ in range(3)]
    try:
        holds = list(connect_mod._BASTIONS._open.values())
        assert len(holds) == 1 and holds[0].users == 3 and holds[0].name == "127.0.0.2"
        assert all(c.connect_kwargs["sock"] is not None for c in conns)
        # the target's sshd saw each connection come from the bastion's forward, not from this process's socket
        assert exec_command(conns[0], "echo $SSH_CONNECTION")[0] == 0
        assert reach(target(sshd, "127.0.0.3", jump=jump))  # the watch's probe, through the bastion
    finally:
        for c in conns:
            c.close()
    assert connect_mod._BASTIONS._open == {}  # closed with the last host behind it
    assert not holds[0].active()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.3", 0))
        return int(sock.getsockname()[1])


def test_a_port_the_bastion_cannot_open_is_no_answer_for_the_probe(sshd: Sshd) -> None:
    """OpenSSH's bastion says only "Connect failed" (refused and unreachable alike): no answer."""
    assert not reach(target(sshd, "127.0.0.3", jump=f"127.0.0.2:{sshd.port}", port=_closed_port()))
    assert connect_mod._BASTIONS._open == {}


def test_proxyjump_from_an_ssh_config_goes_through_the_shared_bastion(sshd: Sshd, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host 127.0.0.3\n    ProxyJump 127.0.0.2:{sshd.port}\n")
    first = connect(target(sshd, "127.0.0.3", config=str(config)))
    second = connect(target(sshd, "127.0.0.3", config=str(config)))
    try:
        (hold,) = connect_mod._BASTIONS._open.values()
        assert hold.users == 2
        assert exec_command(second, "echo via")[1] == b"via\n"
    finally:
        first.close()
        second.close()
    direct = connect(target(sshd, "127.0.0.3", config=str(config), jump="none"))  # 'none': straight
    assert connect_mod._BASTIONS._open == {}
    direct.close()


def test_an_unknown_bastion_key_is_refused_in_one_line_naming_the_bastion(sshd: Sshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.3]:{sshd.port} {sshd.host_key_line}\n")  # the target only
    with pytest.raises(SSHError) as info:
        connect(target(sshd, "127.0.0.3", known_hosts=str(known), jump=f"127.0.0.2:{sshd.port}"))
    text = str(info.value)
    assert "\n" not in text and text.startswith("127.0.0.3: bastion 127.0.0.2 (ssh.jump): host key of [127.0.0.2]")
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.2 >> {known}" in text
    assert connect_mod._BASTIONS._open == {}


@pytest.mark.parametrize("jump, fix", [
    (f"{NOWHERE}:{{free}}", "connection refused on port {free}; is sshd running there, and is the port of ssh.jump "
                           "(default 22) right?"),
    ("nobody@127.0.0.2:{port}", "ssh authentication refused for nobody with {key}; add the public key to "
                                "~/.ssh/authorized_keys on 127.0.0.2 or fix the user of ssh.jump (default ssh.user) / "
                                "ssh.identity_file"),
])
def test_a_bastion_that_refuses_names_the_jump_not_ssh_port_or_ssh_user(sshd: Sshd, jump: str, fix: str) -> None:
    """The bastion's port defaults to 22 and its user is the jump's: ssh.port and ssh.user are the hosts'."""
    free = free_port()  # on NOWHERE nothing listens at it
    with pytest.raises(SSHError) as info:
        connect(target(sshd, "127.0.0.3", jump=jump.format(port=sshd.port, free=free)))
    bastion = jump.split("@")[-1].split(":")[0]
    assert str(info.value) == f"127.0.0.3: bastion {bastion} (ssh.jump): " + fix.format(key=sshd.client_key, free=free)
    assert connect_mod._BASTIONS._open == {}


def test_a_chain_of_jump_hosts_is_one_line(sshd: Sshd, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host 127.0.0.3\n    ProxyJump a.example.com,b.example.com\n")
    with pytest.raises(SSHError, match=r"^127\.0\.0\.3: ProxyJump in .*ssh_config: .* names a chain of jump hosts"):
        connect(target(sshd, "127.0.0.3", config=str(config)))


@pytest.fixture
def throttled(tmp_path: Path, sshd: Sshd) -> Any:
    """A second sshd on 127.0.0.2 that lets one unauthenticated connection in at a time
    (MaxStartups 1), and a raw connection holding that place."""
    server = start_sshd(tmp_path / "throttled", hosts=("127.0.0.2",), keys_from=sshd, max_startups="1")
    deadline = time.monotonic() + 20
    while True:  # the place may still be held by start_sshd's own check that it listens
        raw = socket.create_connection(("127.0.0.2", server.port), timeout=10)
        if raw.recv(64).startswith(b"SSH-2.0-"):  # sshd took it: the one place is held
            break
        raw.close()
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    try:
        yield server, raw
    finally:
        raw.close()
        stop_sshd(server)


def test_an_open_dropped_by_maxstartups_is_tried_again_and_gets_in(throttled: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server, raw = throttled
    waits: list[float] = []

    def pause(seconds: float) -> None:  # the backoff: the place is freed while we wait
        waits.append(seconds)
        if len(waits) == 1:
            closed = server.log().count("Connection closed by")
            raw.close()
            deadline = time.monotonic() + 20
            while server.log().count("Connection closed by") <= closed and time.monotonic() < deadline:
                time.sleep(0.05)
        time.sleep(0.2)

    monkeypatch.setattr(connect_mod, "_sleep", pause)
    conn = connect(target(server, "127.0.0.2"))
    try:
        assert exec_command(conn, "echo in")[1] == b"in\n"
    finally:
        conn.close()
    assert 1 <= len(waits) < connect_mod.TRIES and waits[0] <= connect_mod.BACKOFF
    assert "MaxStartups" in server.log() or "drop connection" in server.log()


def test_failed_opens_leave_no_fd_or_thread_and_a_throttled_host_is_named_in_one_line(
        throttled: Any, sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server, _ = throttled
    waits: list[float] = []
    monkeypatch.setattr(connect_mod, "_sleep", waits.append)
    connect(target(sshd, "127.0.0.2")).close()  # paramiko imported, its lasting state made
    # What this test opens, by identity: other tests' leftovers on this worker (the job kit's
    # watcher threads) may end meanwhile, so counts alone would not tell.
    fds, threads = _fds(), set(threading.enumerate())
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True)
    failures = [
        target(server, "127.0.0.2"),  # dropped every time: MaxStartups
        target(sshd, "127.0.0.3", known_hosts=str(empty)),  # unknown host key
        target(sshd, "127.0.0.3", identity_file=str(tmp_path / "stranger")),  # auth refused
        target(sshd, NOWHERE),  # connection refused
        target(sshd, "127.0.0.3", known_hosts=str(empty), jump=f"127.0.0.2:{sshd.port}"),  # bastion key unknown
        target(sshd, "127.0.0.3", jump=f"127.0.0.2:{_closed_port()}"),  # bastion refused
        target(sshd, "127.0.0.2", jump=f"127.0.0.3:{sshd.port}", port=_closed_port()),  # target refused behind the bastion
    ]
    messages = []
    for each in failures * 2:
        with pytest.raises(SSHError) as info:
            connect(each)
        messages.append(str(info.value))
    assert all("\n" not in m for m in messages)
    assert messages[0].startswith("127.0.0.2: sshd on [127.0.0.2]") and "MaxStartups" in messages[0]
    assert len(waits) == 2 * (connect_mod.TRIES - 1)
    deadline = time.monotonic() + 30  # paramiko's transport threads end just after their close
    while _new_threads(threads) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _new_threads(threads) == []
    assert _fds() - fds == set()
    assert connect_mod._BASTIONS._open == {}


def _fds() -> set[tuple[str, str]]:
    """This process's open fds with what each points to (a reused number with a new socket differs)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:  # the listing's own fd, closed by now
            pass
    return found


def _new_threads(before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate() if t not in before]


def _wakeups(thread: threading.Thread) -> int:
    """How often ``thread`` has slept and woken (the kernel's count of its voluntary switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("voluntary_ctxt_switches")))


@pytest.mark.parametrize("jump", [False, True], ids=["direct", "bastion"])
def test_an_idle_connection_sleeps_and_its_close_ends_its_thread_at_once(sshd: Sshd, jump: bool) -> None:
    # paramiko's transport thread woke every 0.1 s for as long as its connection was open: 20 times
    # in 2 s, per host; the launcher's idle CPU at 256 hosts. Its close must still end it at once.
    conn = connect(target(sshd, "127.0.0.3", **({"jump": f"127.0.0.2:{sshd.port}"} if jump else {})))
    transport = conn.client.get_transport()
    try:
        assert exec_command(conn, "echo ok")[1] == b"ok\n"
        time.sleep(0.2)  # the reply's last packets read
        before = _wakeups(transport)
        time.sleep(2.0)
        assert _wakeups(transport) - before <= 3
    finally:
        conn.close()
    transport.join(5.0)  # a hang guard: the thread's next poll would come IDLE_POLL (10) s later
    assert not transport.is_alive()
    assert connect_mod._BASTIONS._open == {}
