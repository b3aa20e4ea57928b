"""`tfl doctor`'s ssh line says how the host was reached: a host behind a bastion (``ssh.jump``, or the
ssh config's ProxyJump) was shown as `reached root@gpu1:22`, as if dialled straight. Nothing connects:
the connection and the agent's channel are stand-ins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launcher.describe.hosts import SSHTarget
from launcher.engines.preflight import HostTasks
from launcher.engines.ssh import probe


class FakeConnection:
    closed = False

    def close(self) -> None:
        self.closed = True


def ssh_line(monkeypatch: pytest.MonkeyPatch, target: SSHTarget) -> str:
    conn = FakeConnection()
    monkeypatch.setattr(probe, "connect", lambda t: conn)

    def no_agent(*args: Any) -> Any:
        raise OSError("no agent here")

    monkeypatch.setattr(probe, "open_channel", no_agent)
    checks, session = probe._open(HostTasks("gpu1", "/py", None, target), quick=True)
    assert session is None and conn.closed and [c.name for c in checks] == ["ssh", "python"]
    return str(checks[0].detail)


def test_the_ssh_line_names_the_bastion_a_host_was_reached_through(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu1\n  ProxyJump ops@edge:2200\n")
    straight = ssh_line(monkeypatch, SSHTarget("gpu1", user="root", config=str(tmp_path / "none")))
    assert straight.startswith("reached root@gpu1:22 in ") and "via" not in straight, straight
    jumped = ssh_line(monkeypatch, SSHTarget("gpu1", user="root", jump="train@bastion", config=str(tmp_path / "none")))
    assert jumped.startswith("reached root@gpu1:22 via bastion train@bastion:22 (ssh.jump) in "), jumped
    proxied = ssh_line(monkeypatch, SSHTarget("gpu1", user="root", config=str(config)))
    assert proxied.startswith(f"reached root@gpu1:22 via bastion ops@edge:2200 (ProxyJump in {config}) in "), proxied
