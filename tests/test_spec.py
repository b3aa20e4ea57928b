"""Cluster description validation: every rule, each with its message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.errors import ClusterFileError
from launcher.spec import ClusterSpec, load_cluster, local_cluster, parse_address, parse_cluster

ROOT = Path(__file__).resolve().parent.parent


def error_of(data: object) -> str:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster(data, "c.json")
    return str(info.value)


def test_example_file_is_valid() -> None:
    spec = load_cluster(ROOT / "cluster.example.json")
    assert spec.cluster.chief == ["localhost:23456"]
    assert spec.cluster.worker == ["localhost:23457"]
    assert spec.cluster.evaluator == ["localhost:23458"]


@pytest.mark.parametrize("data, expected", [
    ({"cluster": {"chief": ["a:1", "b:2"]}}, "c.json: cluster.chief: has 2 entries; at most one chief is allowed (move the others to cluster.worker)"),
    ({"cluster": {"worker": ["a:1"], "evaluator": ["b:1", "c:1"]}}, "c.json: cluster.evaluator: has 2 entries; at most one evaluator is allowed"),
    ({"cluster": {"evaluator": ["a:1"]}}, "c.json: cluster: no training task; add a 'chief' or at least one 'worker'"),
    ({"cluster": {}}, "no training task"),
    ({"cluster": {"chief": ["a:1"], "worker": ["a:1"]}}, "c.json: cluster: a:1 is used by more than one task; give each task its own host:port"),
    ({"cluster": {"chief": ["localhost:1"], "worker": ["gpu1:1"]}}, "c.json: cluster: mixes local hosts (localhost/127.0.0.1/::1) with remote ones"),
    ({"cluster": {"chief": ["a"]}}, "c.json: cluster.chief: 'a' is not host:port (write e.g. 'localhost:23456'"),
    ({"cluster": {"chief": ["a:0"]}}, "port '0' must be a number from 1 to 65535"),
    ({"cluster": {"chief": ["a:70000"]}}, "port '70000' must be a number from 1 to 65535"),
    ({"cluster": {"chief": ["a:x"]}}, "port 'x' must be a number from 1 to 65535"),
    ({"cluster": {"chief": ["bad_host!:1"]}}, "'bad_host!' is not a valid hostname or IP address"),
    ({"cluster": {"chief": ["[localhost]:1"]}}, "'localhost' is not a valid hostname or IP address"),
    ({"cluster": {"chief": ["a:1"]}, "wrokers": 1}, "c.json: wrokers: unknown key; remove it or check its spelling"),
    ({"cluster": {"chief": ["a:1"], "workers": ["b:1"]}}, "c.json: cluster.workers: unknown key"),
    ({"chief": ["a:1"]}, "c.json: cluster: required key is missing"),
    ([1, 2], "c.json: the file must hold a JSON object with a 'cluster' key"),
    ({"cluster": {"chief": ["a:1"]}, "hosts": {"b": {}}}, "c.json: hosts.b names a host no task runs on (tasks run on: a)"),
    ({"cluster": {"chief": ["a:1"]}, "env": {"TF_CONFIG": "{}"}}, "env sets TF_CONFIG, which tfl sets for each task; remove it"),
    ({"cluster": {"chief": ["a:1"]}, "hosts": {"a": {"env": {"TFL_TASK": "x"}}}}, "env sets TFL_TASK"),
    ({"cluster": {"chief": ["a:1"]}, "ssh": {"port": 0}}, "c.json: ssh.port: "),
    ({"cluster": {"chief": ["a:1"]}, "env": {"X": 1}}, "c.json: env.X: "),
])
def test_rule_messages(data: object, expected: str) -> None:
    assert expected in error_of(data)


def test_valid_forms() -> None:
    spec = parse_cluster({
        "cluster": {"chief": ["[::1]:2222"], "worker": ["127.0.0.1:2223", "localhost:2224"]},
        "env": {"A": "1"}, "hosts": {"localhost": {"python": "/usr/bin/python3", "env": {"B": "2"}}},
    })
    assert [str(a) for a in spec.cluster.addresses("chief")] == ["[::1]:2222"]
    assert spec.host("localhost").python == "/usr/bin/python3"
    assert spec.host("127.0.0.1").python is None


def test_address_parsing() -> None:
    assert parse_address("gpu-1.example.com:80").host == "gpu-1.example.com"
    assert parse_address("[fe80::1]:9").port == 9
    assert not parse_address("10.0.0.1:9").is_local
    assert parse_address("localhost:9").is_local


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ClusterFileError, match=r"nope.json: no such file \(pass a cluster description"):
        load_cluster(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"cluster": {"chief": ["a:1"],}}')
    with pytest.raises(ClusterFileError, match=r"bad.json: not valid JSON: line 1 column \d+"):
        load_cluster(bad)


def test_local_cluster_uses_distinct_free_ports() -> None:
    spec = local_cluster(3, evaluator=True)
    addrs = [a for t in ("chief", "worker", "evaluator") for a in spec.cluster.addresses(t)]
    assert len(spec.cluster.chief) == 1 and len(spec.cluster.worker) == 2 and len(spec.cluster.evaluator) == 1
    assert len({a.port for a in addrs}) == 4 and all(a.host == "127.0.0.1" for a in addrs)
    with pytest.raises(ClusterFileError, match="needs at least 1 training task"):
        local_cluster(0)


def test_schema_describes_fields() -> None:
    schema = json.dumps(ClusterSpec.model_json_schema())
    assert "at most one host:port" in schema and "identity_file" in schema
