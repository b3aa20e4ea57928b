"""known_hosts, read once per process, and the policy for a host it does not know.

paramiko's own loader (``SSHClient.load_system_host_keys``) is quadratic in the file's lines
(paramiko/paramiko#2251: 7,000 entries, 23 s) and was called once per connection: a launch,
``tfl status``, ``stop`` or ``rm`` paid it once per host. Here a file is split into lines once
(linear; no key is decoded until a host asks for it), kept while its inode, size and mtime
stay the same, and each client gets only the keys of the one name it connects to, through
paramiko's public ``get_host_keys().add``. The file is never rewritten: the one write is
``--accept-new-host-keys`` appending a new host's line, which updates the cache too.

Like paramiko: plain and hashed (``|1|salt|hash``) names, ``[host]:port`` for another port,
the first key of each type per name; lines with a marker (``@cert-authority``, ``@revoked``)
are skipped.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.files import private_dir

Entry = tuple[int, str, str]  # line number, key type, base64 blob


@dataclass
class _Parsed:
    signature: tuple[int, int, int]  # inode, size, mtime (ns)
    plain: dict[str, list[Entry]] = field(default_factory=dict)
    hashed: list[tuple[bytes, bytes, Entry]] = field(default_factory=list)  # salt, digest
    found: dict[str, list[Entry]] = field(default_factory=dict)  # name -> its entries, once looked up
    lines: int = 0


_CACHE: dict[str, _Parsed] = {}
_LOCK = threading.Lock()
PARSES = [0]  # how many times a file was read: the tests' proof that it is once per command


class UnknownHostKey(Exception):
    """The host's key is not in known_hosts (and new keys are not accepted)."""


def signature(path: str) -> tuple[int, int, int] | None:
    """A file's inode, size and mtime: what changes when it is written or replaced (None: no file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _parse(path: str, stamp: tuple[int, int, int]) -> _Parsed:
    parsed = _Parsed(stamp)
    PARSES[0] += 1
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parsed.lines += 1
            _add_line(parsed, parsed.lines, line)
    return parsed


def _add_line(parsed: _Parsed, number: int, line: str) -> None:
    fields = line.split()
    if len(fields) < 3 or fields[0].startswith(("#", "@")):
        return
    names, keytype, blob = fields[:3]
    for name in names.split(","):
        if name.startswith("|1|"):
            try:
                salt, digest = (base64.b64decode(p, validate=True) for p in name[3:].split("|", 1))
            except (ValueError, binascii.Error):
                continue
            parsed.hashed.append((salt, digest, (number, keytype, blob)))
        elif name:
            parsed.plain.setdefault(name, []).append((number, keytype, blob))


def _current(path: str) -> _Parsed | None:
    """The file as parsed now (read again only when it changed); None when there is none."""
    with _LOCK:
        stamp = signature(path)
        if stamp is None:
            _CACHE.pop(path, None)
            return None
        parsed = _CACHE.get(path)
        if parsed is None or parsed.signature != stamp:
            parsed = _CACHE[path] = _parse(path, stamp)
        return parsed


def entries(path: str, name: str) -> list[Entry]:
    """The known_hosts entries for ``name`` (``host`` or ``[host]:port``), in file order."""
    parsed = _current(path)
    if parsed is None:
        return []
    with _LOCK:
        if name not in parsed.found:
            mine = list(parsed.plain.get(name, []))
            for salt, digest, entry in parsed.hashed:
                if hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), digest):
                    mine.append(entry)
            parsed.found[name] = sorted(mine)
        return parsed.found[name]


def give_keys(client: Any, path: str, name: str) -> None:
    """Hand ``client`` (a ``paramiko.SSHClient``) the known keys of ``name``: the first of each type."""
    import paramiko

    seen: set[str] = set()
    for _, keytype, blob in entries(path, name):
        if keytype in seen:
            continue
        try:
            key = paramiko.PKey.from_type_string(keytype, base64.b64decode(blob))
        except Exception:  # an unknown key type or a damaged line: skipped, as paramiko's loader does
            continue
        seen.add(keytype)
        client.get_host_keys().add(name, keytype, key)


def append(path: str, name: str, keytype: str, blob: str) -> None:
    """``--accept-new-host-keys``: the new host's line at the end of the file (never a rewrite);
    the cache learns it without reading the file again when nobody else wrote in between."""
    file = Path(path)
    private_dir(file.parent, exist_ok=True)  # and each missing parent: 0700, whatever the umask
    with _LOCK:
        before = signature(path)
        # a file made here is 0600, never as the umask says (0666 under umask 000): whoever can
        # write it can vouch for any host's key; an existing file keeps its mode
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(f"{name} {keytype} {blob}\n")
        parsed = _CACHE.get(path)
        after = signature(path)
        if parsed is not None and before == parsed.signature and after is not None:
            parsed.lines += 1
            _add_line(parsed, parsed.lines, f"{name} {keytype} {blob}")
            parsed.found.pop(name, None)
            parsed.signature = after
        else:
            _CACHE.pop(path, None)


def policy(known_hosts: str, accept_new: bool) -> Any:
    """What paramiko does with a host whose name known_hosts does not hold: refuse (the caller
    explains, with the ``ssh-keyscan`` that fixes it), or ssh's StrictHostKeyChecking=accept-new."""
    import paramiko

    class Reject(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise UnknownHostKey(f"{key.get_name()} {key.fingerprint}")

    class AcceptNew(paramiko.MissingHostKeyPolicy):  # type: ignore[misc]
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            append(known_hosts, hostname, key.get_name(), key.get_base64())

    return AcceptNew() if accept_new else Reject()
