"""6. Restart cost: steps redone after a crash at step k, against the backup interval.

``tfl launch --local 2 --max-restarts 1``; worker:0 is killed once the chief has finished
step k. The job kit's per-step progress log says where the chief was and where the
restarted group resumed. These runs also give §3 its real-training teardown times.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import BenchError, Section, Stats, Workspace, assert_none_left, tfl_command, verdict
from bench.config import Config
from bench.procs import kill_and_time, kill_group, spawn, tasks_named, wait_for


def crash_args(cfg: Config, data: Path | None) -> list[str]:
    """The training job of every crash measure: one epoch, backups every N steps, killed at step k."""
    return ["--epochs", "1", "--steps-per-epoch", str(cfg.crash_step + 2 * cfg.backup_every),
            "--batch-size", str(cfg.global_batch // 2), "--backup-every-steps", str(cfg.backup_every),
            *(["--data", str(data)] if data else [])]


@dataclass
class RestartSample:
    crashed_at: int  # the chief's last completed step before the worker died
    resumed_from: int  # the step the restarted group restored
    redone: int
    recovery_s: float  # from the kill to the restarted chief back at ``crashed_at``
    teardown_s: float | None  # worker's death to the chief gone (tfl, real training job)
    sigterm_caught: bool  # the chief logged TensorFlow's "SIGTERM caught" and kept running


def restart_runs(cfg: Config, ws: Workspace, data: Path | None) -> list[RestartSample]:
    samples = []
    for rep in range(cfg.reps):
        home = ws.home(f"restart-{rep}")
        log = home / "progress.jsonl"
        launcher = spawn([*tfl_command(), "launch", str(cfg.train_job), "--local", "2", "--max-restarts", "1", "--",
                           *crash_args(cfg, data)],
                          ws.env(home, TFL_PROGRESS_LOG=str(log)))
        try:
            wait_for(partial(reached_step, log, cfg.crash_step), 600,
                     f"the chief to reach step {cfg.crash_step}")
            killed = time.time()
            teardown = kill_and_time(tasks_named(home, "worker:0"), "worker:0", 30)
            code = launcher.wait(900)
        finally:
            if launcher.poll() is None:
                kill_group(launcher)
        assert_none_left(home)
        if code != 0:
            raise BenchError(f"restart run {rep}: tfl exited {code}")
        (run_dir,) = (home / "runs").iterdir()
        first_attempt = (run_dir / "logs" / "chief-0.log").read_text(errors="replace").split("--- tfl: attempt 1")[0]
        samples.append(_restart_sample(log, killed, teardown, "SIGTERM caught" in first_attempt))
    return samples


def _chief_records(log: Path) -> list[dict[str, Any]]:
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written right now
        if record.get("task") == "chief:0" and record.get("phase") == "train":
            records.append(record)
    return records


def _chief_steps(log: Path, attempt: int) -> list[int]:
    return [int(r["global_step"]) for r in _chief_records(log) if r.get("attempt") == attempt]


def reached_step(log: Path, step: int) -> bool:
    return max(_chief_steps(log, 0), default=0) >= step


def _restart_sample(log: Path, killed: float, teardown: float | None, caught: bool) -> RestartSample:
    records = _chief_records(log)
    crashed_at = max(_chief_steps(log, 0))
    after = [r for r in records if r.get("attempt") == 1]
    if not after:
        raise BenchError(f"{log}: no progress from the restarted chief")
    resumed_from = int(after[0]["global_step"]) - 1
    back = next(r for r in after if int(r["global_step"]) >= crashed_at)
    return RestartSample(crashed_at, resumed_from, crashed_at - resumed_from, float(back["time"]) - killed, teardown, caught)


def restart_section(cfg: Config, samples: list[RestartSample]) -> Section:
    redone = Stats.of([float(s.redone) for s in samples])
    rows = [[str(cfg.backup_every), Stats.of([float(s.crashed_at) for s in samples]).fmt(digits=0),
             Stats.of([float(s.resumed_from) for s in samples]).fmt(digits=0), redone.fmt(digits=0),
             Stats.of([s.recovery_s for s in samples]).fmt(digits=1, unit=" s"),
             f"≤ {cfg.backup_every}: {verdict(redone.max <= cfg.backup_every)}"]]
    return Section(
        6, "Restart cost", "steps redone after a crash at step k, against the backup interval",
        ["backup every (steps)", "crash after step k", "resumed from step", "steps redone", "crash → back at step k",
         "redone ≤ interval"], rows, verdict(redone.max <= cfg.backup_every),
        notes=[f"`tfl launch {Path(cfg.train_job).name} --local 2 --max-restarts 1 -- --backup-every-steps "
               f"{cfg.backup_every}`; worker:0 is killed with SIGKILL once the chief has finished step {cfg.crash_step}. "
               f"{len(samples)} runs.",
               "Steps come from the job kit's per-step progress log (TFL_PROGRESS_LOG): the chief's last step before the "
               "crash, and the first step after the restart (resumed from = that step − 1).",
               "Redone steps are bounded by the backup interval; the expected value is k mod interval. "
               + ("The time to get back is mostly TensorFlow starting again in both tasks, not the steps redone."
                  if cfg.uses_mnist else "")],
        raw={"samples": [s.__dict__ for s in samples]},
        headline=f"{redone.median:.0f} ({redone.min:.0f}–{redone.max:.0f}) steps redone, backup every {cfg.backup_every}")
