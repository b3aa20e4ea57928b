"""The agent's file work on a host (stdlib only, Python >= 3.8); sent along with ``agent.py``.

- ``tfl_cache``: the host's per-user tfl dir, ``$XDG_CACHE_HOME/tfl`` or ``~/.cache/tfl``,
  which the launcher's plan names ``{tfl-cache}`` until the host has said where it is;
- ``unpack``: make the run's private dirs, unpack the shipped code and job kit, then import
  the kit the way a task will;
- ``kit_probe``: the same import check on a kit sent in a probe (``tfl doctor``);
- ``storage``: write, read and remove the tokens ``tfl doctor`` proves shared storage with;
- ``cleanup``: remove what a run shipped, once it has ended;
- ``Progress``: mirror a running task's progress file to the launcher.

A private dir is created 0700 and refused when it is a symlink or belongs to another user:
whoever controls it could swap the code before it runs. Facts only: the launcher judges them.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from typing import Any, Callable

# shutil, tarfile and tempfile are imported where used: every agent (a run's, a request's) loads this
# module, and only a run's unpacks anything.

CACHE_PLACEHOLDER = "{tfl-cache}"  # launcher.describe.hosts.HOST_CACHE
KIT_PACKAGES = ("tensorflow", "tf_keras", "keras", "psutil")


def tfl_cache() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tfl")


def expand(path: str) -> str:
    """A plan's path with ``{tfl-cache}`` resolved on this host."""
    return tfl_cache() + path[len(CACHE_PLACEHOLDER):] if path.startswith(CACHE_PLACEHOLDER) else path


def packages() -> dict[str, str | None]:
    """The installed versions of ``KIT_PACKAGES``, from the names of their ``*.dist-info`` (or
    ``.egg-info``) dirs on ``sys.path``: one directory listing each, where importing
    ``importlib.metadata`` and asking it would cost a launch ~0.1 s of CPU per host."""
    found: dict[str, str | None] = dict.fromkeys(KIT_PACKAGES)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in names:
            stem, dot, kind = name.rpartition(".")
            if dot and kind in ("dist-info", "egg-info"):
                package, _, version = stem.partition("-")
                key = package.lower().replace("-", "_").replace(".", "_")
                if key in found and found[key] is None:
                    found[key] = version.split("-")[0]  # an egg-info's "1.2-py3.8"
    return found


def dir_problem(path: str, private: bool) -> dict[str, Any] | None:
    """Make ``path`` if missing (0700); None when it is a real directory of ours, else what is wrong."""
    try:
        if not os.path.lexists(path):
            make_dirs(path)
        info = os.lstat(path)
    except OSError as exc:
        return {"problem": "unusable", "detail": "%s: %s" % (type(exc).__name__, exc.strerror or exc)}
    if stat.S_ISLNK(info.st_mode):
        return {"problem": "symlink", "target": os.readlink(path)}
    if not stat.S_ISDIR(info.st_mode):
        return {"problem": "unusable", "detail": "not a directory"}
    if info.st_uid != os.geteuid():
        return {"problem": "owner", "uid": info.st_uid, "user": _user(info.st_uid), "me": _user(os.geteuid())}
    if private and info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return None


def make_dirs(path: str) -> None:
    """``path`` and each missing parent, 0700 (XDG's rule for a missing ``~/.cache``): os.makedirs
    gives the parents the umask's mode, 0777 under umask 000, where the private dir below could be
    renamed away and another put in its place after it was checked."""
    parent = os.path.dirname(path)
    if parent != path and not os.path.isdir(parent):
        make_dirs(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass  # made meanwhile (another session): judged as it is


def _user(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "uid %d" % uid


def unpack(request: dict[str, Any]) -> dict[str, Any]:
    """The run's dirs (each ``{"path", "private", "role"}``), then the archives, then the kit check.
    An archive's ``lines`` follow the request on stdin: they are read first, whatever comes next."""
    try:
        archives = spool(request.get("archives", []), sys.stdin)
    except (OSError, EOFError, ValueError) as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
    try:
        return _unpack(request, archives)
    finally:
        for item in archives:
            if "file" in item:
                item["file"].close()


def spool(archives: list[dict[str, Any]], stream: Any) -> list[dict[str, Any]]:
    """Each archive, an inline one (``data``) as it is, one whose ``lines`` (base64) follow on
    ``stream`` read into an unnamed temp file (``file``): its size never sits in memory."""
    import base64
    import tempfile

    spooled: list[dict[str, Any]] = []
    failed: Exception | None = None
    try:
        for item in archives:
            if "lines" not in item:
                spooled.append(item)
                continue
            into = tempfile.TemporaryFile()
            spooled.append(dict(item, file=into))
            for _ in range(int(item["lines"])):
                line = stream.readline()
                if not line.endswith("\n"):
                    raise EOFError("the code's tarball ended early, after %d bytes" % into.tell())
                try:
                    if failed is None:
                        into.write(base64.b64decode(line))
                except (OSError, ValueError) as exc:  # a full disk: the other lines are read all the same,
                    failed = exc  # so that none of them is taken for the next request
            into.seek(0)
        if failed is not None:
            raise failed
    except BaseException:
        for item in spooled:
            if "file" in item:
                item["file"].close()
        raise
    return spooled


def _unpack(request: dict[str, Any], archives: list[dict[str, Any]]) -> dict[str, Any]:
    import tarfile

    problems = {}
    for entry in request.get("dirs", []):
        problem = dir_problem(entry["path"], bool(entry.get("private")))
        if problem is not None:
            problems[entry["path"]] = dict(problem, role=entry.get("role", "dir"))
            break  # the dirs come parents first: nothing below a refused one is made
    if problems:
        return {"dirs": problems}
    try:
        extracted = extract(archives)
    except (OSError, EOFError, ValueError, tarfile.TarError) as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
    result: dict[str, Any] = {"dirs": {}, "extracted": extracted}
    if request.get("kit"):
        result.update(kit=kit_check(request["kit"], full=False), packages=packages())
    return result


def extract(archives: list[dict[str, Any]]) -> int:
    """Extract each archive into its directory, like ``tar --no-same-owner -xzf``."""
    import base64
    import io
    import tarfile

    class Archive(tarfile.TarFile):
        def chown(self, *args: Any, **kwargs: Any) -> None:
            pass  # files belong to the user tfl logs in as, whatever owned them on the launcher's machine

    extracted = 0
    for item in archives:
        os.makedirs(item["dest"], mode=0o700, exist_ok=True)
        data = item["file"] if "file" in item else io.BytesIO(base64.b64decode(item["data"]))
        with Archive.open(fileobj=data, mode="r:gz") as tar:
            members = tar.getmembers()
            if hasattr(tarfile, "data_filter"):
                tar.extractall(item["dest"], members=members, filter="data")
            else:
                tar.extractall(item["dest"], members=members)
            extracted += len(members)
    return extracted


def kit_check(kit_dir: str, full: bool = True) -> dict[str, Any]:
    """Import the job kit as a task will: this python, ``kit_dir`` first on the path. Not
    ``full`` (``tfl launch``'s quick check): only find it there, as the task's import would,
    and leave the Python version to the launcher (an import costs a host ~40 ms of CPU)."""
    import importlib
    import importlib.util

    def ours() -> dict[str, Any]:
        return {n: m for n, m in sys.modules.items() if n == "launcher" or n.startswith("launcher.")}

    saved_path, saved = sys.path[:], ours()
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, kit_dir)
    try:
        if full:
            kit = importlib.import_module("launcher.jobkit")
            kit.select_tf_keras  # noqa: B018  (every job's first call)
            where = kit.__file__
        else:
            spec = importlib.util.find_spec("launcher.jobkit")
            where = spec.origin if spec else None
        package = os.path.dirname(os.path.dirname(os.path.abspath(where or "")))  # .../launcher
        return {"ok": os.path.dirname(package) == os.path.abspath(kit_dir), "file": where, "python": sys.version.split()[0]}
    except Exception as exc:  # whatever the kit raises on this python is the fact to report
        return {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    finally:
        sys.path[:] = saved_path
        for name in ours():
            del sys.modules[name]
        sys.modules.update(saved)


def kit_probe(data: str) -> dict[str, Any]:
    """``kit_check`` on a kit sent in a probe: unpacked into a private temp dir, then removed."""
    import shutil
    import tarfile
    import tempfile

    scratch = tempfile.mkdtemp(prefix="tfl-kit-")
    try:
        extract([{"dest": scratch, "data": data}])
        return kit_check(scratch)
    except (OSError, EOFError, ValueError, tarfile.TarError) as exc:
        return {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def storage(request: dict[str, Any]) -> dict[str, Any]:
    """Write tokens (``{name: text}``) into ``dir``, read others, remove some: ``{"seen": {name: bool}}``.

    A token not seen at once is looked for again for ``wait`` s: network file systems may
    show a new file on another host only after their attribute cache expires.
    """
    directory = expand(request["dir"])
    for name, token in request.get("write", {}).items():
        try:
            fd = os.open(os.path.join(directory, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(token)
        except OSError as exc:
            return {"error": "%s: %s" % (type(exc).__name__, exc.strerror or exc)}
    deadline = time.monotonic() + float(request.get("wait", 0))
    seen = {name: _holds(directory, name, token) for name, token in request.get("read", {}).items()}
    while not all(seen.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = {name: ok or _holds(directory, name, request["read"][name]) for name, ok in seen.items()}
    for name in request.get("remove", []):
        try:
            os.unlink(os.path.join(directory, name))
        except OSError:
            pass
    return {"seen": seen}


def _holds(directory: str, name: str, token: str) -> bool:
    try:
        with open(os.path.join(directory, name)) as f:
            return f.read() == token
    except OSError:
        return False


def cleanup(request: dict[str, Any]) -> dict[str, Any]:
    """Remove each of ``remove`` that is a real directory of ours, then each of ``rmdir`` when it
    holds nothing but empty directories (TensorFlow leaves an empty ``model/backup`` on a worker)."""
    import shutil

    removed = []
    for path in request.get("remove", []):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    for path in request.get("rmdir", []):
        for below, _, _ in os.walk(path, topdown=False):  # symlinks are neither followed nor removed
            try:
                os.rmdir(below)
            except OSError:
                pass  # not empty (the model dir of a run without shared storage stays), or gone
    return {"removed": removed}


def remove(request: dict[str, Any]) -> dict[str, Any]:  # path -> {"removed": bytes} | {"absent": true} | {"error": why}
    """``tfl rm``/``tfl prune``: a finished run's directories, only ones named after the run (or a
    host's dir right inside one: ``runs/<run>/<host>``), never through a link. The ``keep`` paths
    (a model dir on shared storage) are only looked at: ``{"kept": true}`` where one exists."""
    import shutil
    result: dict[str, Any] = {}
    run_id = request["run_id"]
    for asked in request["paths"]:
        path = expand(asked)  # a private run dir is named with the {tfl-cache} placeholder
        if not path.startswith("/") or os.path.normpath(path) != path or path.count("/") < 2 \
                or run_id not in (os.path.basename(path), os.path.basename(os.path.dirname(path))):
            result[asked] = {"error": "refused: not a directory of run %s" % run_id}
        elif os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            result[asked] = {"error": "refused: a link or a file, not a directory"}
        else:
            try:
                size = sum(os.lstat(os.path.join(top, name)).st_blocks * 512
                           for top, dirs, files in os.walk(path) for name in dirs + files)
                shutil.rmtree(path)
                result[asked] = {"removed": size}
            except FileNotFoundError:
                result[asked] = {"absent": True}
            except OSError as exc:
                result[asked] = {"error": "%s: %s" % (type(exc).__name__, exc)}
    for kept in request.get("keep", []):
        result.setdefault(kept, {"kept": True} if os.path.isdir(kept) else {"absent": True})
    return result


class Progress:
    """Mirrors the job's progress file to the launcher (for status and stall detection).

    A file is told from the last one sent by its inode, size and mtime (ns), taken from the file
    read: the kit replaces it whole (a temp file, then a rename: a new inode each time), and two
    records written within one tick of the kernel's file clock have the same mtime; told by its
    mtime alone, the second (the task's "done" or "preempted" record, written right after its
    last step's) never reached the launcher."""

    def __init__(self, path: str | None) -> None:
        self.path, self.checked = path, 0.0
        self.sent: tuple[int, int, int] | None = None

    def forward(self, control: Callable[[dict[str, Any]], None], now: float, final: bool = False) -> None:
        if not self.path or (now - self.checked < 0.5 and not final):
            return
        self.checked = now
        try:
            with open(self.path) as f:
                st = os.fstat(f.fileno())
                signature = (st.st_ino, st.st_size, st.st_mtime_ns)
                if signature != self.sent:
                    control({"progress": f.read()})
                    self.sent = signature
        except OSError:
            pass
