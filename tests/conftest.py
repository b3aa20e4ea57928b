from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.netbed import netbed  # noqa: F401  (a bed of hosts with networks of their own, per test)
from tests.procs import assert_none_left
from tests.ray_cluster import ray_cluster  # noqa: F401  (module fixture: a private five-node Ray cluster on loopback)
from tests.slurm_cluster import slurm_cluster  # noqa: F401  (session fixture: a private two-node Slurm cluster)
from tests.sshd import sshd  # noqa: F401  (session fixture: a real sshd on 127.0.0.2 and 127.0.0.3)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tfl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private run store; afterwards, proof that no task of its runs is alive."""
    home = tmp_path / "tfl-home"
    monkeypatch.setenv("TFL_HOME", str(home))
    yield home
    assert_none_left(str(home))


@pytest.fixture
def tfl_cmd() -> list[str]:
    """Run the CLI as a real process (for signals and live output)."""
    return [sys.executable, "-m", "launcher"]


@pytest.fixture
def child_env(tfl_home: Path) -> dict[str, str]:
    return {**os.environ, "TFL_HOME": str(tfl_home)}
