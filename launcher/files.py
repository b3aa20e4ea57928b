"""Private files: what tfl writes under a run dir is its owner's alone, whatever the umask.

A run dir holds ``plan.json``, which has every task's environment (and so whatever secrets
the cluster file's ``env`` carries), and the tasks' logs. Directories are made 0700 and
files 0600 explicitly (``chmod`` after creation), because ``mkdir``/``open`` modes only
ever lose bits to the umask: a umask of 000 must not widen them and one of 0200 must not
leave tfl unable to write. Stdlib only: ``tfl status`` imports this.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

DIR_MODE = 0o700
FILE_MODE = 0o600
# The fix for a recorded run's key that is gone: it reaches its hosts with its record's settings, never the cluster file's.
RECORDED_KEY_FIX = "the run was launched with it and its record names it: put the key back there"


def private_dir(path: str | os.PathLike[str], *, exist_ok: bool = False) -> None:
    """Make ``path`` (and any missing parent) 0700. Raises FileExistsError when ``path``
    exists and not ``exist_ok``: a run dir is never shared."""
    path = Path(path)
    if not path.parent.is_dir():
        private_dir(path.parent, exist_ok=True)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not exist_ok:
            raise
        if not path.is_dir():  # a file where a dir must be: not "exists already", which callers take for a taken name
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path)) from None
        return
    os.chmod(path, DIR_MODE)


class ForeignDirError(OSError):
    """A directory tfl keeps a user's records in belongs to another user."""


def own_dir(path: str | os.PathLike[str]) -> None:
    """An existing directory that holds tfl's records (``$TFL_HOME/runs``, ``active``): refused when
    another user owns it (they could remove or swap the records in it, and so what ``tfl stop`` and
    ``tfl resume`` act on); made 0700 when it is the user's and open to others. A missing one is fine."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # missing: made 0700 when needed; a file on the path: named then
        return
    if st.st_uid != os.geteuid():
        raise ForeignDirError(errno.EPERM, f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})", str(path))
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, DIR_MODE)


def private_key_problem(path: str, fix: str) -> str | None:
    """What is wrong with ``path`` as an SSH private key, in one line with its fix, or None.
    ``fix``: what to do about a key that is not there (where its path came from). A key of the
    user's own that others may read or write is refused as OpenSSH refuses it ("UNPROTECTED
    PRIVATE KEY FILE": ``sshkey_perm_ok``, any of the 077 bits on a key the real uid owns)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return f"identity file {path} not found ({fix})"
    except OSError as exc:  # a parent dir it may not search
        return f"identity file {path} cannot be read: {exc.strerror} ({fix})"
    if stat.S_ISDIR(st.st_mode):
        return f"identity file {path} is a directory, not a private key ({fix})"
    if not stat.S_ISREG(st.st_mode):
        return f"identity file {path} is not a regular file, not a private key ({fix})"
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) & 0o077:
        return (f"identity file {path} is open to others (mode {stat.S_IMODE(st.st_mode):04o}), and OpenSSH refuses "
                f"such a private key (make it yours alone: chmod 600 {path})")
    return None


def open_private(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for appending (bytes), created 0600 if missing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        return os.fdopen(fd, "ab")
    except BaseException:
        os.close(fd)
        raise


def write_atomic(path: str | os.PathLike[str], text: str, *, durable: bool = False) -> None:
    """Replace ``path`` with ``text`` at once (temp file + ``os.replace``), 0600. ``durable``:
    the data and the rename are on disk before this returns (fsync of the file, then of its
    directory), so a crash or power loss leaves the old content or the new, never an empty file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp asks for 0600, which a umask could still narrow
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
