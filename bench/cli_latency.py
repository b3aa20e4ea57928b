"""1. CLI latency: `tfl --help` and `tfl status` (50 runs in the store) against the bare
imports of the launcher's three dependencies, the floor any Python CLI built on them pays."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.common import PYTHON, TINY, BenchError, Section, Stats, Workspace, ratio_stats, tfl_command, verdict
from bench.config import Config
from bench.procs import timed_run

TARGET = 1.3
BASELINE_NAME = "import typer, pydantic, psutil"
BASELINE = [PYTHON, "-c", BASELINE_NAME]
SCHEMA_NAME = "… + pydantic's schema machinery (reference)"
JUDGED = ("tfl --help", "tfl status")


def fill_store(ws: Workspace, runs: int) -> Path:
    """A store holding ``runs`` finished runs: copies of one real `tfl launch` run."""
    home = ws.home("store")
    env = ws.env(home)
    subprocess.run([*tfl_command(), "launch", str(TINY), "--local", "2", "--", "--sleep", "0"], env=env,
                   check=True, capture_output=True, timeout=120)
    (original,) = (home / "runs").iterdir()
    record = json.loads((original / "state.json").read_text())
    for i in range(1, runs):
        run_id = f"{original.name}-{i:03d}"
        copy = home / "runs" / run_id
        shutil.copytree(original, copy)
        data = json.loads(json.dumps(record).replace(original.name, run_id))
        _shift_times(data, -60.0 * (runs - i))  # an older run, one minute apart
        (copy / "state.json").write_text(json.dumps(data, indent=1))
    return home


def _shift_times(record: dict[str, Any], by: float) -> None:
    for item in [record, *record["tasks"]]:
        for key in ("created", "started", "ended"):
            if isinstance(item.get(key), float):
                item[key] += by


def measure(cfg: Config, ws: Workspace) -> Section:
    home = fill_store(ws, cfg.store_runs)
    env = ws.env(home)
    listed = subprocess.run([*tfl_command(), "status"], env=env, capture_output=True, text=True, timeout=60)
    if listed.returncode != 0 or len(listed.stdout.splitlines()) != cfg.store_runs + 1:
        raise BenchError(f"`tfl status` did not list {cfg.store_runs} runs: {listed.stdout[-500:]}{listed.stderr[-500:]}")
    commands = {
        BASELINE_NAME: BASELINE,
        "tfl --help": [*tfl_command(), "--help"],
        "tfl status": [*tfl_command(), "status"],
        # Not judged: what `tfl status` would pay if it built any pydantic validator (see the notes).
        SCHEMA_NAME: [PYTHON, "-c", "import typer, pydantic, psutil, typer._adapters"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for rep in range(cfg.cli_reps + 2):  # the first two rounds warm the page cache, unrecorded
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order every round
            took, code = timed_run(commands[name], env)
            if code != 0:
                raise BenchError(f"`{name}` exited with {code}")
            if rep >= 2:
                times[name].append(took)
    base = times[BASELINE_NAME]
    rows, ratios = [], {}
    for name in names:
        stats = Stats.of(times[name])
        ratio = ratio_stats(times[name], base)
        judged = name in JUDGED
        if judged:
            ratios[name] = ratio
        rows.append([f"`{name}`", stats.fmt(1000, 0, " ms"),
                     "1 (baseline)" if name == BASELINE_NAME else ratio.fmt(digits=2, unit="×"),
                     f"≤ {TARGET}×: {verdict(ratio.median <= TARGET)}" if judged
                     else "" if name == BASELINE_NAME else "— (reference)"])
    ok = all(r.median <= TARGET for r in ratios.values())
    headline = ", ".join(f"`{n}` {r.median:.2f}×" for n, r in ratios.items())
    return Section(
        1, "CLI latency", f"`tfl --help` and `tfl status` ≤ {TARGET}× `python -c \"import typer, pydantic, psutil\"`",
        ["command", "wall time", "ratio to the imports (same round)", "target"], rows, verdict(ok),
        notes=[f"{cfg.cli_reps} rounds after 2 unrecorded warm-up rounds; each round runs every command back to back "
               "in a rotating order, and each ratio is taken within its round.",
               f"`tfl status` lists {cfg.store_runs} finished runs (copies of one real `tfl launch` run record).",
               "`tfl` is the installed console script of the project's virtual environment.",
               "`import pydantic` alone is lazy: pydantic v2 loads its schema machinery on the first model or "
               "TypeAdapter built, which costs about a third of the baseline again (the reference row). `tfl status` "
               "builds none: run records are plain dataclasses read by a small strict loader "
               "(`launcher/runstore.py`), RUN is read from the command's extra arguments, and `--help`'s unset value "
               "is False rather than None, because typer 0.29 coerces every other value (None included) through a "
               "pydantic TypeAdapter (`typer/_coercion.py`). A test (`tests/test_cli.py`) checks that `tfl status` "
               "loads neither that machinery nor TensorFlow or fabric."],
        raw={name: times[name] for name in names}, headline=headline)
