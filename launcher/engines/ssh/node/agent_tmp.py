"""A run's private temp dir on a host (stdlib only, Python >= 3.8); sent along with ``agent.py``.

Each task of a run gets ``TMPDIR`` (and ``TEMP`` and ``TMP``, which Python's ``tempfile`` reads
too) set to one dir of the run's own on its host, as Slurm's job_container/tmpfs gives each job:
made by ``mkdtemp`` (0700, a random name: no fixed path another user could make first) inside
the host's own temp dir (the TMPDIR the plan gives the tasks, else the user's, else /tmp), shared
by the run's tasks there, and removed with the run: what a task killed with SIGKILL left there
(TensorFlow autograph's generated modules and their bytecode, the job's own temp files) goes too.
The local engine (launcher side) and the SSH agent (``agent_tasks``, ``agent.py``'s ``remove``)
both make and remove it with these functions.
"""

from __future__ import annotations  # annotations stay strings: the agent runs on Python >= 3.8

import os
import stat
import threading
from typing import Any

PREFIX = "tfl-tmp-"  # + run id + "-" + mkdtemp's 8 random characters (none of them "-")
VARS = ("TMPDIR", "TEMP", "TMP")  # what tempfile reads, in its order: each set to the run's dir


def make(run_id: str, parent: str | None) -> str:
    """A new temp dir for the run's tasks in ``parent``, else in this host's temp dir. Raises OSError."""
    import tempfile
    return os.path.abspath(tempfile.mkdtemp(prefix=PREFIX + run_id + "-", dir=parent or None))  # a relative TMPDIR too


def parent_of(env: dict[str, str], run_id: str) -> str | None:
    """Where the run's temp dir goes for a task with ``env``: its TMPDIR, or that dir's parent where
    it is one of this run's own (a resumed run's recorded plan); None: the host's temp dir."""
    given = env.get(VARS[0]) or None
    if given and os.path.basename(given).startswith(PREFIX + run_id + "-"):
        return os.path.dirname(given)
    return given


def with_tmp(env: dict[str, str], path: str) -> dict[str, str]:
    """``env`` with the run's temp dir as every temp dir variable."""
    return dict(env, **dict.fromkeys(VARS, path))


class TmpError(Exception):
    """The run's temp dir could not be made: why, in one line with the fix."""


class RunTmp:
    """The agent session's temp dirs (one per run and parent: a session serves one run)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[tuple[str, str | None], str] = {}

    def task(self, request: dict[str, Any]) -> dict[str, Any]:
        """The task's request with the run's temp dir as its TMPDIR, made for its first task. Raises TmpError."""
        env = request.get("env") or {}
        run_id = env.get("TFL_RUN_ID")  # launcher.contract.RUN_ID (the agent is sent alone: no import)
        if not run_id:
            return request
        with self._lock:
            key = (run_id, parent_of(env, run_id))
            try:
                path = self._made[key] = self._made.get(key) or make(*key)
            except OSError as exc:
                raise TmpError("cannot make the run's private temp dir in %s: %s (fix TMPDIR there, or set it in "
                               "the cluster file's env)" % (key[1] or "the host's temp dir", exc.strerror or exc)) from None
        return dict(request, env=with_tmp(env, path))

    def remove(self) -> None:
        """The dirs this session made, and only those: another session of the run on this host (the
        next attempt's, after a resize) may have made its own meanwhile, and its tasks still use it."""
        with self._lock:
            made, self._made = self._made, {}
        for path in made.values():
            _remove_dir(path)


def remove(run_id: str, parent: str | None) -> dict[str, int]:
    """Remove each of the run's temp dirs in ``parent`` (else this host's temp dir): path -> bytes
    freed. Only this user's own dirs named as ``make`` names them, never through a link; one gone
    already is nothing (the run's end, ``tfl stop`` and ``tfl rm`` may each try)."""
    import tempfile
    where, prefix = parent or tempfile.gettempdir(), PREFIX + run_id + "-"
    removed: dict[str, int] = {}
    try:
        names = [n for n in os.listdir(where) if n.startswith(prefix) and len(n) == len(prefix) + 8
                 and "-" not in n[len(prefix):]]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(where, name)
        size = _remove_dir(path)
        if size is not None:
            removed[path] = size
    return removed


def _remove_dir(path: str) -> int | None:
    """Remove ``path`` if it is a dir of this user's (never through a link): the bytes freed, or None."""
    import shutil
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        size = sum(os.lstat(os.path.join(top, n)).st_blocks * 512 for top, ds, fs in os.walk(path) for n in ds + fs)
        shutil.rmtree(path)
    except OSError:
        return None  # gone meanwhile, or something in it not ours to remove: the next clean-up tries again
    return size


def remove_request(request: dict[str, Any]) -> dict[str, Any]:
    """``tfl rm``'s part (the agent's ``remove``): the run's temp dirs in the host's temp dir and in
    the request's ``tmp_parents`` (TMPDIRs the plan gave the tasks), as ``remove`` answers a path."""
    found: dict[str, Any] = {}
    for parent in [None, *request.get("tmp_parents", [])]:
        found.update({path: {"removed": size} for path, size in remove(request["run_id"], parent).items()})
    return found
