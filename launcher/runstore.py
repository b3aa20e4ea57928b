"""The run store: one directory per run holding ``state.json``, logs and progress.

Only the run's supervisor writes its record, always atomically (temp file + ``os.replace``),
so ``tfl status`` in another terminal never reads half a file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import tempfile
import time
import types
import typing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from launcher.errors import RunNotFoundError
from launcher.states import RunState, TaskState

STATE_FILE = "state.json"

# Records are plain dataclasses read by a small strict loader, not pydantic models: `tfl status`
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


@dataclass
class RestartRecord:
    attempt: int
    time: float
    reason: str


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
    grace_period: float = 5.0  # the launcher's SIGTERM -> SIGKILL delay: `tfl stop` waits that long for it
    launcher_start_ticks: int | None = None  # with launcher_pid: see launcher.procs.ProcessIdentity
    launcher_boot_id: str | None = None
    launcher_host: str | None = None  # `tfl status`/`stop` elsewhere (a shared TFL_HOME) can tell it is not theirs

    def task(self, name: str) -> TaskRecord:
        return next(t for t in self.tasks if t.task == name)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        """Raises ValueError for anything that is not a record of this version."""
        return _load(cls, json.loads(text), "record")


_T = TypeVar("_T")


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(kind: type) -> dict[str, Any]:
    if kind not in _HINTS:
        _HINTS[kind] = typing.get_type_hints(kind)
    return _HINTS[kind]


def _load(kind: type[_T], data: object, where: str) -> _T:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object")
    hints = _hints(kind)
    if unknown := set(data) - set(hints):
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    values = {key: _value(hints[key], value, f"{where}.{key}") for key, value in data.items()}
    try:
        return kind(**values)
    except TypeError as err:  # a required key is missing
        raise ValueError(f"{where}: {err}") from None


def _value(hint: Any, value: object, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType:  # X | None
        if value is None and type(None) in args:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        return _value(hint, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        return [_value(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        return value
    if dataclasses.is_dataclass(hint):
        return _load(hint, value, where)  # type: ignore[arg-type]
    if isinstance(hint, type) and issubclass(hint, Enum):
        return hint(value)  # ValueError for an unknown state
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (str, int, float) and type(value) is hint:
        return value
    raise ValueError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}")


def default_home() -> Path:
    if os.environ.get("TFL_HOME"):
        return Path(os.environ["TFL_HOME"])
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "tfl"


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RunStore:
    def __init__(self, home: Path | None = None) -> None:
        self.home = home or default_home()
        self.runs_dir = self.home / "runs"

    def new_run_id(self, job: str) -> str:
        return f"{job}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    def create(self, record: RunRecord) -> None:
        run_dir = Path(record.run_dir)
        for sub in ("logs", "progress"):
            (run_dir / sub).mkdir(parents=True, exist_ok=True)
        self.save(record)

    def save(self, record: RunRecord) -> None:
        write_atomic(Path(record.run_dir) / STATE_FILE, record.to_json())

    def load(self, run_id: str) -> RunRecord:
        path = self.run_dir(run_id) / STATE_FILE
        try:
            return RunRecord.from_json(path.read_text())
        except FileNotFoundError:
            raise RunNotFoundError(f"run '{run_id}' not found in {self.runs_dir} (see `tfl status` for the runs)") from None
        except ValueError:
            raise RunNotFoundError(f"run '{run_id}': {path} is not a tfl run record (was it written by another version?)") from None

    def list(self) -> list[RunRecord]:
        """Every readable run, oldest first."""
        records = []
        for path in self.runs_dir.glob(f"*/{STATE_FILE}"):
            try:
                records.append(RunRecord.from_json(path.read_text()))
            except (OSError, ValueError):
                continue  # a run being created or deleted right now
        return sorted(records, key=lambda r: r.created)

    def resolve(self, ref: str | None) -> RunRecord:
        """A run by id, unique id prefix, or the latest run when ``ref`` is None."""
        if ref is None:
            runs = self.list()
            if not runs:
                raise RunNotFoundError(f"no runs yet in {self.runs_dir} (start one with `tfl launch`)")
            return runs[-1]
        if (self.run_dir(ref) / STATE_FILE).exists():
            return self.load(ref)
        matches = sorted(p.parent.name for p in self.runs_dir.glob(f"{ref}*/{STATE_FILE}"))
        if len(matches) == 1:
            return self.load(matches[0])
        if matches:
            raise RunNotFoundError(f"'{ref}' matches {len(matches)} runs ({', '.join(matches[:3])}, …); give more of the id")
        raise RunNotFoundError(f"run '{ref}' not found in {self.runs_dir} (see `tfl status` for the runs)")
