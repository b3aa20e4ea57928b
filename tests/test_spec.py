"""Cluster description validation: every rule, each with its message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.describe.spec import ClusterSpec, load_cluster, local_cluster, parse_address, parse_cluster
from launcher.errors import ClusterFileError

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
    ({"cluster": {"chief": ["a"]}}, "c.json: cluster.chief[0]: 'a' is not host:port (write e.g. 'localhost:23456'"),
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
    # an SSH host made a relative (or '~') workdir under its login dir, and its tasks then looked for the job at
    # that path joined twice: one line instead
    ({"cluster": {"chief": ["a:1"]}, "hosts": {"a": {"workdir": "~/tfl"}}},
     "c.json: hosts.a.workdir: '~/tfl' is not an absolute path, which an SSH host's working dir must be ('~' is not "
     "expanded there); write it whole, e.g. /srv/tfl, or leave it out for the run's own dir on the host"),
    ({"cluster": {"chief": ["localhost:1"]}, "hosts": {"localhost": {"workdir": "w", "ssh": {"port": 2222}}}},
     "c.json: hosts.localhost.workdir: 'w' is not an absolute path"),
    ({"cluster": {"chief": ["a:1"]}, "env": {"X": 1}}, "c.json: env.X: "),
])
def test_rule_messages(data: object, expected: str) -> None:
    assert expected in error_of(data)


def test_valid_forms() -> None:
    spec = parse_cluster({
        "cluster": {"chief": ["[::1]:2222"], "worker": ["127.0.0.1:2223", "localhost:2224"]},
        "env": {"A": "1"}, "hosts": {"localhost": {"python": "/usr/bin/python3", "env": {"B": "2"}, "workdir": "w"}},
    })  # a relative workdir on this machine is the launcher's cwd's
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


# --- issue 13: every field to one standard (each case was accepted, or a traceback, before) ---
A = {"chief": ["gpu1:5"]}


@pytest.mark.parametrize("data, expected", [
    # env names: the POSIX form, so never '=', NUL or empty; values: no NUL, no lone surrogate
    ({"cluster": A, "env": {"A=B": "x"}}, "c.json: env: key 'A=B' is not an environment variable name; use letters, digits and _"),
    ({"cluster": A, "hosts": {"gpu1": {"env": {"A\x00": "x"}}}}, r"c.json: hosts.gpu1.env: key 'A\x00' is not an environment variable name"),
    ({"cluster": A, "env": {"": "x"}}, "c.json: env: key '' is not an environment variable name"),
    ({"cluster": A, "env": {"1X": "x"}}, "key '1X' is not an environment variable name"),
    ({"cluster": A, "env": {"A": "x\x00y"}}, r"c.json: env.A: 'x\x00y' contains a NUL character; remove it"),
    ({"cluster": A, "env": {"A": "\ud800"}}, r"c.json: env.A: '\ud800' contains a lone surrogate escape"),
    ({"cluster": A, "env": {"A": "x" * 200_000}}, "c.json: env.A: is 200000 bytes; an environment value may have at most"),
    # hosts and addresses: matched in full, no trailing newline; an all-numeric name is an IP
    ({"cluster": {"chief": ["gpu1\n:2222"]}}, r"c.json: cluster.chief[0]: 'gpu1\n:2222': 'gpu1\n' is not a valid hostname or IP address (write"),
    ({"cluster": {"chief": ["[fe80::1%\n]:2222"]}}, "is not a valid hostname or IP address"),
    ({"cluster": {"chief": ["127.1:2222"]}}, "'127.1' is not a valid hostname or IP address"),
    ({"cluster": A, "hosts": {"gpu1\n": {}}}, r"c.json: hosts: key 'gpu1\n' is not a valid hostname or IP address"),
    # ports: ASCII digits, no sign, no space, no leading zero
    ({"cluster": {"chief": ["gpu1:２２２２"]}}, "port '２２２２' must be a number from 1 to 65535 (ASCII digits, no sign or space)"),
    ({"cluster": {"chief": ["gpu1:٢٢٢٢"]}}, "port '٢٢٢٢' must be a number from 1 to 65535"),
    ({"cluster": {"chief": ["gpu1:+2222"]}}, "port '+2222' must be a number"),
    ({"cluster": {"chief": ["gpu1: 2222"]}}, "port ' 2222' must be a number"),
    ({"cluster": {"chief": ["gpu1:" + "9" * 5000]}}, "port '" + "9" * 60 + "…' must be a number from 1 to 65535"),
    ({"cluster": {"chief": ["gpu1:02222"]}}, "c.json: cluster.chief[0]: 'gpu1:02222': port '02222' has a leading zero; write 2222"),
    ({"cluster": A, "ssh": {"port": "22"}}, "c.json: ssh.port: expected a whole number, got text"),
    ({"cluster": A, "ssh": {"port": True}}, "c.json: ssh.port: expected a whole number, got true"),
    # one address written two ways
    ({"cluster": {"chief": ["localhost:5"], "worker": ["127.0.0.1:5"]}}, "c.json: cluster: 127.0.0.1:5 and localhost:5 are the same address"),
    ({"cluster": {"chief": ["[::1]:5"], "worker": ["localhost:6", "localhost:5"]}}, "[::1]:5 and localhost:5 are the same address"),
    ({"cluster": {"chief": ["GPU1:5"], "worker": ["gpu1:5"]}}, "GPU1:5 and gpu1:5 are the same address"),
    ({"cluster": {"chief": ["[fe80::1]:5"], "worker": ["[fe80:0::1]:5"]}}, "[fe80:0::1]:5 and [fe80::1]:5 are the same address"),
    # paths: non-empty, no NUL, newline or other control character
    ({"cluster": A, "hosts": {"gpu1": {"python": ""}}}, "c.json: hosts.gpu1.python: is empty; give a path (or leave the key out"),
    ({"cluster": A, "hosts": {"gpu1": {"workdir": "/w\n"}}}, r"c.json: hosts.gpu1.workdir: '/w\n' contains a control character"),
    ({"cluster": A, "ssh": {"identity_file": "k\x00"}}, r"c.json: ssh.identity_file: 'k\x00' contains a NUL character"),
    ({"cluster": A, "hosts": {"gpu1": {"ssh": {"known_hosts": ""}}}}, "c.json: hosts.gpu1.ssh.known_hosts: is empty"),
    # ssh settings
    ({"cluster": A, "ssh": {"user": "-oProxyCommand=x"}}, "c.json: ssh.user: '-oProxyCommand=x' is not a user name; use letters"),
    ({"cluster": A, "ssh": {"user": ""}}, "c.json: ssh.user: '' is not a user name"),
    ({"cluster": A, "ssh": {"connect_timeout": 1e9}}, "c.json: ssh.connect_timeout: should be less than or equal to 3600, got 1000000000.0"),
    # GPU settings
    ({"cluster": A, "hosts": {"gpu1": {"gpus": 2000}}}, "c.json: hosts.gpu1.gpus: 2000 is not a GPU count or a list of GPU indices (write e.g. 2 or [0, 1]); at most 1024"),
    ({"cluster": A, "hosts": {"gpu1": {"share_gpus": 1}}}, "c.json: hosts.gpu1.share_gpus: expected true or false, got a whole number"),
    ({"cluster": A, "devices": {"chief:0": {"gpus": [0], "gpu_memory_limit_mb": 10**12}}}, "devices.chief:0.gpu_memory_limit_mb: should be less than or equal to"),
])
def test_every_field_to_one_standard(data: object, expected: str) -> None:
    message = error_of(data)
    assert expected in message
    assert "\n" not in message and len(message) < 400


@pytest.mark.parametrize("text, expected", [
    (b'{"cluster": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "c.json: nests objects/lists more than 64 levels deep"),
    (b'{"cluster": {"chief": ["h\xe9:1"]}}', "c.json: is not UTF-8 text (byte 0xe9 at offset 25); save it as UTF-8"),
    (b'{"cluster": {"chief": ["a:1"]}, "cluster": {"chief": ["b:1"]}}', "c.json: the key 'cluster' appears twice in one object; keep one"),
    (b'{"cluster": {"chief": ["a:1"]}, "ssh": {"connect_timeout": NaN}}', "c.json: not valid JSON: NaN is not a number"),
    (b'{"cluster": {"chief": ["a:1"]}, "ssh": {"port": ' + b"9" * 5000 + b"}}", "c.json: not valid JSON for tfl: a number has thousands of digits"),
])
def test_file_level_errors_are_one_line(tmp_path: Path, text: bytes, expected: str) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(text)
    with pytest.raises(ClusterFileError) as info:
        load_cluster(path)
    assert str(info.value).startswith(f"{path}: {expected.removeprefix('c.json: ')}")


def test_file_with_bom_and_nesting_within_strings_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"cluster": {"chief": ["a:1"]}, "env": {"X": "[" * 500}}).encode())
    assert load_cluster(path).env == {"X": "[" * 500}


def test_localhost_in_any_case_is_this_machine() -> None:
    """Hostnames ignore case (docs/cluster-file.md): `LOCALHOST:23456` was taken for a remote host
    and the launch tried SSH to it ("LOCALHOST: connection refused on port 22")."""
    from launcher.describe.hosts import is_remote

    spec = parse_cluster({"cluster": {"chief": ["LOCALHOST:23456"], "worker": ["Localhost:23457"]}})
    assert all(a.is_local for a in (parse_address("LOCALHOST:1"), parse_address("Localhost:1")))
    assert not is_remote(spec, "LOCALHOST") and not is_remote(spec, "Localhost")
    assert "the same address" in error_of({"cluster": {"chief": ["LOCALHOST:5"], "worker": ["127.0.0.1:5"]}})


@pytest.mark.parametrize("data, expected", [
    # a misspelt required key is named as such, not reported as the key that is missing
    ({"clustr": {"chief": ["a:1"]}}, "c.json: clustr: unknown key; remove it or check its spelling (did you mean 'cluster'?"),
    ({"cluster": {"cheif": ["a:1"]}}, "c.json: cluster.cheif: unknown key; remove it or check its spelling (did you mean 'chief'?"),
    ({"cluster": {"chief": ["a:1"], "workers": ["b:1"]}}, "cluster.workers: unknown key; remove it or check its spelling (did you mean 'worker'?"),
    ({"cluster": {"chief": ["a:1"]}, "hosts": {"a": {"pyhton": "/p"}}}, "hosts.a.pyhton: unknown key; remove it or check its spelling (did you mean 'python'?"),
    ({"cluster": {"chief": ["a:1"]}, "hosts": {"a": {"ssh": {"usr": "u"}}}}, "hosts.a.ssh.usr: unknown key; remove it or check its spelling (did you mean 'user'?"),
    ({"cluster": {"chief": ["a:1"]}, "devices": {"worker:0": {"gpu": [0]}}}, "devices.worker:0.gpu: unknown key; remove it or check its spelling (did you mean 'gpus'?"),
    ({"cluster": {"chief": ["a:1"]}, "storage": {"path": "/s", "k8s-claim": "c"}}, "storage.k8s-claim: unknown key; remove it or check its spelling (did you mean 'k8s_claim'?"),
    ({"cluster": {"chief": ["a:1"]}, "elastic": {"min_task": 1}}, "elastic.min_task: unknown key; remove it or check its spelling (did you mean 'min_tasks'?"),
])
def test_misspelt_key_names_the_key_it_meant(data: object, expected: str) -> None:
    assert expected in error_of(data)


@pytest.mark.parametrize("data, expected", [
    ({"slurm": {"nodes": 2, "tasks_per_nod": 1}}, "c.json: slurm.tasks_per_nod: unknown key; remove it or check its spelling "
                                      "(did you mean 'tasks_per_node'?"),
    ({"ray": {"adress": "auto"}}, "c.json: ray.adress: unknown key; remove it or check its spelling (did you mean 'address'?"),
])
def test_misspelt_key_of_a_slurm_or_ray_description_names_the_key_it_meant(data: object, expected: str) -> None:
    from launcher.describe.kinds import parse_description

    with pytest.raises(ClusterFileError) as info:
        parse_description(data, "c.json")
    assert expected in str(info.value)


def test_unknown_key_like_no_allowed_key_suggests_none() -> None:
    message = error_of({"cluster": {"chief": ["a:1"]}, "wrokers": 1})
    assert message.endswith("wrokers: unknown key; remove it or check its spelling (see `tfl schema` for the allowed keys)")
