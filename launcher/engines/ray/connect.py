"""Ray, imported only when a ``ray`` description is used; one connection per process."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from launcher.engines.ray.address import endpoint
from launcher.engines.ray.node import INSTALL_HINT
from launcher.engines.ray.plan import NAMESPACE
from launcher.errors import LaunchError

# Ray's own connect retries an address where nothing listens for minutes, printing its C++ warnings.
REACH_TIMEOUT = 5.0
LAUNCH_FIX = "start the cluster (`ray start --head`) or fix ray.address in the description"
# A resume reaches the run's cluster at the address it recorded (the description is not read again), or at the
# one `--address` gives: the cluster started again elsewhere.
RECORDED_FIX = ("start the run's cluster there again (`ray start --head`), or give its new address: "
                "`tfl resume {run} --address HOST:PORT`")
LAUNCHER_DIR = Path(__file__).resolve().parents[2]
# The job kit, and the task runner the actors are: all a node needs of tfl.
KIT_FILES = ("__init__.py", "contract.py", "jobkit", "engines/__init__.py", "engines/ray/__init__.py", "engines/ray/node/__init__.py",
             "engines/ray/node/runner.py")


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise LaunchError(f"a 'ray' description needs Ray, which is not installed here; {INSTALL_HINT}") from None
    return ray


def connect(address: str, env: dict[str, Any] | None = None, fix: str = LAUNCH_FIX) -> ModuleType:
    """Ray, connected to ``address`` in tfl's namespace (once per process). ``env``: the job's
    runtime_env (local dirs can be uploaded only at this level, not per actor); ``fix``: what to do
    when the cluster cannot be reached."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    _check_reachable(address, fix)
    from ray._private import ray_constants

    # Under `uv run`, Ray would make every worker `uv run` this project's environment: the nodes
    # run the shipped job with their own Python instead (the runtime_env tfl gives each actor).
    ray_constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False, runtime_env=env)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        said = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise LaunchError(f"ray.address {address}: cannot connect to the Ray cluster ({said}); {fix}") from None
    return ray


def _check_reachable(address: str, fix: str) -> None:
    """One line, within seconds, when nothing answers at a named address."""
    named = endpoint(address)
    if named is None:  # "auto": Ray finds the cluster itself, and says so at once when there is none
        return
    try:
        socket.create_connection(named, timeout=REACH_TIMEOUT).close()
    except OSError as exc:
        said = f"no answer in {REACH_TIMEOUT:.0f} s" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise LaunchError(f"ray.address {address}: nothing answers at {named[0]}:{named[1]} ({said}); {fix}") from None


def cluster_answers(ray: ModuleType, address: str) -> bool:
    """Whether the connected cluster still answers at its front door (the named address, or for "auto"
    the GCS Ray found). Ray's own calls to a GCS that is gone (the cluster stopped under a run) block
    for 60 s and then end this process with a C++ error, before tfl could print the run's end."""
    named = endpoint(address)
    try:
        if named is None:
            host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")
            named = (host.strip("[]"), int(port))
        socket.create_connection(named, timeout=REACH_TIMEOUT).close()
    except (OSError, ValueError, AttributeError):
        return False
    return True


def disconnect() -> None:
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()


def kit_dir() -> str:
    """A private temp copy of the job kit and the task runner, as ``<dir>/launcher``: the
    actors' ``py_modules``. The caller removes ``<dir>`` once ``ray.init`` has uploaded it."""
    root = tempfile.mkdtemp(prefix="tfl-ray-kit-")
    for name in KIT_FILES:
        src, dest = LAUNCHER_DIR / name, Path(root) / "launcher" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest)
    return root


def runtime_env(working_dir: str, kit: str) -> dict[str, Any]:
    return {"working_dir": working_dir, "py_modules": [os.path.join(kit, "launcher")]}
