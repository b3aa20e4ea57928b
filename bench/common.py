"""What every measure shares: paths, statistics, report sections, private run stores.

Nothing here knows about a particular measure. Times are wall-clock seconds from
``time.perf_counter`` unless they must be compared across processes (then ``time.time``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from tests.procs import tfl_processes

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
TINY = BENCH / "jobs" / "tiny.py"
FAKE_TRAIN = BENCH / "jobs" / "fake_train.py"
MNIST = ROOT / "jobs" / "mnist.py"
PLAIN_LAUNCH = BENCH / "plain_launch.sh"
PYTHON = sys.executable


def tfl_command() -> list[str]:
    """The installed ``tfl`` console script (what a user runs), else ``python -m launcher``."""
    script = Path(PYTHON).parent / "tfl"
    return [str(script)] if script.exists() else [PYTHON, "-m", "launcher"]


class BenchError(Exception):
    """A measurement could not be taken (a run failed, a process was left behind)."""


# --- statistics -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Stats:
    """Median, min, max (and p95) of a list of samples."""

    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        if not samples:
            raise BenchError("no samples")
        return cls(tuple(samples))

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def p95(self) -> float:
        """Nearest-rank 95th percentile (with fewer than 20 samples this is the maximum)."""
        ordered = sorted(self.samples)
        rank = max(1, -(-95 * len(ordered) // 100))
        return ordered[rank - 1]

    def fmt(self, scale: float = 1.0, digits: int = 2, unit: str = "") -> str:
        """``median (min–max)``, e.g. ``0.52 s (0.49–0.61)``."""
        med, lo, hi = (f"{v * scale:.{digits}f}" for v in (self.median, self.min, self.max))
        return f"{med}{unit} ({lo}–{hi})"


def ratio_stats(numerators: Sequence[float], denominators: Sequence[float]) -> Stats:
    """Per-repetition ratios: each pair was measured back to back in one repetition."""
    return Stats.of([a / b for a, b in zip(numerators, denominators, strict=True)])


# --- the report's building block --------------------------------------------------------------

@dataclass
class Section:
    """One numbered measure of the issue: a table, its verdict and what to read into it."""

    number: int
    title: str
    target: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    verdict: str = "n/a"  # "met", "missed", "n/a" (no target) or "not measured"
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)  # the samples behind every figure
    extra_tables: list[dict[str, Any]] = field(default_factory=list)  # {"title", "headers", "rows"} after the main one
    headline: str = ""  # the key figure(s), for the summary
    measured_at: str = ""
    took_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # 1-min load average before and after


def verdict(ok: bool) -> str:
    return "met" if ok else "missed"


# --- workspace: private run stores, never inside the repository ------------------------------

class Workspace:
    """A temp dir holding one fresh TFL_HOME per measurement; removed at the end."""

    def __init__(self, keep: bool = False) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tfl-bench-"))
        self._count = 0
        self._keep = keep

    def home(self, label: str) -> Path:
        self._count += 1
        path = self.root / f"{self._count:04d}-{label}"
        path.mkdir()
        return path

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        # Nothing of an outer run (TF_CONFIG, TFL_*) may leak into the measured ones.
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("TFL_")}
        return {**env, "TFL_HOME": str(home), **extra}

    def close(self) -> None:
        leftovers = tfl_processes(home=str(self.root))
        kill_all(leftovers)
        if not self._keep:
            shutil.rmtree(self.root, ignore_errors=True)
        if leftovers:
            raise BenchError(f"processes were left alive and have been killed: {[p.pid for p in leftovers]}")


def kill_all(procs: Sequence[Any]) -> None:
    for proc in procs:
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 - gone already
            pass


def assert_none_left(home: Path, timeout: float = 10.0) -> None:
    """Every task of every run under ``home`` must be gone; kill and fail otherwise."""
    deadline = time.monotonic() + timeout
    left = tfl_processes(home=str(home))
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = tfl_processes(home=str(home))
    if left:
        kill_all(left)
        raise BenchError(f"{len(left)} task process(es) of {home} outlived their run (killed now)")


def load1() -> float:
    return os.getloadavg()[0]
