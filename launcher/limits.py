"""The launcher's own limits: open files (RLIMIT_NOFILE) and what running short of them means.

A launcher holds about one descriptor per SSH connection and one per task (its log), so a
default soft limit of 1,024 ends near a few hundred hosts. The CLI raises the soft limit to the
hard one once, at start (``raise_open_files``). Running short anyway is the launcher's fault,
never a host's: ``own_fault`` finds such an error (EMFILE, ENFILE, ENOBUFS, ENOMEM) behind any
exception, and ``limit_error`` says it in one line with the fix. Stdlib only: any stage uses it.
"""

from __future__ import annotations

import errno
import resource

from launcher.errors import ResourceLimitError

OWN_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# Task logs the console follower keeps open at once (``views.logs``); the others it opens only when they grew.
FOLLOW_OPEN = 16


def open_files() -> tuple[int, int]:
    """The soft and hard limits on open files (RLIM_INFINITY as it is)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def raise_open_files() -> int:
    """Raise the soft limit on open files to the hard one (the kernel's own cap where the hard
    limit is unlimited); the soft limit now. A refusal leaves the limit as it was."""
    soft, hard = open_files()
    wanted = _nr_open() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and wanted > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError):
            pass
    return open_files()[0]


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def own_fault(exc: BaseException | None) -> OSError | None:
    """The launcher's own resource error behind ``exc`` (its cause, context or a connector's
    per-address errors), if any: then ``exc`` says nothing about a host."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        cur = todo.pop()
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in OWN_ERRNOS:
            return cur
        errors = getattr(cur, "errors", None)  # paramiko's NoValidConnectionsError: one error per address
        if isinstance(errors, dict):
            todo += [e for e in errors.values() if isinstance(e, BaseException)]
        todo += [cur.__cause__, cur.__context__]
    return None


def limit_error(fault: OSError, doing: str) -> ResourceLimitError:
    """One line: which of the launcher's limits ran short while ``doing``, and the fix."""
    soft, hard = open_files()
    if fault.errno == errno.EMFILE:
        return ResourceLimitError(
            f"tfl ran out of file descriptors while {doing}: this process may open {_count(soft)} files "
            f"(RLIMIT_NOFILE soft {_count(soft)}, hard {_count(hard)}); raise the limit with `ulimit -n {_suggest(hard)}` "
            "(as root, or the hard limit in /etc/security/limits.conf) and launch again; no host is at fault")
    if fault.errno == errno.ENFILE:
        return ResourceLimitError(f"tfl could not open a file while {doing}: the system's file table is full (ENFILE); "
                                  "close other programs' files or raise fs.file-max (sysctl), then launch again; "
                                  "no host is at fault")
    return ResourceLimitError(f"tfl ran short of kernel memory while {doing} ({fault.strerror}); free memory on this "
                              "machine (or lower the number of hosts per launch) and launch again; no host is at fault")


def check_open_files(needed: int, what: str) -> None:
    """Refuse at once a launch that needs more descriptors than this process may open."""
    soft, hard = open_files()
    if soft != resource.RLIM_INFINITY and needed > soft:
        raise ResourceLimitError(
            f"{what} needs about {needed} file descriptors, but this process may open only {soft} (RLIMIT_NOFILE soft "
            f"{soft}, hard {_count(hard)}); raise the limit with `ulimit -n {max(needed * 2, 1024)}` (as root, or the hard "
            "limit in /etc/security/limits.conf) and launch again")


def _count(limit: int) -> str:
    return "unlimited" if limit == resource.RLIM_INFINITY else str(limit)


def _suggest(hard: int) -> int:
    return 65536 if hard == resource.RLIM_INFINITY or hard < 65536 else hard
