"""The Ray engine's node side: ``runner``, the task runner each Ray actor is (stdlib only, plus what Ray
itself gives an actor). It is shipped with the job kit in every run's ``py_modules``, so the
nodes need TensorFlow and Ray, not tfl.

Nothing under ``launcher.engines.ray`` imports ``ray`` at module level: a cluster file, ``tfl
status`` and ``tfl --help`` never pay for it; only the backend imports it, when a ``ray``
description is launched. The ``ray`` kind is registered in ``launcher.describe.kinds``.
"""

INSTALL_HINT = "install the Ray extra: `uv sync --extra ray` (or `pip install 'tfl[ray]'`)"
