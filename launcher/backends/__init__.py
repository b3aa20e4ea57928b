"""Backends start, poll and signal the tasks of a plan; they never decide policy.

``BACKENDS`` maps a plan's ``TaskLaunch.backend`` to a factory, so tests can pass fakes
and the SSH backend (which imports fabric) is only imported when a plan needs it.
"""

from __future__ import annotations

import importlib
from typing import Callable

from launcher.backends.base import Backend, TaskProcess

__all__ = ["Backend", "TaskProcess", "make_backend", "BACKENDS"]

# name -> "module:Class"; imported lazily so `tfl status` never pays for fabric.
BACKENDS: dict[str, str] = {
    "local": "launcher.backends.local:LocalBackend",
    "ssh": "launcher.backends.ssh:SSHBackend",
}


def make_backend(name: str, notify: Callable[[], None]) -> Backend:
    module, _, cls = BACKENDS[name].partition(":")
    factory = getattr(importlib.import_module(module), cls)
    backend: Backend = factory(notify=notify)
    return backend
