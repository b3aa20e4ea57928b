"""The cluster's names, as TF_CONFIG holds them, must resolve on each training host: the tasks dial
each other by them. A name only the launcher's ssh config knows (a ``Host gpu1`` alias) reaches the
host over SSH but not from the other hosts: doctor and launch say so, naming the host and the fix,
instead of tasks that wait for each other forever (pure: the facts are made here)."""

from __future__ import annotations

import pytest

from launcher.describe.hosts import RemoteOptions
from launcher.describe.spec import parse_cluster
from launcher.engines.preflight import HostTasks, cluster_hosts, judge, probe_request
from launcher.engines.ssh.node.agent import _unresolved

FACTS = {"python": "3.11.7", "executable": "/opt/py", "ports": {"2222": None}}


def test_each_training_host_is_asked_for_the_other_training_hosts_names_not_addresses() -> None:
    spec = parse_cluster({"cluster": {"chief": ["gpu1:2222"], "worker": ["gpu2:2222", "10.1.0.13:2222"],
                                      "evaluator": ["evalbox:2222"]}}, "c.json")
    hosts = {h.host: h for h in cluster_hosts(spec, RemoteOptions())}
    assert hosts["gpu1"].peers == ["gpu2"] and hosts["gpu2"].peers == ["gpu1"]
    assert hosts["10.1.0.13"].peers == ["gpu1", "gpu2"]
    assert hosts["evalbox"].peers == []  # the sidecar evaluator dials no task
    assert probe_request(hosts["10.1.0.13"], quick=True)["names"] == ["gpu1", "gpu2"]


def test_a_name_the_host_cannot_resolve_fails_naming_it_and_the_fix() -> None:
    host = HostTasks("gpu2", "/opt/py", None, None, [("worker:0", 2222)], peers=["gpu1"])
    failed = [c for c in judge(host, {**FACTS, "unresolved": {"gpu1": "Name or service not known"}}, quick=True)
              if c.name == "names"]
    assert [c.status for c in failed] == ["fail"]
    assert failed[0].detail == ("gpu2 cannot resolve gpu1 (Name or service not known): its tasks reach the others by "
                                "the names in cluster (TF_CONFIG), and would wait for them forever; write those hosts' "
                                "addresses in cluster, or make gpu2's DNS or /etc/hosts know them")
    assert not [c for c in judge(host, {**FACTS, "unresolved": {}}, quick=True) if c.name == "names"]
    assert not [c for c in judge(host, FACTS, quick=True) if c.name == "names"]  # an answer without the field


def test_the_agent_reports_only_the_names_that_do_not_resolve() -> None:
    assert _unresolved(["localhost"]) == {}  # /etc/hosts: nothing leaves this machine
    assert _unresolved([]) == {}


def test_a_slow_resolver_costs_one_lookup_not_one_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """At hundreds of named hosts, each host asks for every other's name: asked one by one, a resolver
    that takes a second per name (a DNS server timing out) would hold the launch's checks for minutes."""
    import socket
    import time

    def slow(name: str, *args: object, **kwargs: object) -> list[object]:
        time.sleep(1.0)
        if name.startswith("gone"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return []

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    names = [f"gpu{i}" for i in range(31)] + ["gone1"]
    started = time.monotonic()
    assert _unresolved(names) == {"gone1": "Name or service not known"}
    assert time.monotonic() - started < 16  # one by one: 32 s; 16 at a time: 2 s (a hang guard far above it)
