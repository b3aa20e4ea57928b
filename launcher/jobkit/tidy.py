"""What a task removes itself before it leaves with `os._exit`: autograph's generated modules.

TensorFlow's autograph writes every function it converts to
``$TMPDIR/__autograph_generated_file*.py`` and imports it, so Python also caches its bytecode
in ``$TMPDIR/__pycache__/`` (unless PYTHONDONTWRITEBYTECODE is set). Autograph removes the
source in an `atexit` handler, never the bytecode; and the kit's tasks leave with `os._exit`
(finish.py, notice.py), which skips `atexit` altogether. So each run of
``jobs/mnist.py --local 2`` left 16 sources and their bytecode in /tmp, for good.

Autograph keeps each of them as a module in `sys.modules`, named after its file: those files,
and their cached bytecode, are what is removed here, and only where they sit in the temp dir
that `tempfile` gives. The ``__pycache__`` dir goes too once it is empty. A task that ends the
normal way removes them at exit as well (`remove_at_exit`: autograph's handler leaves the bytecode).

Pure: no TensorFlow (nothing is imported; `sys.modules` is only read).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile

GENERATED_PREFIX = "__autograph_generated_file"


def generated_files() -> list[str]:
    """The files of autograph's generated modules this process loaded: each source, then its bytecode."""
    where = os.path.realpath(tempfile.gettempdir())
    cache = os.path.join(where, "__pycache__")
    found = []
    for name, module in list(sys.modules.items()):
        if not name.startswith(GENERATED_PREFIX):
            continue
        source, cached = getattr(module, "__file__", None), getattr(module, "__cached__", None)
        if isinstance(source, str) and os.path.basename(source) == f"{name}.py" and _in(source, where):
            found.append(source)
            if isinstance(cached, str) and os.path.basename(cached).startswith(f"{name}.") and _in(cached, cache):
                found.append(cached)
    return found


def remove_at_exit() -> None:
    """Also at a normal exit (the evaluator's, a job's own), whichever of it and autograph's handler,
    which leaves the bytecode, runs first. Once per process, however often it is called."""
    atexit.unregister(remove_generated_files)
    atexit.register(remove_generated_files)


def remove_generated_files() -> None:
    """Remove them (what autograph's `atexit` handler would have done, and its bytecode). Never raises."""
    for path in generated_files():
        with contextlib.suppress(OSError):  # gone already (never written), or not ours to remove
            os.remove(path)
    with contextlib.suppress(OSError):  # another process's bytecode still there, or no such dir
        os.rmdir(os.path.join(tempfile.gettempdir(), "__pycache__"))


def _in(path: str, folder: str) -> bool:
    return os.path.realpath(os.path.dirname(path)) == folder
