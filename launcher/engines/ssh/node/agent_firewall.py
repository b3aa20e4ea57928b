"""The agent's firewall work on a host (stdlib only, Python >= 3.8); sent along with ``agent.py``.

With ``"ssh": {"firewall": true}``, each host of the run holds an nftables table of the run's
own (``inet tfl_<run>``) for the run's life: an input chain that accepts connections to the
host's task ports from loopback and from the run's hosts, and drops every other connection
to those ports; and an output chain that lets only the login user's sockets (and root's) open a
connection to a task port of the run, this host's over loopback or a run host's by its address:
the host's other users share the addresses the input chain admits (nothing else is touched).
Both chains carry the holder's mark (``input_<mark>``, ``output_<mark>``). ``nft`` runs as the
login user when that is root, else through ``sudo -n``.

- ``hold``: install the table, answer, then keep it while the launcher is heard from (its
  pings on stdin); remove it when asked (``{"remove": 1}``), when stdin ends or sshd hangs up
  (the launcher is gone), or after ``heartbeat_timeout`` s of silence: the agent's fence,
  like a task's. Its input chain carries a name of its own (``input_<mark>``), so a holder
  that notices late never removes the table a newer one installed (``release``). Having lost the
  launcher it removes the table only once no task port is listened on here any more (or after
  the request's ``linger`` s): the tasks' own fence gives them their grace (SIGTERM, then SIGKILL
  up to 30 s later), and a task saving on that notice still serves on its port all that while;
- ``drop``: remove the table (``tfl stop``, ``tfl rm``); a table already gone is fine;
- ``can_fence`` (``tfl doctor``'s probe): nft run as ``hold`` runs it, on ``list tables``, which
  changes nothing: the launch's refusal (no nft, no root and no sudo, sudo asking a password), early.

``TFL_TEST_NFT`` (tests only) names the nft program to run instead of the one found here.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
from typing import Any, Callable

SBIN = ("/usr/sbin/nft", "/sbin/nft")  # an ordinary user's PATH often lacks sbin
LISTEN = "0A"  # a listening socket's state in /proc/net/tcp and tcp6
LINGER = 60.0  # at most this long a lost launcher's table waits for its ports to close (the request's ``linger``)


class Refused(Exception):
    """What keeps this host from fencing: ``why`` and the ``fix``."""

    def __init__(self, why: str, fix: str) -> None:
        super().__init__(why)
        self.why, self.fix = why, fix


def nft_argv() -> list[str]:
    """How to run nft here: itself as root, else through ``sudo -n``; Refused when neither can be."""
    nft = os.environ.get("TFL_TEST_NFT") or shutil.which("nft") or next((p for p in SBIN if os.access(p, os.X_OK)), None)
    if not nft or not os.access(nft, os.X_OK):
        raise Refused("nft not found", "install nftables there (apt-get install nftables)")
    if os.geteuid() == 0:
        return [nft]
    sudo = shutil.which("sudo")
    if not sudo:
        raise Refused("the login user is not root and sudo is missing",
                      "log in as root, or let the user run nft through sudo without a password")
    return [sudo, "-n", nft]


def nft(script: str) -> None:
    """Run an nft script; Refused with nft's (or sudo's) own last line when it fails."""
    argv = nft_argv()
    try:
        done = subprocess.run(argv + ["-f", "-"], input=script, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Refused("cannot run %s (%s)" % (argv[0], exc), "check that nft works there") from None
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        said = next((line for line in lines if "Error" in line), lines[-1] if lines else "exit status %d" % done.returncode)
        if len(argv) > 1 and "password" in said:
            raise Refused("sudo asks for a password (%s)" % said,
                          "log in as root, or let the user run nft through sudo without a password (NOPASSWD)")
        raise Refused("nft failed: %s" % said, "check that nftables works there (nft list tables)")


def can_fence() -> dict[str, Any]:
    """Whether this host could hold the run's table: ``{"as": how nft runs}``, else ``error`` and ``fix``."""
    try:
        argv = nft_argv()
        nft("list tables\n")
    except Refused as exc:
        return {"error": exc.why, "fix": exc.fix}
    return {"as": "root" if len(argv) == 1 else "sudo -n"}


def ruleset(table: str, chain: str, ports: list[int], ipv4: list[str], ipv6: list[str]) -> str:
    """The run's table, made anew (an older one of the same name goes first, atomically)."""
    dport = "tcp dport { %s }" % ", ".join(str(p) for p in sorted(set(ports)))
    rules = ['iif "lo" %s accept' % dport]
    if ipv4:
        rules.append("ip saddr { %s } %s accept" % (", ".join(ipv4), dport))
    if ipv6:
        rules.append("ip6 saddr { %s } %s accept" % (", ".join(ipv6), dport))
    rules.append("%s drop" % dport)
    body = "".join("    %s\n" % r for r in rules)
    return ("table inet %(t)s\ndelete table inet %(t)s\ntable inet %(t)s {\n  chain %(c)s {\n"
            "    type filter hook input priority 0; policy accept;\n%(body)s  }\n}\n") % {"t": table, "c": chain, "body": body}


# A connection's first packet: SYN alone. Matched statelessly, as the input chain is: ``ct state new``
# would load connection tracking on a host that may not run it, and fill its table with every flow.
OPENING = "tcp flags & (fin | syn | rst | ack) == syn"


def output_ruleset(table: str, chain: str, uid: int, ports: list[int], destinations: list[list[Any]]) -> str:
    """The table's output chain: this host's other users cannot open a connection to a task port of
    the run, its own over loopback (any local address: ``oif "lo"``) or a host's of the run (its
    address and port, ``destinations``); only sockets of the run's login user (``uid``) and of root
    may. Root is admitted: it could remove the table, or enter the tasks, anyway."""
    own = "tcp dport { %s }" % ", ".join(str(p) for p in sorted(set(ports)))
    rules = ["meta skuid %s accept" % ("0" if uid == 0 else "{ 0, %d }" % uid), 'oif "lo" %s %s drop' % (own, OPENING)]
    for family, pairs in (("ip", [d for d in destinations if ":" not in d[0]]), ("ip6", [d for d in destinations if ":" in d[0]])):
        if pairs:
            listed = ", ".join("%s . %d" % (a, p) for a, p in sorted({(str(a), int(p)) for a, p in pairs}))
            rules.append("%s daddr . tcp dport { %s } %s drop" % (family, listed, OPENING))
    body = "".join("    %s\n" % r for r in rules)
    return ("table inet %(t)s {\n  chain %(c)s {\n    type filter hook output priority 0; policy accept;\n%(body)s  }\n}\n"
            % {"t": table, "c": chain, "body": body})


def install(request: dict[str, Any], mark: str) -> None:
    """The table with both chains, in one transaction."""
    nft(ruleset(request["table"], "input_" + mark, request["ports"], request["ipv4"], request["ipv6"])
        + output_ruleset(request["table"], "output_" + mark, os.getuid(), request["ports"], request.get("destinations", [])))


def release(table: str, chain: str) -> dict[str, Any]:
    """Remove the table only while it holds this holder's chain: a newer holder's (the host came
    back and got the table again before this one noticed it had lost the launcher) stays.
    nft runs the two as one transaction: no chain of ours, nothing is removed."""
    try:
        nft("flush chain inet %s %s\ndelete table inet %s\n" % (table, chain, table))
    except Refused as exc:
        if "No such file" in exc.why:
            return {"removed": False}  # gone already, or a newer holder's
        return {"error": exc.why, "fix": exc.fix}
    return {"removed": True}


def drop(request: dict[str, Any]) -> dict[str, Any]:
    """Remove the run's table; ``{"removed": bool}`` or ``{"error", "fix"}``."""
    table = request["table"]
    try:
        # ``add`` first: deleting a table that is not there would fail.
        nft("table inet %s\ndelete table inet %s\n" % (table, table))
    except Refused as exc:
        return {"error": exc.why, "fix": exc.fix}
    return {"removed": True}


def hold(request: dict[str, Any], answer: Callable[[dict[str, Any]], None]) -> int:
    """Install, answer, keep the table while the launcher pings, then remove it (see the docstring)."""
    mark = os.urandom(4).hex()
    chain = "input_" + mark  # this holder's mark on the table (``release``)
    try:
        install(request, mark)
    except Refused as exc:
        answer({"error": exc.why, "fix": exc.fix})
        return 0
    gone = []  # sshd hung up on us, or is shutting down: as good as losing the launcher
    for signum in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, lambda *_: gone.append(1))
    answer({"installed": True})
    timeout, heard, buffer = float(request.get("heartbeat_timeout", 30.0)), time.monotonic(), b""
    asked = False
    while not gone and time.monotonic() - heard < timeout:
        try:
            ready = select.select([0], [], [], 0.5)[0]
        except InterruptedError:
            continue
        if not ready:
            continue
        data = os.read(0, 4096)
        if not data:
            break  # stdin ended: the launcher is gone
        heard, buffer = time.monotonic(), buffer + data
        lines = buffer.split(b"\n")
        buffer = lines.pop()
        if any(_asks_removal(line) for line in lines):
            asked = True
            break
    wait_unserved(request["ports"], float(request.get("linger", LINGER)))
    done = release(request["table"], chain)
    if asked:
        answer(done)
    return 0


def _asks_removal(line: bytes) -> bool:
    try:
        return bool(json.loads(line).get("remove"))
    except ValueError:
        return False



def listened(ports: list[int]) -> set[int]:
    """Those of ``ports`` a socket listens on in this host's network namespace (none where there is no /proc)."""
    wanted, found = set(ports), set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()  # sl local_address rem_address st ...; an address is HEX:PORT in hex
            if len(fields) > 3 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) in wanted:
                found.add(int(fields[1].rsplit(":", 1)[1], 16))
    return found


def wait_unserved(ports: list[int], linger: float) -> None:
    """Until nothing listens on the task ports here, ``linger`` s at most: a task that outlives its
    launcher (its grace, a kill's wait) keeps the table, and a run that ended finds none at once."""
    deadline = time.monotonic() + linger
    while listened(ports) and time.monotonic() < deadline:
        time.sleep(0.2)
