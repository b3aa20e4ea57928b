"""Which bastion (jump host) a host is reached through: the cluster file's ``ssh.jump``, else the
OpenSSH client config's ``ProxyJump`` for it. Reads files, opens nothing.

The client config (``ssh.config``, default ``~/.ssh/config`` then ``/etc/ssh/ssh_config``, as
fabric reads them) is parsed once per process and again only when a file changed. A bastion
is one hop: a chain (``a,b``) is refused in one line. It is logged into as the cluster file
says for its hosts (``identity_file``, ``known_hosts``, ``connect_timeout``, accepting new keys
or not); its user is the jump's own (``user@bastion``), else, for ``ssh.jump``, ``ssh.user``,
and for a ProxyJump the ssh config's (or the local user), as ssh would.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from launcher.describe.hosts import SSHTarget
from launcher.engines.ssh.hostkeys import signature

DEFAULT_CONFIGS = ("~/.ssh/config", "/etc/ssh/ssh_config")

_CONFIGS: dict[tuple[str, ...], tuple[tuple[Any, ...], Any]] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class Jump:
    """A bastion, and where the setting came from (for the messages)."""

    bastion: SSHTarget  # its jump is "none": one hop
    origin: str  # "ssh.jump", "ProxyJump in ~/.ssh/config"

    def describe(self) -> str:
        return f"bastion {self.bastion.host} ({self.origin})"


def ssh_config(path: str | None) -> Any:
    """The parsed client config (a ``paramiko.SSHConfig``): ``path`` alone, like ``ssh -F``, or the defaults."""
    import paramiko

    paths = tuple(os.path.expanduser(p) for p in ((path,) if path else DEFAULT_CONFIGS))
    stamp = tuple(signature(p) for p in paths)
    with _LOCK:
        cached = _CONFIGS.get(paths)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        config = paramiko.SSHConfig()
        for p in paths:
            if os.path.isfile(p):
                with open(p, encoding="utf-8", errors="replace") as f:
                    config.parse(f)
        _CONFIGS[paths] = (stamp, config)
        return config


def hostname(target: SSHTarget) -> str:
    """The name the host is dialled by: the ssh config's HostName for it, else its own."""
    return str(ssh_config(target.config).lookup(target.host).get("hostname", target.host))


def jump_for(target: SSHTarget) -> Jump | None:
    """The bastion ``target`` is reached through, or None (straight). ValueError, with the fix, for
    a jump that names no single bastion."""
    from launcher.describe.fields import split_jump

    if target.jump == "none":
        return None
    config = ssh_config(target.config)
    if target.jump:
        text, origin, default_user = target.jump, "ssh.jump", target.user
    else:
        text = str(config.lookup(target.host).get("proxyjump", "none"))
        origin, default_user = f"ProxyJump in {target.config or DEFAULT_CONFIGS[0]}", None
        if text == "none":
            return None
    try:
        user, host, port = split_jump(text)
    except ValueError as exc:
        raise ValueError(f"{origin}: {exc}") from None
    if host == target.host:  # a `Host *` ProxyJump seen from the bastion itself
        return None
    if port is None:
        port = int(config.lookup(host).get("port", 22))
    bastion = SSHTarget(host=host, port=port, user=user or default_user, identity_file=target.identity_file,
                        connect_timeout=target.connect_timeout, known_hosts=target.known_hosts,
                        accept_new_host_keys=target.accept_new_host_keys, jump="none", config=target.config)
    return Jump(bastion, origin)
