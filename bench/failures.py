"""3. Failure → teardown, with TensorFlow alone beside it.

A worker is killed with SIGKILL; pidfds give the moment it died and the moment each other
task of its run was gone. Under tfl the supervisor tears the rest down; without tfl
(TensorFlow alone) the chief has to notice by itself. The real-training runs under tfl are
§6's (bench/restart.py); the same crash is also run without tfl.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import psutil

from bench.common import (
    PLAIN_LAUNCH,
    PYTHON,
    TINY,
    BenchError,
    Section,
    Stats,
    Workspace,
    assert_none_left,
    tfl_command,
    verdict,
)
from bench.config import Config
from bench.procs import kill_and_time, kill_group, run_tasks, spawn, tasks_named, teardown_trial, wait_for
from bench.restart import RestartSample, crash_args, reached_step
from bench.runs import STARTED, free_ports

TEARDOWN_TARGET_S = 0.1  # issue 26 (was 0.5 s): the survivors go at once, nothing to save after a failure
TF_ALONE_CAP_S = 60.0
GRACE_S = 5.0  # tfl launch's default --grace-period
TINY_TASKS = 4


def tiny_teardowns(cfg: Config, ws: Workspace) -> list[float]:
    samples = []
    for rep in range(cfg.teardown_reps):
        home = ws.home(f"teardown-{rep}")
        trial = teardown_trial([*tfl_command(), "launch", str(TINY), "--local", str(TINY_TASKS), "--", "--sleep", "120"],
                               ws.env(home), home, partial(_all_started, home), start_wait=60,
                               what=f"{TINY_TASKS} tiny tasks to start", kill_wait=30, exit_wait=30)
        took, code = trial.gone, trial.exit_code
        if took is None or code != 1:
            raise BenchError(f"teardown run {rep}: tasks not gone within 30 s (launcher exit {code})")
        samples.append(took)
    return samples


def _all_started(home: Path) -> dict[str, psutil.Process] | None:
    logs = list((home / "runs").glob("*/logs/*.log"))
    if len(logs) < TINY_TASKS or not all(STARTED.search(p.read_text()) for p in logs):
        return None
    tasks = run_tasks(home)
    return tasks if len(tasks) == TINY_TASKS else None


@dataclass
class AloneSample:
    noticed_s: float | None  # the worker's death to the chief's exit; None: still running at the cap
    chief_said: str  # the chief's last error line: how it noticed


def tf_alone(cfg: Config, ws: Workspace, data: Path | None) -> list[AloneSample]:
    """The same two tasks started by the plain script: kill the worker at step k, time the chief's own exit."""
    samples: list[AloneSample] = []
    for rep in range(cfg.tf_alone_reps):
        home = ws.home(f"tf-alone-{rep}")
        run_dir = home / "runs" / f"tf-alone-{rep}"
        log = home / "progress.jsonl"
        ports = ",".join(str(p) for p in free_ports(2))
        script = spawn(["bash", str(PLAIN_LAUNCH), str(run_dir), PYTHON, str(cfg.train_job), ports, *crash_args(cfg, data)],
                        ws.env(home, TFL_PROGRESS_LOG=str(log)))
        try:
            wait_for(partial(reached_step, log, cfg.crash_step), 600, f"the plain run's chief to reach step {cfg.crash_step}")
            noticed = kill_and_time(tasks_named(home, "worker:0"), "worker:0", TF_ALONE_CAP_S)
            samples.append(AloneSample(noticed, _how_noticed(run_dir / "logs" / "chief-0.log")))
        finally:
            kill_group(script)
            for proc in run_tasks(home).values():
                proc.kill()
        assert_none_left(home)
    return samples


def _how_noticed(log: Path) -> str:
    """The chief's own words for what stopped it: the collective's abort reason, else its last error."""
    lines = log.read_text(errors="replace").splitlines()
    for pattern in (r"aborted by: (.+)", r"(.*heartbeat.*)", r"(\w+Error: .+)"):
        found = [m[1] for line in lines if (m := re.search(pattern, line, re.I))]
        if found:
            return found[-1].strip()[:200]
    return "(no error in its log)"


def teardown_section(cfg: Config, tiny: list[float], alone: list[AloneSample], restarts: list[RestartSample]) -> Section:
    tf_samples = [a.noticed_s for a in alone]
    stats = Stats.of(tiny)
    rows = [[f"tiny task, {TINY_TASKS} tasks, under tfl", f"{len(tiny)}", stats.fmt(1000, 0, " ms"), f"{stats.p95 * 1000:.0f} ms",
             f"median ≤ {TEARDOWN_TARGET_S * 1000:.0f} ms: {verdict(stats.median <= TEARDOWN_TARGET_S)}"]]
    trained = [r.teardown_s for r in restarts if r.teardown_s is not None]
    if trained:
        t = Stats.of(trained)
        rows.append([f"{cfg.job_label}, 2 tasks, under tfl (§6's runs)", str(len(trained)), t.fmt(1000, 0, " ms"),
                     f"{t.p95 * 1000:.0f} ms", f"median ≤ {TEARDOWN_TARGET_S * 1000:.0f} ms: {verdict(t.median <= TEARDOWN_TARGET_S)}"])
    if tf_samples:
        seen = [s for s in tf_samples if s is not None]
        capped = len(tf_samples) - len(seen)
        cell = Stats.of(seen).fmt(digits=1, unit=" s") if seen else f"> {TF_ALONE_CAP_S:.0f} s"
        rows.append([f"{cfg.job_label}, 2 tasks, TensorFlow alone (no tfl)", str(len(tf_samples)),
                     cell + (f"; {capped} run(s) still alive at {TF_ALONE_CAP_S:.0f} s" if capped and seen else ""), "—",
                     "reference"])
    else:
        rows.append(["TensorFlow alone (no tfl)", "0", "not measured in quick mode", "—", "reference"])
    ok = stats.median <= TEARDOWN_TARGET_S and (not trained or Stats.of(trained).median <= TEARDOWN_TARGET_S)
    headline = f"tiny {stats.median * 1000:.0f} ms (p95 {stats.p95 * 1000:.0f} ms)"
    if trained:
        headline += f"; training job {Stats.of(trained).median * 1000:.0f} ms"
    seen_alone = [s for s in tf_samples if s is not None]
    if seen_alone:
        headline += f"; TensorFlow alone {Stats.of(seen_alone).median:.1f} s"
    return Section(
        3, "Failure → teardown",
        f"median ≤ {TEARDOWN_TARGET_S} s from a task's death to the last other task of its run gone; report p95",
        ["run", "runs", "death → last other task gone", "p95", "target"], rows, verdict(ok),
        notes=["A worker (worker:0) is killed with SIGKILL once every task is running. The times come from pidfds "
               "(Linux's process file descriptors): the moment the worker died, and the moment each other task exited, "
               "without sampling the process table.",
               "tfl stops the others at once: the teardown signal (`contract.TEARDOWN_SIGNAL`, SIGUSR2) to each task's "
               "process group, then SIGKILL after `--grace-period` for what is left. Not SIGTERM: a training task takes "
               "SIGTERM for a preemption notice and waits for an agreement that the dead peer can never join (2 s and "
               "more before issue 26). The tiny-task row is tfl's own reaction time.",
               _sigterm_note(restarts),
               _alone_note(alone)],
        raw={"tiny_s": tiny, "training_under_tfl_s": trained, "tf_alone": [a.__dict__ for a in alone]}, headline=headline)


def _alone_note(alone: list[AloneSample]) -> str:
    if not alone:
        return ""
    said = "; ".join(f"{a.noticed_s:.1f} s: “{a.chief_said}”" if a.noticed_s is not None else f"still running: “{a.chief_said}”"
                     for a in alone)
    return (f"TensorFlow alone: the same two-task job started by the plain script, the worker killed mid-training, and "
            f"the chief left to notice on its own (capped at {TF_ALONE_CAP_S:.0f} s; {len(alone)} runs, as each costs a "
            f"full TensorFlow start and the wait). What stopped the chief, in its own log: {said}.")


def _sigterm_note(restarts: list[RestartSample]) -> str:
    caught = sum(r.sigterm_caught for r in restarts)
    if not caught:
        return ""
    graced = sum(1 for r in restarts if r.teardown_s is not None and r.teardown_s >= GRACE_S - 0.1)
    return (f"In {caught} of {len(restarts)} training runs the chief logged TensorFlow's `preemption_notifier.cc: SIGTERM "
            "caught` and kept running: once MultiWorkerMirroredStrategy is set up, TensorFlow takes SIGTERM as a "
            "preemption notice instead of exiting. tfl's SIGTERM reaches the chief within milliseconds (the tiny-task "
            "row), but the chief only exits when it fails on the dead peer by itself, or when the grace period ends and "
            f"tfl sends SIGKILL ({graced} of {len(restarts)} runs took the full {GRACE_S:g} s). A job must give SIGTERM "
            "its default action back after creating the strategy (the job kit does) for tfl's stop to be immediate; "
            "a shorter `--grace-period` bounds the wait otherwise.")


