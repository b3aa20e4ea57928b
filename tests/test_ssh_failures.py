"""``explain``: why an SSH open failed, as one line with the fix (pure: the exceptions are made here,
as paramiko and the kernel raise them)."""

from __future__ import annotations

import errno
import os

import pytest
from paramiko.ssh_exception import NoValidConnectionsError

from launcher.describe.hosts import SSHTarget
from launcher.engines.ssh.failures import explain


def os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def no_valid(*codes: int) -> NoValidConnectionsError:
    """What paramiko raises when every address of the host failed with ECONNREFUSED or EHOSTUNREACH."""
    return NoValidConnectionsError({(f"10.1.0.{i}", 22): os_error(c) for i, c in enumerate(codes)})


GPU = SSHTarget(host="gpu1", user="train")
BASTION = SSHTarget(host="bastion.example.com", jump="none")


@pytest.mark.parametrize("exc", [no_valid(errno.EHOSTUNREACH), no_valid(errno.EHOSTUNREACH, errno.EHOSTUNREACH),
                                 os_error(errno.ENETUNREACH)])
def test_a_host_with_no_route_is_said_as_such_not_as_refused(exc: Exception) -> None:
    text = str(explain(GPU, exc, None, 1))
    assert text.startswith("gpu1: no route to gpu1 (") and "refused" not in text, text
    assert "the host is down, or on a network this machine does not reach" in text
    assert text.endswith("a host reached only through a bastion needs ssh.jump (or a ProxyJump in the ssh config)")


def test_a_bastion_with_no_route_points_at_the_jump_field() -> None:
    text = str(explain(BASTION, os_error(errno.ENETUNREACH), None, 1, bastion_of="ssh.jump"))
    assert text == ("bastion.example.com: no route to bastion.example.com (Network is unreachable): the host is down, "
                    "or on a network this machine does not reach; check the bastion's address in ssh.jump")


@pytest.mark.parametrize("exc", [no_valid(errno.ECONNREFUSED), no_valid(errno.EHOSTUNREACH, errno.ECONNREFUSED)])
def test_a_refusal_on_any_address_is_still_said_as_refused(exc: Exception) -> None:
    assert str(explain(GPU, exc, None, 1)) == ("gpu1: connection refused on port 22; is sshd running there, and is "
                                               "ssh.port right?")
