"""``tfl doctor`` (and an elastic run asking whether a lost host is back) over SSH: each host's
facts, and the proof that the cluster's storage is shared.

Per host one connection and one agent session, all hosts at once. The probe carries the
job kit: the host's python imports it from a private temp dir, first on its path, as a task
will. Then, for ``tfl doctor``, three rounds over every host at once: each host writes a
token into the storage; the chief's host reads every other host's, each other host reads
the chief's; each removes its own. ``engines.preflight.judge_storage`` names every host that did not
see a token it should have.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.engines.parallel import parallel
from launcher.engines.preflight import Check, HostTasks, judge, judge_storage, probe_request
from launcher.engines.ssh.connect import connect, open_channel
from launcher.engines.ssh.failures import SSHError, cause_of
from launcher.engines.ssh.jump import jump_for
from launcher.engines.ssh.wire import agent_command, agent_input, converse, kit_data

if TYPE_CHECKING:
    from fabric import Connection
    from paramiko import Channel

TOKEN_WAIT = 2.0  # s a host looks again for a token it does not see at once (NFS attribute caches)


@dataclass
class Session:
    """One host's connection and its agent, waiting for requests."""

    host: HostTasks
    conn: Connection
    chan: Channel

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        return converse(self.chan, request, self.host.host, self.host.python)

    def close(self) -> None:
        self.chan.close()
        self.conn.close()


def probe_hosts(hosts: Sequence[HostTasks], *, quick: bool) -> list[Check]:
    """Every check of every host, in host order; with ``quick`` no storage proof."""
    opened = parallel(lambda h: _open(h, quick), hosts)
    checks: list[Check] = []
    sessions: list[Session] = []
    for h, result in zip(hosts, opened, strict=True):
        if isinstance(result, Exception):
            checks.append(Check(h.host, "ssh", "fail", str(result)))
            continue
        checks += result[0]
        if result[1] is not None:
            sessions.append(result[1])
    try:
        return checks + ([] if quick else prove_storage(hosts, sessions))
    finally:
        for session in sessions:
            session.close()


def _open(h: HostTasks, quick: bool) -> tuple[list[Check], Session | None]:
    if h.target is None:
        raise SSHError(h.host, "no ssh settings for this host")
    started = time.monotonic()
    try:
        conn = connect(h.target)
    except SSHError as exc:
        return [Check(h.host, "ssh", "fail", exc.cause)], None
    jump = jump_for(h.target)  # the connect read it already: it raises nothing now
    via = f" via bastion {jump.bastion} ({jump.origin})" if jump is not None else ""
    checks = [Check(h.host, "ssh", "ok", f"reached {h.target}{via} in {time.monotonic() - started:.2f} s")]
    try:
        chan = open_channel(conn, agent_command(h.python), 60.0)
        try:
            chan.sendall(agent_input(None))
        except OSError:
            pass  # the agent is gone at once (no such python): its request's answer says why
        session = Session(h, conn, chan)
        facts = session.ask({**probe_request(h, quick=quick), "kit": kit_data()})
    except Exception as exc:  # SSHError, or paramiko refusing the session: the host's python check fails
        conn.close()
        return checks + [Check(h.host, "python", "fail", cause_of(exc))], None
    return checks + judge(h, facts, quick=quick), session


def prove_storage(hosts: Sequence[HostTasks], sessions: list[Session]) -> list[Check]:
    storage = next((h.storage for h in hosts if h.storage), None)
    chief = next((s for s in sessions if s.host.chief), None)
    if storage is None or "://" in storage or chief is None or len(sessions) < 2:
        return judge_storage(hosts, {})
    nonce = secrets.token_hex(6)
    names = {s.host.host: f".tfl-doctor-{nonce}-{i}" for i, s in enumerate(sessions)}
    tokens = {host: f"{nonce} written on {host}\n" for host in names}

    def write(s: Session) -> dict[str, Any]:
        host = s.host.host
        return s.ask({"mode": "storage", "dir": storage, "write": {names[host]: tokens[host]}})

    wrote = _answers(sessions, parallel(write, sessions))
    written = [s.host.host for s in sessions if "error" not in wrote[s.host.host]]

    def read(s: Session) -> dict[str, Any]:
        host = s.host.host
        if host not in written:
            return wrote[host]
        expected = [h for h in written if h != host] if s is chief else [h for h in written if h == chief.host.host]
        answer = s.ask({"mode": "storage", "dir": storage, "read": {names[h]: tokens[h] for h in expected},
                        "wait": TOKEN_WAIT})
        return {"seen": {h: answer["seen"][names[h]] for h in expected}} if "seen" in answer else answer

    seen = _answers(sessions, parallel(read, sessions))
    parallel(lambda s: s.ask({"mode": "storage", "dir": storage, "remove": [names[s.host.host]]}),
             [s for s in sessions if s.host.host in written])
    return judge_storage(hosts, seen)


def _answers(sessions: list[Session], results: list[dict[str, Any] | Exception]) -> dict[str, dict[str, Any]]:
    return {s.host.host: {"error": str(r)} if isinstance(r, Exception) else r for s, r in zip(sessions, results, strict=True)}
