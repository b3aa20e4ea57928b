"""Where a job's files go under its model directory, and who may write there.

Pure (no TensorFlow). Only the chief writes into the real model directory. Under
MultiWorkerMirroredStrategy every worker must still *perform* each save (reading
sync-on-read variables is a collective), so non-chief tasks write into a private
scratch directory that is removed when training ends: TensorFlow's `write_filepath`
pattern, with the scratch kept outside the model dir so nothing there can be
mistaken for the chief's output (or followed by the evaluator).

The dirs the kit makes (the model dir and any missing parent, e.g. ``<storage>/<run id>`` on
shared storage, and the scratch dirs) are 0700 whatever the umask: the model is its user's, and
TensorFlow writes checkpoints and event files as the umask allows (0644, 0666 under umask 000).
A dir that already exists (a ``--model-dir`` the user made) is left as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from launcher.contract import MODEL_SUBDIR, ModelDirLayout, task_slug
from launcher.jobkit.context import TaskContext


@contextlib.contextmanager
def chief_only_writes(model_dir: Path, context: TaskContext) -> Iterator[ModelDirLayout]:
    """Yield the layout this task writes to: the real one (chief) or a scratch copy."""
    if context.is_chief:
        make_private_dirs(model_dir)
        yield ModelDirLayout(model_dir)
        return
    scratch = _fresh_scratch_dir(context)
    print(f"jobkit: {context.label} is not chief; its writes go to scratch dir {scratch} "
          "(removed at the end)", flush=True)
    try:
        yield ModelDirLayout(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fresh_scratch_dir(context: TaskContext) -> Path:
    if context.run_dir is None:
        return Path(tempfile.mkdtemp(prefix=f"tfl-{context.task_type}{context.task_index}-"))
    # Under the launcher: a fixed place in the run dir, so what a SIGKILLed attempt
    # leaves behind stays with its run and is wiped by the task's next attempt.
    scratch = context.run_dir / "scratch" / task_slug(context.task_type, context.task_index)
    shutil.rmtree(scratch, ignore_errors=True)
    make_private_dirs(scratch)
    return scratch


def make_private_dirs(path: Path) -> None:
    """Make ``path`` and each missing parent 0700 (chmod after mkdir: a umask of 0200 must not
    narrow them either); dirs that exist, or that another process makes meanwhile, are left as they are."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=0o700)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue
        os.chmod(directory, 0o700)


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    """Readers polling `path` see the old or the new content, never half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_done_marker(layout: ModelDirLayout) -> dict[str, Any] | None:
    """The chief's end-of-training marker (of whichever run wrote it), or None."""
    return read_json_object(layout.done_file)


def finished_run(layout: ModelDirLayout, context: TaskContext) -> dict[str, Any] | None:
    """The done marker if an attempt of *this* run wrote it, else None.

    A model dir can be reused by a later run, which must neither stop its evaluator nor
    skip its training because of the earlier run's marker. By hand (no run id) nothing
    tells two runs apart, so a marker never counts as this run's.
    """
    marker = read_done_marker(layout)
    if marker is None or context.run_id is None or marker.get("run_id") != context.run_id:
        return None
    return marker


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object from `path`; None if it is missing, half-written or not an object."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def default_model_dir(context: TaskContext, job: str) -> Path:
    """Under the launcher the run's model dir in the cluster's shared storage, else its run
    dir's `model/` (each host's own); by hand a new temp dir (never inside the repository)."""
    if context.model_dir is not None:
        return context.model_dir
    if context.run_dir is not None:
        return context.run_dir / MODEL_SUBDIR
    return Path(tempfile.mkdtemp(prefix=f"tfl-{job}-"))
