"""Process identity: a pid is ours only if it started when the recorded process did.

pids get reused, so every pid tfl records (launcher, local tasks) comes with its start:
clock ticks since boot (``/proc/<pid>/stat``, immune to clock steps) where there is a
/proc, and psutil's wall-clock create time (the fallback, and what older records hold).
A record also names the host and boot it was made in: a process recorded on another
machine (a ``TFL_HOME`` shared over NFS) or before a reboot is never taken for one here.

psutil is imported by the functions that use it, not here: `tfl status` asks only whether a
launcher is alive (``ProcessIdentity.alive``), which /proc answers, and psutil's import is a
tenth of that command's start (docs/benchmarks.md §18).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.contract import RUN_DIR, RUN_ID

if TYPE_CHECKING:
    import psutil

    from launcher.records.store import RunRecord, TaskRecord

CREATE_TIME_TOLERANCE = 0.01  # psutil's create time is in clock ticks (10 ms)


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot; None without /proc or once gone."""
    stat = _proc_stat(pid)
    return stat[1] if stat is not None else None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start ticks from /proc/<pid>/stat; None without /proc or once gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def host_name() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class ProcessIdentity:
    """A process as recorded: enough to find it again, and never another one in its place."""

    pid: int | None
    create_time: float | None
    start_ticks: int | None = None
    boot_id: str | None = None
    host: str | None = None

    @classmethod
    def of(cls, pid: int) -> ProcessIdentity:
        """A live process on this machine, as a record keeps it."""
        import psutil

        return cls(pid, psutil.Process(pid).create_time(), start_ticks(pid), boot_id(), host_name())

    @property
    def elsewhere(self) -> str | None:
        """The recorded host, when that is not this machine: only there can it be looked for."""
        return self.host if self.host is not None and self.host != host_name() else None

    @property
    def here(self) -> bool:
        """Recorded on this machine since its last boot: elsewhere, or before a reboot, it is not to be looked for."""
        return not self.elsewhere and (self.boot_id is None or boot_id() in (None, self.boot_id))

    def find(self) -> psutil.Process | None:
        """The live process, here, else None."""
        if not self.here:
            return None
        return find_process(self.pid, self.create_time, self.start_ticks)

    def alive(self) -> bool:
        """``find() is not None``, from /proc alone where the start ticks were recorded (no psutil)."""
        if not self.here:
            return False
        if self.pid is not None and self.start_ticks is not None:
            stat = _proc_stat(self.pid)
            if stat is not None:  # (state, start ticks)
                return stat[1] == self.start_ticks and stat[0] != "Z"
            if os.path.exists("/proc/self/stat"):
                return False  # a /proc without the pid: gone
        return self.find() is not None  # no /proc here: psutil's create time decides


def launcher_identity(record: RunRecord) -> ProcessIdentity:
    return ProcessIdentity(record.launcher_pid, record.launcher_create_time, record.launcher_start_ticks,
                           record.launcher_boot_id, record.launcher_host)


def task_identity(record: RunRecord, task: TaskRecord) -> ProcessIdentity:
    """A task that ran on the launcher's machine (a local one)."""
    return ProcessIdentity(task.pid, task.create_time, task.start_ticks, record.launcher_boot_id, record.launcher_host)


def find_process(pid: int | None, create_time: float | None, ticks: int | None = None) -> psutil.Process | None:
    """The live process with this pid that started at ``ticks`` (exactly), else at
    ``create_time`` (within 10 ms; a clock step since breaks that, hence ticks); else None."""
    import psutil

    if pid is None or (create_time is None and ticks is None):
        return None
    try:
        proc = psutil.Process(pid)
        now = start_ticks(pid) if ticks is not None else None
        if now is not None:
            same = now == ticks
        else:
            same = create_time is not None and abs(proc.create_time() - create_time) <= CREATE_TIME_TOLERANCE
        if not same or proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc
    except psutil.Error:
        return None


def marked_processes(run_id: str, known: dict[int, psutil.Process], run_dir: str | None = None) -> list[psutil.Process]:
    """``known`` plus every live process whose environment carries the run's marker
    (``TFL_RUN_ID``): children a task started, a task the record never got to name. With
    ``run_dir``, a process that names another run dir (``TFL_RUN_DIR``) is not this run's: a run
    of the same id in another store (a copied record, resumed there) is left alone."""
    import psutil

    found = dict(known)
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid == os.getpid():
            continue
        try:
            env = proc.environ()
            if env.get(RUN_ID) != run_id or (run_dir is not None and env.get(RUN_DIR, run_dir) != run_dir):
                continue
            if proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = proc
        except psutil.Error:
            continue
    return list(found.values())


def signal_group(proc: psutil.Process, signum: int) -> None:
    """``signum`` to the process's group if it leads one, else to it alone; never to our
    own group. The identity is checked right before (psutil: pid and start), and only a
    verified group leader's group is signalled: a group whose leader is gone may hold a
    number another process group has taken since. Members of such a group carry the run's
    marker and are each signalled by ``marked_processes``' callers."""
    import psutil

    try:
        if not proc.is_running():
            return
        pgid = os.getpgid(proc.pid)
        if pgid == proc.pid and pgid != os.getpgid(0):
            os.killpg(pgid, signum)
        else:
            proc.send_signal(signum)
    except (ProcessLookupError, PermissionError, psutil.Error):
        pass


def group_members(pgid: int, leader: int | None = None) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``, but ``leader``."""
    import psutil

    members = []
    for pid in psutil.pids():
        try:
            if pid != leader and os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                members.append(pid)
        except (OSError, psutil.Error):
            continue
    return members


def is_running(proc: psutil.Process) -> bool:
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def cpu_percent(proc: psutil.Process | None) -> float | None:
    import psutil

    try:
        return proc.cpu_percent(None) if proc else None
    except psutil.Error:
        return None


def rss_mb(proc: psutil.Process | None) -> float | None:
    import psutil

    try:
        return round(proc.memory_info().rss / 2**20, 1) if proc else None
    except psutil.Error:
        return None
