"""1. CLI latency: `tfl --help` and `tfl status` (50 runs in the store, then 3,000) against the
bare imports of the launcher's three dependencies, the floor any Python CLI built on them pays."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.common import PYTHON, TINY, BenchError, Section, Stats, Workspace, ratio_stats, tfl_command, verdict
from bench.config import Config
from bench.procs import timed_run

BASELINE_NAME = "import typer, pydantic, psutil"
BASELINE = [PYTHON, "-c", BASELINE_NAME]
SCHEMA_NAME = "… + pydantic's schema machinery (reference)"
MANY = "tfl status, {runs} runs"
# command -> its target (ratio to the bare imports, same round)
TARGETS = {"tfl --help": 1.3, "tfl status": 1.3, MANY: 1.0}


def fill_store(ws: Workspace, runs: int) -> Path:
    """A store holding ``runs`` finished runs: copies of one real `tfl launch` run."""
    home = ws.home("store")
    env = ws.env(home)
    subprocess.run([*tfl_command(), "launch", str(TINY), "--local", "2", "--", "--sleep", "0"], env=env,
                   check=True, capture_output=True, timeout=120)
    (original,) = (home / "runs").iterdir()
    record = json.loads((original / "state.json").read_text())
    for i in range(1, runs):
        run_id = f"{original.name}-{i:04d}"
        copy = home / "runs" / run_id
        shutil.copytree(original, copy)
        data = json.loads(json.dumps(record).replace(original.name, run_id))
        _shift_times(data, -60.0 * (runs - i))  # an older run, one minute apart
        (copy / "state.json").write_text(json.dumps(data, indent=1))
        os.utime(copy, (data["ended"], data["ended"]))  # its record last written when it ended
    return home


def _shift_times(record: dict[str, Any], by: float) -> None:
    for item in [record, *record["tasks"]]:
        for key in ("created", "started", "ended"):
            if isinstance(item.get(key), float):
                item[key] += by


def _check_listing(env: dict[str, str], runs: int) -> None:
    """`tfl status` lists every run of a small store, and the 20 latest of a large one."""
    listed = subprocess.run([*tfl_command(), "status"], env=env, capture_output=True, text=True, timeout=60)
    lines = listed.stdout.splitlines()
    expected = runs + 1 if runs <= 20 else 20 + 2  # the header, the rows, and "… and N older run(s)"
    if listed.returncode != 0 or len(lines) != expected:
        raise BenchError(f"`tfl status` did not list {runs} runs as expected: {listed.stdout[-500:]}{listed.stderr[-500:]}")


def measure(cfg: Config, ws: Workspace) -> Section:
    home = fill_store(ws, cfg.store_runs)
    many_home = fill_store(ws, cfg.store_runs_many)
    env, many_env = ws.env(home), ws.env(many_home)
    many = MANY.format(runs=f"{cfg.store_runs_many:,}")
    targets = {many if name == MANY else name: target for name, target in TARGETS.items()}
    for e, runs in ((env, cfg.store_runs), (many_env, cfg.store_runs_many)):
        _check_listing(e, runs)
    commands = {
        BASELINE_NAME: (BASELINE, env),
        "tfl --help": ([*tfl_command(), "--help"], env),
        "tfl status": ([*tfl_command(), "status"], env),
        many: ([*tfl_command(), "status"], many_env),
        # Not judged: what `tfl status` would pay if it built any pydantic validator (see the notes).
        SCHEMA_NAME: ([PYTHON, "-c", "import typer, pydantic, psutil, typer._adapters"], env),
    }
    times = _rounds(commands, cfg.cli_reps)
    names = list(commands)
    base = times[BASELINE_NAME]
    rows, ratios = [], {}
    for name in names:
        stats = Stats.of(times[name])
        ratio = ratio_stats(times[name], base)
        target = targets.get(name)
        if target is not None:
            ratios[name] = (ratio, target)
        rows.append([f"`{name}`", stats.fmt(1000, 0, " ms"),
                     "1 (baseline)" if name == BASELINE_NAME else ratio.fmt(digits=2, unit="×"),
                     f"≤ {target}×: {verdict(ratio.median <= target)}" if target is not None
                     else "" if name == BASELINE_NAME else "— (reference)"])
    ok = all(r.median <= t for r, t in ratios.values())
    headline = ", ".join(f"`{n}` {r.median:.2f}×" for n, (r, _) in ratios.items())
    return Section(
        1, "CLI latency", f"`tfl --help` and `tfl status` ≤ 1.3× `python -c \"import typer, pydantic, psutil\"`; "
        f"`tfl status` with {cfg.store_runs_many:,} runs in the store ≤ 1.0×",
        ["command", "wall time", "ratio to the imports (same round)", "target"], rows, verdict(ok),
        notes=_notes(cfg), raw={name: times[name] for name in names}, headline=headline)


def _rounds(commands: dict[str, tuple[list[str], dict[str, str]]], reps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for rep in range(reps + 2):  # the first two rounds warm the page cache, unrecorded
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:  # rotate the order every round
            command, env = commands[name]
            took, code = timed_run(command, env)
            if code != 0:
                raise BenchError(f"`{name}` exited with {code}")
            if rep >= 2:
                times[name].append(took)
    return times


def _notes(cfg: Config) -> list[str]:
    return [f"{cfg.cli_reps} rounds after 2 unrecorded warm-up rounds; each round runs every command back to back "
            "in a rotating order, and each ratio is taken within its round.",
            f"`tfl status` lists {cfg.store_runs} finished runs (copies of one real `tfl launch` run record); with "
            f"{cfg.store_runs_many:,} runs in the store it lists the active runs and the 20 latest, and reads only "
            "those records: it finds the active runs by their marker files (`<home>/active/<run id>`) and the latest by "
            "one `stat` per run dir (its mtime is when its record was last written), so its cost does not grow with "
            "the store (`launcher/records/index.py`).",
            "`tfl` is the installed console script of the project's virtual environment.",
            "Shell completion is on (typer's `--install-completion` / `--show-completion`, run ids completed from the run "
            "dirs' names): those two options' unset values are made False too, so `tfl status` still builds no TypeAdapter.",
            "`import pydantic` alone is lazy: pydantic v2 loads its schema machinery on the first model or "
            "TypeAdapter built, which costs about a third of the baseline again (the reference row). `tfl status` "
            "builds none: run records are plain dataclasses read by a small strict loader "
            "(`launcher/records/store.py`), RUN is read from the command's extra arguments, and `--help`'s unset value "
            "is False rather than None, because typer 0.29 coerces every other value (None included) through a "
            "pydantic TypeAdapter (`typer/_coercion.py`). A test (`tests/test_cli.py`) checks that `tfl status` "
            "loads neither that machinery nor TensorFlow or fabric."]
