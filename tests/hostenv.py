"""Python environments for the SSH test hosts, as on a fresh GPU box: no tfl in them.

Built with uv from the project's lock (the lock's versions of TensorFlow, tf_keras,
TensorBoard and scikit-learn, and of everything they pull in), never with the project
itself, so a task there finds tfl's job kit only because tfl shipped it. Built once and
kept under ``~/.cache/tfl-tests/`` (``$TFL_TEST_CACHE``), keyed by the lock's hash: CI
pays for it once per lock. uv links the files from its own cache, so an env costs little
disk. Without uv the tests that need one skip, except in CI (CI=true) where that fails.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
JOB_PACKAGES = ("tensorflow", "tf-keras", "tensorboard", "scikit-learn")


def cache_root() -> Path:
    return Path(os.environ.get("TFL_TEST_CACHE") or Path.home() / ".cache" / "tfl-tests")


def _uv() -> str:
    found = os.environ.get("UV") or shutil.which("uv")  # `uv run` tells its own path in $UV
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("uv is missing; the SSH host environments are built with it (see .ci/run)")
    pytest.skip("uv not installed; the SSH host environments are built with it")


def host_python(name: str, packages: tuple[str, ...] = JOB_PACKAGES) -> Path:
    """The python of env ``name`` holding ``packages`` at the lock's versions (built on first use)."""
    lock = (ROOT / "uv.lock").read_bytes()
    key = hashlib.sha256(lock + " ".join(packages).encode()).hexdigest()[:16]
    target = cache_root() / f"{name}-py{sys.version_info.major}{sys.version_info.minor}-{key}"
    python = target / "bin" / "python"
    if (target / "ready").exists():
        return python
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # another test session may be building it
        if not (target / "ready").exists():
            _build(target, packages)
    return python


def _build(target: Path, packages: tuple[str, ...]) -> None:
    uv = _uv()
    shutil.rmtree(target, ignore_errors=True)  # a build cut short
    constraints = target.parent / f".{target.name}.constraints.txt"
    subprocess.run([uv, "export", "--frozen", "--no-emit-project", "--all-extras", "--no-hashes", "--no-header",
                    "--quiet", "-o", str(constraints)], cwd=ROOT, check=True)
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(target)], check=True)
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(target / "bin" / "python"), "-c", str(constraints),
                    *packages], check=True)
    probe = subprocess.run([str(target / "bin" / "python"), "-c", "import launcher"], capture_output=True, cwd=target)
    assert probe.returncode != 0, f"{target} must not hold tfl"
    (target / "ready").write_text(" ".join(packages) + "\n")
