"""Ray: the ``ray`` block of a cluster description, its planner, and what runs on the Ray nodes.

Launcher side (never on a node): ``settings`` (the ``ray`` block, pydantic), ``plan`` (a Ray
``LaunchPlan`` and its ``RayUnit``: address, placement, bundles; pure, stdlib).

Node side: ``runner`` (the task runner each Ray actor is: stdlib only, plus what Ray itself
gives an actor). It is shipped with the job kit in every run's ``py_modules``, so the nodes
need TensorFlow and Ray, not tfl. The backend that drives a Ray run (placement group, actors,
log relay, the recorded run) is ``launcher.backends.ray``.

Nothing here imports ``ray`` at module level: a cluster file, ``tfl status`` and ``tfl --help``
never pay for it; only the backend imports it, when a ``ray`` description is launched. The
``ray`` kind is registered in ``launcher.descriptions`` (parser, planner, unit, dry-run text).
"""

INSTALL_HINT = "install the Ray extra: `uv sync --extra ray` (or `pip install 'tfl[ray]'`)"
