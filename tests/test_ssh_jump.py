"""Bastions as data: ``ssh.jump`` validated in one line, laid over per host, and the bastion a host
is reached through, from the cluster file or an ssh config's ProxyJump (pure: nothing connects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launcher.describe.fields import split_jump
from launcher.describe.hosts import SSHTarget, ssh_target
from launcher.describe.spec import parse_cluster
from launcher.engines.ssh.jump import jump_for
from launcher.errors import ClusterFileError


@pytest.mark.parametrize("text, expected", [
    ("bastion", (None, "bastion", None)),
    ("train@bastion.example.com:2222", ("train", "bastion.example.com", 2222)),
    ("ssh://ops@10.0.0.1", ("ops", "10.0.0.1", None)),
    ("[::1]:22", (None, "::1", 22)),
    ("u@[2001:db8::1]", ("u", "2001:db8::1", None)),
])
def test_a_jump_is_user_host_port(text: str, expected: tuple[Any, ...]) -> None:
    assert split_jump(text) == expected


def cluster(**ssh: Any) -> dict[str, Any]:
    return {"cluster": {"chief": ["gpu1:2222"], "worker": ["gpu2:2222"]}, "ssh": {"user": "train", **ssh},
            "hosts": {"gpu2": {"ssh": {"jump": "none"}}}}


@pytest.mark.parametrize("jump, said", [
    ("a.example.com,b.example.com", "names a chain of jump hosts; tfl goes through one bastion"),
    ("bastion:0", "port '0' must be a number from 1 to 65535"),
    ("bad user@bastion", "'bad user' is not a user name"),
    ("bastion:22:33", "is not a host name or IP address"),
    ("", "is not a host name or IP address"),
])
def test_a_bad_jump_is_one_line_naming_the_field(jump: str, said: str) -> None:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster(cluster(jump=jump), "c.json")
    text = str(info.value)
    assert "\n" not in text and text.startswith("c.json: ssh.jump: ") and said in text, text


def test_the_jump_is_laid_over_per_host_and_none_goes_straight(tmp_path: Path) -> None:
    spec = parse_cluster(cluster(jump="ops@bastion:2200", identity_file="~/.ssh/k", known_hosts=str(tmp_path / "kh")))
    gpu1, gpu2 = ssh_target(spec, "gpu1"), ssh_target(spec, "gpu2")
    assert gpu1.jump == "ops@bastion:2200" and gpu2.jump == "none"
    assert "via bastion ops@bastion:2200" in gpu1.describe() and "bastion" not in gpu2.describe()
    assert SSHTarget.from_dict(gpu1.to_dict()) == gpu1  # recorded with the run: status/stop/rm go the same way
    jump = jump_for(gpu1)
    assert jump is not None and jump.origin == "ssh.jump"
    assert (jump.bastion.host, jump.bastion.port, jump.bastion.user, jump.bastion.jump) == ("bastion", 2200, "ops", "none")
    assert (jump.bastion.identity_file, jump.bastion.known_hosts) == ("~/.ssh/k", str(tmp_path / "kh"))
    assert jump_for(gpu2) is None


def test_proxyjump_of_the_ssh_config_names_the_bastion_and_its_port(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host gpu*\n    ProxyJump jumper@bastion\nHost bastion\n    Port 2201\n")
    behind = jump_for(SSHTarget(host="gpu7", user="train", config=str(config)))
    assert behind is not None and behind.origin == f"ProxyJump in {config}"
    assert (behind.bastion.host, behind.bastion.port, behind.bastion.user) == ("bastion", 2201, "jumper")
    no_user = config.read_text().replace("jumper@", "")
    config.write_text(no_user)
    behind = jump_for(SSHTarget(host="gpu7", user="train", config=str(config)))
    assert behind is not None and behind.bastion.user is None  # the ssh config's User for it, or the local user: as ssh
    assert jump_for(SSHTarget(host="other", config=str(config))) is None
    assert jump_for(SSHTarget(host="gpu7", config=str(config), jump="none")) is None
    assert jump_for(SSHTarget(host="bastion", config=str(tmp_path / "missing"))) is None
