"""The user's private key (``ssh.identity_file``), read once per process.

Given ``key_filename``, paramiko reads and parses the key file again for every connection,
trying it as RSA and as ECDSA before the Ed25519 key it is (each try a parse that fails), and
looks for its certificate: at hundreds of hosts, a share of every handshake's CPU. Here the
file is loaded once (``PKey.from_path``: the type read from the file itself, a certificate
beside it loaded too), kept while the key's and the certificate's inode, size and mtime stay
the same, and handed to each connection as its ``pkey``. A key this cannot load (one that needs
a passphrase, a damaged file) gives None: paramiko then reads it itself, with its own errors,
as before.
"""

from __future__ import annotations

import threading
from typing import Any

from launcher.engines.ssh.hostkeys import signature

_CACHE: dict[str, tuple[tuple[Any, ...], Any]] = {}
_LOCK = threading.Lock()
LOADS = [0]  # how many times a key file was read: the tests' proof that it is once per process


def private_key(path: str) -> Any | None:
    """The key at ``path`` as a ``paramiko.PKey`` (read again only when it or its certificate
    changed), or None when it cannot be loaded without help (a passphrase)."""
    import paramiko

    stamp = (signature(path), signature(f"{path}-cert.pub"))
    with _LOCK:
        cached = _CACHE.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        LOADS[0] += 1
        try:
            key = paramiko.PKey.from_path(path)
        except Exception:  # encrypted, damaged or of an unknown type: paramiko's own loader says why
            key = None
        _CACHE[path] = (stamp, key)
        return key
