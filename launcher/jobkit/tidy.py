"""What a task removes itself before it leaves with `os._exit`: autograph's generated modules.

TensorFlow's autograph writes every function it converts to
``$TMPDIR/__autograph_generated_file*.py`` and removes those files in an `atexit` handler.
The kit's tasks leave with `os._exit` (finish.py, notice.py), which skips `atexit`, so each
run of ``jobs/mnist.py --local 2`` left 16 such files in /tmp, for good. Autograph keeps
each of them as a module in `sys.modules`, named after its file: those are the files
removed here, and only when they sit in the temp dir that `tempfile` gives.

Pure: no TensorFlow (nothing is imported; `sys.modules` is only read).
"""

from __future__ import annotations

import os
import sys
import tempfile

GENERATED_PREFIX = "__autograph_generated_file"


def generated_files() -> list[str]:
    """The files of autograph's generated modules that this process has loaded."""
    where = os.path.realpath(tempfile.gettempdir())
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) if name.startswith(GENERATED_PREFIX) else None
        if (isinstance(path, str) and os.path.basename(path) == f"{name}.py"
                and os.path.realpath(os.path.dirname(path)) == where):
            found.append(path)
    return found


def remove_generated_files() -> None:
    """Remove them (what autograph's `atexit` handler would have done). Never raises."""
    for path in generated_files():
        try:
            os.remove(path)
        except OSError:
            pass  # gone already, or not ours to remove: the exit goes on
