"""A local run's private network: its tasks in a network namespace of their own.

TensorFlow's server binds ``0.0.0.0:PORT`` and runs whatever graph it is sent (its
SECURITY.md); it has no option for the address. So when every task runs on this machine the
local backend starts them inside one network namespace (``netns_holder``): they reach each
other over its loopback, and nothing outside it, on this machine or beyond, reaches their
ports. Outbound traffic (a dataset download, a ``gs://`` model dir) goes through
slirp4netns, a user-mode network that opens nothing inbound (rootless podman's default):
chosen over passt's ``pasta`` because pasta forwards the namespace's bound ports *into* it
from the host by default (``-t auto``), the very exposure this module removes, while
slirp4netns forwards nothing unless asked through its API socket (none is opened here).

Lifetime: the holder and slirp4netns end when ``close`` is called or the launcher dies (the
holder reads its stdin to EOF; slirp4netns watches ``--exit-fd``). Tasks that outlive a
killed launcher keep the namespace alive until they end (``tfl stop`` ends them by marker).
"""

from __future__ import annotations

import dataclasses
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from launcher.errors import LaunchError, NoPrivateNetwork

if TYPE_CHECKING:
    from launcher.plan.launch_plan import LaunchPlan

SLIRP_MTU = 65520  # slirp4netns' recommended MTU: far quicker than 1500 for downloads
READY_TIMEOUT = 20.0  # a hang guard: both answer in milliseconds


class NetnsUnavailable(LaunchError):
    """This machine cannot give a run a network namespace (kernel, policy, or a missing tool);
    ``fix`` says what would let it."""

    def __init__(self, reason: str, fix: str = "allow user namespaces (sysctl user.max_user_namespaces)") -> None:
        super().__init__(reason)
        self.fix = fix


@dataclass
class PrivateNetwork:
    """A live namespace: ``enter(argv)`` is the command that runs argv inside it."""

    holder: subprocess.Popen[bytes]
    user_ns: bool  # True: a user namespace too (an ordinary user, or root without CAP_SYS_ADMIN)
    nsenter: str
    slirp: subprocess.Popen[bytes] | None = None  # None: no outbound traffic (see ``offline``)
    offline: str | None = None  # why the namespace has no route out, when it has none
    _exit_w: int | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.holder.pid

    def enter(self, argv: tuple[str, ...] | list[str]) -> list[str]:
        """nsenter sets the namespaces and then execs argv: the task keeps nsenter's pid, and so
        its process group, session and identity (no process in between)."""
        user = ["--user", "--preserve-credentials"] if self.user_ns else []
        return [self.nsenter, f"--target={self.pid}", *user, "--net", "--", *argv]

    def pids(self) -> list[int]:
        return [p.pid for p in (self.holder, self.slirp) if p is not None]

    def close_outbound(self) -> None:
        """slirp4netns ends (its ``--exit-fd`` closed); idempotent."""
        if self._exit_w is not None:
            os.close(self._exit_w)
            self._exit_w = None
        if self.slirp is not None:
            _end(self.slirp)

    def close(self) -> None:
        """Idempotent: slirp4netns and the holder end; tasks still in the namespace keep it."""
        self.close_outbound()
        _end(self.holder)


def resolve_network(plan: LaunchPlan, say: Callable[[str], None]) -> tuple[LaunchPlan, PrivateNetwork | None]:
    """The plan with the mode it got (``private`` or ``host``) and its namespace, if any. ``auto``
    falls back to ``host`` in one line when no namespace can be made; ``private`` refuses."""
    if plan.network not in ("auto", "private"):
        return plan, None
    try:
        network = make_private_network()
    except NetnsUnavailable as exc:
        if plan.network == "private":
            raise NoPrivateNetwork(str(exc), exc.fix) from None
        say(f"tfl: warning: no private network for this run ({exc}; {exc.fix}): its task ports are open to this machine's "
            f"networks, as with --network host (docs/security.md)")
        return dataclasses.replace(plan, network="host"), None
    if network.offline:
        say(f"tfl: note: the run's network is private and has no outbound access ({network.offline}); "
            f"downloads will fail (--network host if the job needs them)")
    return dataclasses.replace(plan, network="private"), network


def make_private_network(outbound: bool = True) -> PrivateNetwork:
    """A new namespace with loopback up and, when slirp4netns is installed and ``outbound``, a
    user-mode route out. Raises ``NetnsUnavailable`` with the reason in one line."""
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        raise NetnsUnavailable("nsenter not found", "install nsenter (Debian: apt-get install util-linux)")
    holder = subprocess.Popen([sys.executable, "-S", str(Path(__file__).parent / "node" / "netns_holder.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    answer = _read_line(holder.stdout.fileno(), READY_TIMEOUT).strip() if holder.stdout else ""
    if not answer.startswith("ok"):
        _end(holder)
        raise NetnsUnavailable(answer.removeprefix("error ") or f"the namespace holder exited with code {holder.poll()}")
    network = PrivateNetwork(holder=holder, user_ns=answer == "ok user", nsenter=nsenter)
    if not outbound:
        network.offline = "no outbound traffic asked for"
    elif shutil.which("slirp4netns") is None:
        network.offline = "slirp4netns is not installed (Debian: apt-get install slirp4netns)"
    else:
        try:
            network.offline = _start_slirp(network)
        except BaseException:
            network.close()
            raise
    return network


def _start_slirp(network: PrivateNetwork) -> str | None:
    """slirp4netns attached to the namespace; None once it is ready, else why it is not. Its
    output goes to an unnamed file (a few lines at its start), read only when it failed."""
    ready_r, ready_w = os.pipe()
    exit_r, network._exit_w = os.pipe()
    with tempfile.TemporaryFile() as log:
        try:
            network.slirp = subprocess.Popen(
                ["slirp4netns", "--configure", f"--mtu={SLIRP_MTU}", "--disable-host-loopback",
                 f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", str(network.pid), "tap0"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(ready_w, exit_r))
        finally:
            os.close(ready_w)  # from now on EOF on ready_r means slirp4netns is gone
            os.close(exit_r)
        try:
            ready = select.select([ready_r], [], [], READY_TIMEOUT)[0] and os.read(ready_r, 16)  # "1" once configured
        finally:
            os.close(ready_r)
        if ready:
            return None
        network.close_outbound()
        log.seek(0)
        first = log.read().decode(errors="replace").strip().splitlines()
    return f"slirp4netns failed: {first[0] if first else 'it did not configure the namespace'}"


def _read_line(fd: int, timeout: float) -> str:
    """What ``fd`` says up to its first newline or EOF, within ``timeout`` (else what came)."""
    deadline, data = time.monotonic() + timeout, b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").partition("\n")[0] + ("\n" if b"\n" in data else "")


def _end(proc: subprocess.Popen[bytes]) -> None:
    """A helper process ends: its stdin closed (the holder's cue), then a bounded wait, then SIGKILL."""
    if proc.stdin is not None and not proc.stdin.closed:
        proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
