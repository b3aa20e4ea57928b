"""The run store: one directory per run holding ``state.json``, logs and progress.

Only the run's supervisor writes its record, always atomically (temp file + ``os.replace``)
and durably (fsync of the file and of the run dir), so ``tfl status`` in another terminal
never reads half a file, and a crash leaves the last record whole. Run dirs are 0700 and
their files 0600 (``launcher.files``); a run dir is made once, never reused.

Records carry a ``version``. One from a newer tfl is never taken for absent: ``tfl status``
lists it as unreadable with the reason, and ``tfl stop``/``tfl logs`` without RUN refuse to
fall back on an older run when the latest one cannot be read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import glob
import json
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from launcher.errors import RunExistsError, RunNotFoundError, StateWriteError, UnreadableRunError
from launcher.files import ForeignDirError, own_dir, private_dir, write_atomic
from launcher.records.index import ACTIVE_DIR, active_ids, mark_active, mark_ended, recent_ids
from launcher.records.loader import load
from launcher.records.states import RunState, TaskState

STATE_FILE = "state.json"
STOP_REQUEST = "stop_requested"  # written by `tfl stop` before its SIGTERM: the launcher's SIGTERM is then no preemption
# Bump when a record changes so that an older tfl cannot read it right (2: backend_data; 3: the
# preempted states, RestartRecord.kind, RunRecord.config; 4: an elastic run's min_tasks,
# lost_hosts and resizes; 5: the plan's TF_CONFIG cluster kept once, as plan.tf_cluster, and
# tasks' TF_CONFIG rebuilt from it). This tfl reads every older version (each new field has a
# default, a plan without tf_cluster keeps each TF_CONFIG whole) and saves what it read in its own.
RECORD_VERSION = 5
# The latest run is the newest created among the active runs and this many whose record changed last.
LATEST_AMONG = 20

# Records are plain dataclasses read by a small strict loader (launcher.records.loader), not pydantic models: `tfl status`
# reads every run's record, and building pydantic's validators costs more than the command's
# whole import budget (docs/benchmarks.md §1). The cluster file, which users write, stays pydantic.


@dataclass
class TaskRecord:
    task: str
    host: str
    backend: str
    log_path: str
    progress_path: str
    state: TaskState = TaskState.PENDING
    attempt: int = 0
    pid: int | None = None
    create_time: float | None = None  # psutil's, so a reused pid is never taken for ours
    start_ticks: int | None = None  # clock ticks since boot at its start (procs.start_ticks): immune to clock steps
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None


@dataclass
class FailureRecord:
    """A task that failed: data for the summary, never an exception."""

    task: str
    host: str
    pid: int | None
    exit_code: int | None
    reason: str  # "exit code 3", "killed by SIGKILL", "stalled for 60 s"
    log_tail: list[str]
    time: float
    attempt: int
    # The reason is the run's, not this task's: the whole unit ended under its tasks (a Slurm job cancelled
    # outside tfl, or its time limit); the task only carries it (``TaskProcess.unit_ended``).
    of_run: bool = False


RESTART_KINDS = ("failure", "preemption", "resume")


@dataclass
class RestartRecord:
    """One more attempt of the group: after a failure (counted against --max-restarts), after a
    preemption (counted against --max-preemptions), or by ``tfl resume`` (counted by neither)."""

    attempt: int
    time: float
    reason: str
    kind: str = "failure"  # one of RESTART_KINDS


@dataclass
class ResizeRecord:
    """An elastic run changed size between two attempts (``launcher.supervise.elastic``)."""

    attempt: int  # the attempt that runs at the new size
    time: float
    from_tasks: int  # training tasks, the chief included
    to_tasks: int
    reason: str  # "lost: host2 (unreachable: …)", "back: host2 answers again"
    hosts: list[str]  # the hosts lost, or taken back
    notes: list[str] = field(default_factory=list)  # renamed tasks, the evaluator left out


@dataclass
class RunRecord:
    run_id: str
    job: str
    job_args: list[str]
    run_dir: str
    created: float
    state: RunState = RunState.STARTING
    launcher_pid: int | None = None
    launcher_create_time: float | None = None
    attempt: int = 0
    max_restarts: int = 0
    tasks: list[TaskRecord] = field(default_factory=list)
    failures: list[FailureRecord] = field(default_factory=list)
    restarts: list[RestartRecord] = field(default_factory=list)
    stopped_because_of_failure: list[str] = field(default_factory=list)
    ended: float | None = None
    exit_code: int | None = None
    message: str | None = None
    plan: dict[str, Any] = field(default_factory=dict)
    backend: str = "local"  # what ran the tasks: `tfl status`/`stop` ask the same backend
    backend_data: dict[str, str] = field(default_factory=dict)  # the backend's own handle on the run (Slurm: the job id)
    version: int = RECORD_VERSION
    grace_period: float = 5.0  # the launcher's SIGTERM -> SIGKILL delay: `tfl stop` waits that long for it
    launcher_start_ticks: int | None = None  # with launcher_pid: see launcher.records.identity.ProcessIdentity
    launcher_boot_id: str | None = None
    launcher_host: str | None = None  # `tfl status`/`stop` elsewhere (a shared TFL_HOME) can tell it is not theirs
    config: dict[str, Any] = field(default_factory=dict)  # the supervisor's options (SupervisorConfig): `tfl resume` reuses them
    min_tasks: int | None = None  # an elastic run's --min-tasks
    lost_hosts: dict[str, str] = field(default_factory=dict)  # an elastic run's hosts left out now, each with why
    resizes: list[ResizeRecord] = field(default_factory=list)

    def task(self, name: str) -> TaskRecord:
        """By name, through an index rebuilt whenever ``tasks`` is another list or another length
        (the supervisor asks for every task on every tick: a scan each time would cost T²)."""
        index = self.__dict__.get("_by_name")
        if index is None or index[0] is not self.tasks or index[1] != len(self.tasks):
            index = (self.tasks, len(self.tasks), {t.task: t for t in self.tasks})
            self.__dict__["_by_name"] = index
        found = index[2].get(name)
        if found is None or found.task != name:  # a record renamed in place: scan, as before
            return next(t for t in self.tasks if t.task == name)
        return found

    def to_json(self) -> str:
        # Compact: the record is rewritten on every change of the run, and its size is what a large run pays.
        # Not dataclasses.asdict: it deep-copied the whole plan on every save (0.2 s of CPU at 64 tasks).
        return json.dumps(self, default=_fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        """Raises ValueError for anything that is not a record of this version
        (NewerRecordError for a newer tfl's)."""
        data = json.loads(text)
        version = data.get("version") if isinstance(data, dict) else None
        if isinstance(version, int) and not isinstance(version, bool) and version > RECORD_VERSION:
            raise NewerRecordError(f"written by a newer tfl (record version {version}; this tfl reads up to "
                                   f"{RECORD_VERSION}): upgrade tfl to use it")
        return load(cls, data, "record")


class NewerRecordError(ValueError):
    """A record from a newer tfl: not damaged, just not ours to interpret."""


@dataclass(frozen=True)
class UnreadableRun:
    """A run whose record cannot be read: listed, never silently skipped."""

    run_id: str
    path: str
    reason: str
    created: float  # the record's own, when that much can be read; else the file's mtime

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "state": "unreadable", "reason": self.reason, "path": self.path, "started": self.created}



def default_home() -> Path:
    if os.environ.get("TFL_HOME"):
        return Path(os.environ["TFL_HOME"])
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "tfl"


_Scan = tuple[list[RunRecord], list[UnreadableRun]]  # here: `list` in RunStore is its method
_Recent = tuple[list[RunRecord], list[UnreadableRun], int]


def id_safe(job: str) -> str:
    """A job's name as the head of a run id that pastes into any shell and that Slurm and every
    engine take: each run of characters other than ASCII letters, digits, ``_`` and ``.`` (dashes
    included) becomes one ``-``, and the id starts with a letter or digit (never an option's ``-``)."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", job).lstrip("-._").rstrip("-.") or "job"


class RunStore:
    def __init__(self, home: Path | None = None) -> None:
        self.home = home or default_home()
        self.runs_dir = self.home / "runs"

    def new_run_id(self, job: str) -> str:
        """The job's name (``id_safe``), the time, 48 random bits, and never the id of a run dir
        that exists (``create`` refuses the one that might appear in between: it never shares a dir)."""
        import secrets  # here: its OpenSSL import is a tenth of `tfl status`, which never makes an id

        while True:
            run_id = f"{id_safe(job)}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(6)}"
            if not os.path.lexists(self.run_dir(run_id)):
                return run_id

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def reserve(self, run_dir: str | os.PathLike[str]) -> None:
        """Make a new run's dir, 0700; refuse one that exists (another run's), or a store another user owns."""
        try:
            for kept in (self.runs_dir, self.home / ACTIVE_DIR):
                own_dir(kept)
            private_dir(run_dir)
        except ForeignDirError as exc:
            raise StateWriteError(f"{exc.filename} is {exc.strerror}: they could change your runs' records there "
                                  "(set TFL_HOME to a directory of your own)") from None
        except FileExistsError:
            raise RunExistsError(f"run dir {run_dir} exists already (another launch took the same run id); "
                                 "launch again for a new id") from None
        except NotADirectoryError as exc:
            raise StateWriteError(f"cannot create the run dir {run_dir}: {exc.filename} is not a directory "
                                  "(set TFL_HOME to a directory, or move that file away)") from None
        except OSError as exc:
            raise StateWriteError(f"cannot create the run dir {run_dir}: {exc.strerror} "
                                  f"(check that {self.home} is writable, or set TFL_HOME)") from None

    def create(self, record: RunRecord, *, reserved: bool = False) -> None:
        """Record a new run: its dir (unless ``reserve`` made it), logs/, progress/, state.json,
        and its marker among the active runs (``records.index``)."""
        if not reserved:
            self.reserve(record.run_dir)
        try:
            for sub in ("logs", "progress"):
                private_dir(Path(record.run_dir) / sub, exist_ok=True)
            mark_active(self.home, record.run_id)
        except OSError as exc:
            raise StateWriteError(f"cannot create the run {record.run_id} in {self.home}: {exc.strerror}") from None
        self.save(record)

    def save(self, record: RunRecord) -> None:
        """Write the record durably; StateWriteError (one line) when the disk refuses."""
        path = Path(record.run_dir) / STATE_FILE
        record.version = RECORD_VERSION  # a record read from an older tfl is saved in this one's format
        try:
            write_atomic(path, record.to_json(), durable=True)
        except OSError as exc:
            # Removed under the run: no record stays, nor a marker to show it. ENOENT with the dir still
            # there is a removal caught midway (an `rm -r` took the temp file before its rename).
            if exc.errno == errno.ENOENT or not os.path.isdir(record.run_dir):
                with contextlib.suppress(OSError):
                    mark_ended(self.home, record.run_id)
                raise StateWriteError(f"the run dir {record.run_dir} was removed while run {record.run_id} ran, its record "
                                      "and logs with it; nothing of the run is kept (launch it again)") from None
            raise StateWriteError(f"cannot save the state of run {record.run_id} to {path}: {exc.strerror or exc}; "
                                  "its last saved record stays (free space on that disk or fix its permissions)") from None
        if record.state.is_terminal:  # the marker `tfl status` finds active runs by (runindex)
            mark_ended(self.home, record.run_id)

    def request_stop(self, record: RunRecord) -> None:
        """Say that the SIGTERM about to reach the run's launcher is `tfl stop`'s (the user's).
        A run dir that refuses the note still gets stopped: its run then reads as preempted."""
        try:
            write_atomic(Path(record.run_dir) / STOP_REQUEST, "")
        except OSError:
            pass

    def stop_requested(self, record: RunRecord) -> bool:
        return (Path(record.run_dir) / STOP_REQUEST).exists()

    def clear_stop_request(self, record: RunRecord) -> None:
        try:
            os.unlink(Path(record.run_dir) / STOP_REQUEST)
        except FileNotFoundError:
            pass

    def reopen(self, record: RunRecord) -> None:
        """A finished run continues (``tfl resume``): it is active again, then saved."""
        try:
            mark_active(self.home, record.run_id)
        except OSError as exc:
            raise StateWriteError(f"cannot mark the run {record.run_id} active in {self.home}: {exc.strerror}") from None
        self.save(record)

    def load(self, run_id: str) -> RunRecord:
        path = self.run_dir(run_id) / STATE_FILE
        text = None
        try:
            text = path.read_text()
            return RunRecord.from_json(text)
        except FileNotFoundError:
            raise RunNotFoundError(f"run '{run_id}' not found in {self.runs_dir} (see `tfl status` for the runs)") from None
        except NewerRecordError as exc:
            raise UnreadableRunError(f"run '{run_id}': {path} was {exc}") from None
        except (OSError, ValueError) as exc:
            why = "it is empty" if text == "" else str(exc)
            raise UnreadableRunError(f"run '{run_id}': {path} is not a tfl run record this tfl can read (damaged, or "
                                     f"written by another version: {why}); once nothing of the run is left running, "
                                     f"remove it by hand: rm -r {shlex.quote(str(path.parent))}") from None

    def list(self) -> list[RunRecord]:
        """Every readable run, oldest first."""
        return self.scan()[0]

    def scan(self, names: Iterable[str] | None = None) -> _Scan:
        """The runs named (default: every run): the readable records and the unreadable ones,
        each oldest first."""
        paths = self.runs_dir.glob(f"*/{STATE_FILE}") if names is None else (self.run_dir(n) / STATE_FILE for n in names)
        records, unreadable = [], []
        for path in paths:
            try:
                text = path.read_text()
                records.append(RunRecord.from_json(text))
            except FileNotFoundError:
                continue  # a run being created or deleted right now
            except (OSError, ValueError) as exc:
                reason = f"{path.name} was {exc}" if isinstance(exc, NewerRecordError) else f"{path.name} cannot be read: {exc}"
                unreadable.append(UnreadableRun(path.parent.name, str(path), reason, _created_of(path)))
        return sorted(records, key=lambda r: r.created), sorted(unreadable, key=lambda u: u.created)

    def recent(self, count: int) -> _Recent:
        """The active runs and the ``count`` runs whose record changed last (readable or not),
        oldest first, and how many other run dirs there are. Reads only those records (``records.index``)."""
        names, total = recent_ids(self.runs_dir, count)
        wanted = list(dict.fromkeys([*active_ids(self.home), *names]))
        records, unreadable = self.scan(wanted)
        return records, unreadable, max(0, total - len(records) - len(unreadable))

    def resolve(self, ref: str | None) -> RunRecord:
        """A run by id, unique id prefix, or the latest run when ``ref`` is None."""
        if ref is None:
            runs, unreadable, _ = self.recent(LATEST_AMONG)
            if unreadable and (not runs or unreadable[-1].created >= runs[-1].created):
                latest = unreadable[-1]
                raise UnreadableRunError(f"the latest run, {latest.run_id}, is unreadable: {latest.reason}; "
                                         "name a RUN to act on another one (see `tfl status`)")
            if not runs:
                raise RunNotFoundError(f"no runs yet in {self.runs_dir} (start one with `tfl launch`)")
            return runs[-1]
        # A run id is one name in runs/: a ref with a slash is no run's, and its text is a prefix, not a glob.
        if "/" not in ref and ref not in (".", "..") and (self.run_dir(ref) / STATE_FILE).exists():
            return self.load(ref)
        matches = sorted(p.parent.name for p in self.runs_dir.glob(f"{glob.escape(ref)}*/{STATE_FILE}")) if "/" not in ref else []
        if len(matches) == 1:
            return self.load(matches[0])
        if matches:
            shown = ", ".join(matches[:3]) + (", …" if len(matches) > 3 else "")
            raise RunNotFoundError(f"'{ref}' matches {len(matches)} runs ({shown}); give more of the id")
        raise RunNotFoundError(f"run '{ref}' not found in {self.runs_dir} (see `tfl status` for the runs)")


def _created_of(path: Path) -> float:
    """When an unreadable run began: its record's ``created`` if that much parses, else the mtime."""
    try:
        created = json.loads(path.read_text()).get("created")
        if isinstance(created, (int, float)) and not isinstance(created, bool):
            return float(created)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _fields(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
