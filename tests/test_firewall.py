"""The run's firewall, pure parts: the table's name, its rules, the addresses admitted, and the
one-line refusals of a host that cannot fence (no nft, no root and no sudo, sudo asking a
password). The netns bed proves the rules on real hosts (``test_firewall_bed``)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from launcher.describe.hosts import SSHTarget
from launcher.engines.ssh import firewall
from launcher.engines.ssh.failures import SSHError
from launcher.engines.ssh.node import agent_firewall as agent
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.tasks import TaskId


def test_the_table_is_named_after_the_run_in_letters_digits_and_underscores() -> None:
    assert firewall.table_name("20261125-2050-ab.cd") == "tfl_20261125_2050_ab_cd"
    assert firewall.table_name("räte") == "tfl_r_te"


def test_the_rules_admit_loopback_and_the_runs_hosts_to_the_task_ports_and_drop_the_rest() -> None:
    rules = agent.ruleset("tfl_r", "input_ab", [2223, 2222, 2222], ["10.0.0.2", "10.0.0.3"], [])
    assert "table inet tfl_r {\n  chain input_ab {\n    type filter hook input priority 0; policy accept;" in rules
    assert rules.splitlines()[:2] == ["table inet tfl_r", "delete table inet tfl_r"]  # an older one replaced, atomically
    body = [line.strip() for line in rules.splitlines()[5:-2]]
    assert body == ['iif "lo" tcp dport { 2222, 2223 } accept', "ip saddr { 10.0.0.2, 10.0.0.3 } tcp dport { 2222, 2223 } accept",
                    "tcp dport { 2222, 2223 } drop"]
    assert "ip6 saddr { fd00::2 } tcp dport { 5 } accept" in agent.ruleset("t", "c", [5], [], ["fd00::2"])


def test_the_output_chain_keeps_the_hosts_other_users_from_dialling_the_runs_task_ports() -> None:
    """Only the run's login user (its uid) and root open connections to a task port: this host's own
    over loopback (any local address: oif lo), every run host's by its address and port."""
    rules = agent.output_ruleset("tfl_r", "output_ab", 1000, [2223, 2222],
                                 [["10.0.0.3", 2223], ["10.0.0.2", 2222], ["fd00::2", 2222], ["10.0.0.2", 2222]])
    assert rules.startswith("table inet tfl_r {\n  chain output_ab {\n    type filter hook output priority 0; policy accept;\n")
    syn = "tcp flags & (fin | syn | rst | ack) == syn"  # a connection's first packet: no conntrack needed
    body = [line.strip() for line in rules.splitlines()[3:-2]]
    assert body == ["meta skuid { 0, 1000 } accept", f'oif "lo" tcp dport {{ 2222, 2223 }} {syn} drop',
                    f"ip daddr . tcp dport {{ 10.0.0.2 . 2222, 10.0.0.3 . 2223 }} {syn} drop",
                    f"ip6 daddr . tcp dport {{ fd00::2 . 2222 }} {syn} drop"]
    assert agent.output_ruleset("t", "c", 0, [5], [["10.0.0.2", 5]]).splitlines()[3].strip() == "meta skuid 0 accept"


def test_the_holder_installs_both_chains_with_its_mark_in_one_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    scripts: list[str] = []
    monkeypatch.setattr(agent, "nft", scripts.append)
    monkeypatch.setattr(os, "getuid", lambda: 1234)
    agent.install({"table": "tfl_r", "ports": [2222], "ipv4": ["10.0.0.2"], "ipv6": [],
                   "destinations": [["10.0.0.2", 2222], ["10.0.0.3", 2223]]}, "ab12")
    assert len(scripts) == 1
    assert "chain input_ab12 {" in scripts[0] and "chain output_ab12 {" in scripts[0]
    assert "meta skuid { 0, 1234 } accept" in scripts[0] and "10.0.0.3 . 2223" in scripts[0]


def _fenced_plan(*tasks: tuple[str, int, bool]) -> LaunchPlan:
    return LaunchPlan(run_id="r", run_dir="/d", job="job.py", job_args=(), tasks=tuple(
        TaskLaunch(task=TaskId("worker", i), host=host, port=port, argv=("python",), env={}, cwd=None, log_path="l",
                   progress_path="p", ssh=SSHTarget(host=host, port=22, user="u", firewall=fenced))
        for i, (host, port, fenced) in enumerate(tasks)))


def test_the_destinations_are_each_fenced_tasks_port_at_each_address_of_its_host() -> None:
    plan = _fenced_plan(("gpu1", 2222, True), ("gpu1", 2223, True), ("gpu2", 2222, True), ("gpu3", 2224, False))
    addresses = {"gpu1": ["10.0.0.1", "fd00::1"], "gpu2": ["10.0.0.2"], "gpu3": ["10.0.0.3"]}
    assert firewall.destinations(plan, addresses) == [["10.0.0.1", 2222], ["10.0.0.1", 2223], ["10.0.0.2", 2222],
                                                      ["fd00::1", 2222], ["fd00::1", 2223]]  # gpu3 is not fenced


def test_addresses_are_kept_and_names_resolved_here_once(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def lookup(host: str, *args: Any, **kwargs: Any) -> list[Any]:
        asked.append(host)
        return [(socket.AF_INET, 0, 0, "", ("10.0.0.9", 0)), (socket.AF_INET6, 0, 0, "", ("fd00::9%eth0", 0, 0, 0))]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    assert firewall.resolve(["10.0.0.2", "gpu9", "::1", "10.0.0.2"]) == (["10.0.0.2", "10.0.0.9"], ["::1", "fd00::9"])
    assert asked == ["gpu9"]


def test_a_name_that_does_not_resolve_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    with pytest.raises(SSHError) as caught:
        firewall.resolve(["gpu9"])
    assert "gpu9" in str(caught.value) and "by address" in str(caught.value)


def test_no_nft_is_refused_with_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TFL_TEST_NFT", "/nonexistent/nft")
    with pytest.raises(agent.Refused) as caught:
        agent.nft_argv()
    assert caught.value.why == "nft not found" and "apt-get install nftables" in caught.value.fix


def test_not_root_without_sudo_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nft = tmp_path / "nft"
    nft.write_text("#!/bin/sh\n")
    nft.chmod(0o755)
    monkeypatch.setenv("TFL_TEST_NFT", str(nft))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(agent.Refused) as caught:
        agent.nft_argv()
    assert "not root and sudo is missing" in caught.value.why and "without a password" in caught.value.fix


def test_sudo_asking_a_password_is_refused_with_nopasswd_as_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sudo = tmp_path / "sudo"
    sudo.write_text("#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n")
    sudo.chmod(0o755)
    monkeypatch.setattr(agent, "nft_argv", lambda: [str(sudo), "-n", "/usr/sbin/nft"])
    with pytest.raises(agent.Refused) as caught:
        agent.nft("table inet t\n")
    assert "sudo asks for a password" in caught.value.why and "NOPASSWD" in caught.value.fix
    assert agent.drop({"table": "t"}) == {"error": caught.value.why, "fix": caught.value.fix}  # tfl stop / rm say so


def test_nfts_own_error_line_is_the_one_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nft = tmp_path / "nft"
    nft.write_text("#!/bin/sh\nprintf 'Error: Could not process rule: Operation not permitted\\ntable inet t\\n      ^^\\n' >&2\n"
                   "exit 1\n")
    nft.chmod(0o755)
    monkeypatch.setattr(agent, "nft_argv", lambda: [str(nft)])
    with pytest.raises(agent.Refused) as caught:
        agent.nft("table inet t\n")
    assert caught.value.why == "nft failed: Error: Could not process rule: Operation not permitted"


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_a_port_is_listened_on_while_a_server_holds_it_and_not_after(family: socket.AddressFamily) -> None:
    """What a holder that lost its launcher waits on before it removes the table (``wait_unserved``)."""
    if family == socket.AF_INET6 and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    server = socket.socket(family)
    server.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
    port = server.getsockname()[1]
    connected = socket.socket(family)
    connected.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))  # bound, not listening: no server
    other = connected.getsockname()[1]
    try:
        server.listen()
        assert agent.listened([port, other]) == {port}
    finally:
        server.close()
        connected.close()
    assert agent.listened([port, other]) == set()
    agent.wait_unserved([port], linger=60)  # returns at once: nothing to wait for


def _doctor_firewall(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fenced: bool) -> list[Any]:
    """``tfl doctor``'s checks named "firewall" for one host whose login user is not root and whose sudo asks a password."""
    from launcher.engines.preflight import HostTasks, judge, probe_request
    from launcher.engines.ssh.node import agent as node

    sudo = tmp_path / "sudo"
    sudo.write_text("#!/bin/sh\necho 'sudo: a password is required' >&2\nexit 1\n")
    sudo.chmod(0o755)
    nft = tmp_path / "nft"
    nft.write_text("#!/bin/sh\n")
    nft.chmod(0o755)
    monkeypatch.setenv("TFL_TEST_NFT", str(nft))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: str(sudo) if name == "sudo" else which(name))
    h = HostTasks("gpu1", "/py", str(tmp_path), SSHTarget(host="gpu1", port=22, user="u", firewall=fenced), [("chief:0", 2222)])
    facts = node.probe(probe_request(h))
    return [c for c in judge(h, facts) if c.name == "firewall"]


def test_doctor_says_that_a_host_cannot_fence_before_a_launch_refuses_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``"ssh": {"firewall": true}`` on a host where nft would need a password: doctor said every check was ok,
    and only the launch refused. Now one line for the host, the launch's words and fix."""
    checks = _doctor_firewall(tmp_path, monkeypatch, fenced=True)
    assert [(c.host, c.status) for c in checks] == [("gpu1", "fail")]
    assert checks[0].detail.startswith("cannot fence the task ports with nftables (sudo asks for a password")
    assert "NOPASSWD" in checks[0].detail and checks[0].detail.endswith("or set ssh.firewall to false")


def test_doctor_asks_nothing_of_nft_where_the_file_does_not_fence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _doctor_firewall(tmp_path, monkeypatch, fenced=False) == []


def test_a_host_that_can_fence_is_one_ok_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    nft = tmp_path / "nft"
    nft.write_text("#!/bin/sh\ncat >/dev/null\n")  # reads the script (list tables) and succeeds
    nft.chmod(0o755)
    monkeypatch.setattr(agent, "nft_argv", lambda: [str(nft)])
    assert agent.can_fence() == {"as": "root"}
