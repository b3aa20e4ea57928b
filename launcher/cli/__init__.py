"""The ``tfl`` command line. Thin: parse, make one call into the core, render.

Only this package imports typer and decides exit codes. TensorFlow and fabric are never
imported here: the commands that need fabric import them through the backends, lazily.

- ``app``: the typer app and what every command shares (errors, the core call, the store);
- ``launching``: ``launch`` and the commands about a description (doctor, validate, schema,
  export k8s);
- ``runs``: the commands about recorded runs (status, stop, logs, rm, prune, tensorboard).
"""

from __future__ import annotations

from launcher.cli import launching, runs  # noqa: F401  (importing them registers their commands)
from launcher.cli.app import app
from launcher.limits import raise_open_files

__all__ = ["app", "main"]


def main() -> None:
    raise_open_files()  # a launcher holds a descriptor per connection and per task (launcher.limits)
    app(prog_name="tfl")  # also as `python -m launcher`: completion asks for _TFL_COMPLETE
