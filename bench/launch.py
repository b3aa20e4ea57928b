"""2. Launch overhead, 5. supervisor cost and 7. throughput.

One set of runs serves all three: in each repetition the tiny task and the training job
are started under `tfl launch --local N` and by the plain shell script, back to back (the
order alternates between repetitions); the `tfl` runs of the training job also give the
launcher's CPU time and peak RSS (5) and the examples/s at each N (7).
"""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

from bench.common import PYTHON, TINY, BenchError, Section, Stats, Workspace, ratio_stats, verdict
from bench.config import Config
from bench.runs import GroupRun, plain_group, tfl_group

Runs = dict[int, dict[str, list[GroupRun]]]  # tasks -> "tfl"/"plain" -> one per repetition
TINY_NS = (2, 4)
OVERHEAD_TARGET = 1.05
SPREAD_WARNING = 1.3  # plain runs this far apart: the machine's other work dominates the ratio
CPU_SHARE_TARGET = 0.02
RSS_TARGET_MB = 80.0


def train_args(cfg: Config, n: int, data: Path | None) -> list[str]:
    """Same global batch at every N: the per-replica batch is the global batch / N."""
    args = ["--epochs", str(cfg.epochs), "--steps-per-epoch", str(cfg.steps_per_epoch),
            "--batch-size", str(cfg.global_batch // n)]
    return args + (["--data", str(data)] if data else [])


def _pair(ws: Workspace, rep: int, job: Path, n: int, args: list[str], runs: Runs) -> None:
    order = ("tfl", "plain") if rep % 2 == 0 else ("plain", "tfl")
    for kind in order:
        start = tfl_group if kind == "tfl" else plain_group
        runs.setdefault(n, {}).setdefault(kind, []).append(start(ws, f"{job.stem}-{n}-r{rep}", job, n, args))


def tiny_runs(cfg: Config, ws: Workspace) -> Runs:
    runs: Runs = {}
    for rep in range(cfg.reps):
        for n in TINY_NS:
            _pair(ws, rep, TINY, n, ["--sleep", "0.5"], runs)
    return runs


def training_runs(cfg: Config, ws: Workspace, data: Path | None) -> Runs:
    runs: Runs = {}
    for rep in range(cfg.train_reps):
        for n in cfg.train_workers:
            args = train_args(cfg, n, data)
            if n == 1:  # throughput only: no launch comparison at one task
                runs.setdefault(1, {}).setdefault("tfl", []).append(tfl_group(ws, f"train-1-r{rep}", cfg.train_job, 1, args))
            else:
                _pair(ws, rep, cfg.train_job, n, args, runs)
    for kinds in runs.values():
        for run in kinds["tfl"]:
            step = run.progress().get("global_step")
            if step != cfg.epochs * cfg.steps_per_epoch:
                raise BenchError(f"{run.run_dir}: the chief ended at global step {step}, not {cfg.epochs * cfg.steps_per_epoch}")
    return runs


def launch_section(cfg: Config, tiny: Runs, train: Runs) -> Section:
    rows: list[list[str]] = []
    raw: dict[str, object] = {}
    headline: list[str] = []
    spread_notes: list[str] = []
    linger_notes: list[str] = []
    ok = True
    for job, runs in (("tiny task (sleeps 0.5 s)", tiny), (cfg.job_label, train)):
        for n in sorted(n for n in runs if "plain" in runs[n]):
            tfl = [r.wall_s for r in runs[n]["tfl"]]
            plain = [r.wall_s for r in runs[n]["plain"]]
            overhead = Stats.of([a - b for a, b in zip(tfl, plain, strict=True)])
            own = Stats.of([r.launcher_only_s() for r in runs[n]["tfl"]])
            ratio = ratio_stats(tfl, plain)
            steady = 1 + own.median / min(plain)  # tfl's own time against the quickest plain run
            is_training = runs is train
            if is_training and max(plain) / min(plain) > SPREAD_WARNING:
                spread_notes.append(f"×{n}: the plain script's own runs took {min(plain):.1f}–{max(plain):.1f} s")
            if is_training:
                lingered = {kind: sum(r.worker_outlived_chief() for r in runs[n][kind]) for kind in ("tfl", "plain")}
                if any(lingered.values()):
                    linger_notes.append(f"×{n}: {lingered['tfl']} of {len(tfl)} tfl runs, {lingered['plain']} of {len(plain)} "
                                        "plain runs")
            target = f"≤ {OVERHEAD_TARGET}×: {verdict(ratio.median <= OVERHEAD_TARGET)}" if is_training else "report ms"
            ok = ok and (not is_training or ratio.median <= OVERHEAD_TARGET)
            headline.append(f"{'training' if is_training else 'tiny'} ×{n}: {ratio.median:.3f}× (tfl's own {own.median * 1000:.0f} ms)")
            rows.append([job, str(n), Stats.of(plain).fmt(unit=" s"), Stats.of(tfl).fmt(unit=" s"),
                         overhead.fmt(1000, 0, " ms"), own.fmt(1000, 0, " ms"), ratio.fmt(digits=3, unit="×"),
                         f"{steady:.3f}×", target])
            raw[f"{job} n={n}"] = {"tfl_s": tfl, "plain_s": plain, "tfl_alone_s": list(own.samples)}
    return Section(
        2, "Launch overhead",
        f"`tfl launch --local N` ≤ {OVERHEAD_TARGET}× the plain script on the training job; the tiny task's overhead in ms",
        ["job", "tasks", "plain script", "tfl launch", "tfl − plain", "tfl alone (before + after the tasks)",
         "tfl / plain (same repetition)", "1 + tfl alone / quickest plain run", "target"],
        rows, verdict(ok),
        notes=[f"{cfg.reps} repetitions for the tiny task, {cfg.train_reps} for the training job; in each, the plain script "
               "(`bench/plain_launch.sh`) and `tfl launch` run the "
               "same job back to back, alternating which goes first. Wall time is from spawning the command to its exit.",
               "The plain script gives each task the environment tfl's plan gives it (TF_CONFIG, TF_USE_LEGACY_KERAS, "
               "PYTHONUNBUFFERED, TFL_*), so the job does the same work (progress file, model dir) either way.",
               "“tfl alone” is the part of a `tfl launch` that is tfl's own, from its run record: spawning the command "
               "until the first task started, plus the last task's end until tfl exited. It does not depend on how "
               "long the job takes, so it is steady where “tfl − plain” carries the job's own run-to-run variation "
               "(TensorFlow start-up on a shared 2-core machine varies by a second or more). The column after the "
               "ratio sets that steady part against the quickest plain run: what the ratio would be if nothing else "
               "varied. The target is judged on the measured ratio.",
               *([f"The training job's own run-to-run variation (TensorFlow's start-up and shutdown on this 2-core "
                  f"machine, and any other work on it) moved its times far more than tfl did ({'; '.join(spread_notes)}), "
                  "so its ratio here is mostly that variation; the steady column is the better guide."]
                 if spread_notes else []),
               *([f"At the end of some training runs a worker outlived the chief by about 5 s, until its heartbeat to "
                  f"the chief's coordination service failed (its log: “Failed to send RPC to coordination service”): "
                  f"{'; '.join(linger_notes)}. That is TensorFlow's shutdown, with or without tfl, and it lengthens "
                  "whichever side of a repetition it hits."] if linger_notes else []),
               _train_note(cfg)],
        raw=raw, headline="; ".join(headline))


def _train_note(cfg: Config) -> str:
    return (f"Training job: {cfg.job_label}, {cfg.epochs} epochs × {cfg.steps_per_epoch} steps, global batch "
            f"{cfg.global_batch} (per-replica {cfg.global_batch} / N)"
            + (", on the offline fallback data (scikit-learn's digits upscaled to 28×28) given with `--data`."
               if cfg.uses_mnist else "."))


def supervisor_section(cfg: Config, train: Runs) -> Section:
    rows: list[list[str]] = []
    raw: dict[str, object] = {}
    headline: list[str] = []
    ok = True
    for n in sorted(train):
        runs = [r for r in train[n]["tfl"] if r.usage]
        own = [r.usage.own_cpu_s for r in runs if r.usage]
        tasks = [r.usage.children_cpu_s for r in runs if r.usage]
        startup = [r.startup_cpu_s() for r in runs]
        supervising = [total - first for total, first in zip(own, startup, strict=True)]
        share = ratio_stats(own, tasks)
        rss = Stats.of([r.usage.peak_rss_mb for r in runs if r.usage])
        ok = ok and share.median <= CPU_SHARE_TARGET and rss.median <= RSS_TARGET_MB
        rows.append([str(n), Stats.of(own).fmt(unit=" s"), Stats.of(startup).fmt(unit=" s"), Stats.of(supervising).fmt(unit=" s"),
                     Stats.of(tasks).fmt(digits=1, unit=" s"), share.fmt(100, 2, " %"),
                     ratio_stats(supervising, tasks).fmt(100, 2, " %"), rss.fmt(digits=1, unit=" MB"),
                     f"{verdict(share.median <= CPU_SHARE_TARGET)} / {verdict(rss.median <= RSS_TARGET_MB)}"])
        headline.append(f"×{n}: {share.median * 100:.2f} %, {rss.median:.0f} MB")
        raw[f"n={n}"] = {"launcher_cpu_s": own, "launcher_startup_cpu_s": startup, "tasks_cpu_s": tasks,
                         "peak_rss_mb": [r.usage.peak_rss_mb for r in runs if r.usage]}
    imports = imports_cpu_s(cfg.reps)
    raw["imports_cpu_s"] = imports
    startup_all = Stats.of([s for n in train for s in raw[f"n={n}"]["launcher_startup_cpu_s"]])  # type: ignore[index]
    return Section(
        5, "Supervisor cost",
        f"launcher CPU ≤ {CPU_SHARE_TARGET * 100:g} % of the tasks' CPU during the training job; peak RSS ≤ {RSS_TARGET_MB:g} MB",
        ["tasks", "launcher CPU", "of it: start-up", "of it: supervising", "tasks' CPU", "launcher / tasks",
         "supervising / tasks", "launcher peak RSS", "target (CPU / RSS)"],
        rows, verdict(ok),
        notes=["CPU times are user + system, read from the launcher's /proc entry after it exited and before it was "
               "reaped: its own time, and apart from it the time of the tasks it reaped (TensorFlow start-up included). "
               "The launcher's own time is split at the moment its last task had been started: before that is its "
               "start-up (interpreter, imports, plan, spawning), after it the supervision (waiting for exits, "
               "following the logs, the run record). Its CPU is sampled every 20 ms (clock ticks of 10 ms).",
               "The target is judged on the launcher's whole CPU time (start-up included).",
               f"The start-up is the same whatever the job ({startup_all.median:.2f} s median over every run here); "
               f"of it, the bare imports of the launcher's stack (`python -c \"import typer, pydantic, psutil\"`, "
               f"§1's baseline) take {Stats.of(imports).median:.2f} s of CPU alone (median of {cfg.reps}). For the start-up "
               f"alone to stay under 2 %, the tasks must use at least {startup_all.median / CPU_SHARE_TARGET:.0f} s of "
               "CPU, and the supervising adds its own share on top (the column before the RSS, within the target at "
               "every size): where a row misses, the short training job is why, not the supervision.",
               "Where the start-up goes (a CPU profile of `tfl launch --local 1` of a tiny job, 2026-11-25, "
               "docs/benchmarks.md §5's note of that day): the imports of typer, pydantic and psutil, typer building a "
               "pydantic TypeAdapter for each of `launch`'s options, pydantic building the cluster models, and pydantic "
               "scanning every installed distribution for plugins; tfl's own modules and work are a small part. The "
               "start-up is a fixed cost: judge the supervision by the supervising share, and the start-up in ms (§2).",
               "Peak RSS is the launcher's VmHWM (the kernel's high-water mark), sampled every 20 ms.",
               f"The `tfl launch` runs of §2's training job ({cfg.train_reps} per size). " + _train_note(cfg)],
        raw=raw, headline="; ".join(headline))


def imports_cpu_s(reps: int) -> list[float]:
    """CPU seconds (user + system) of the bare imports of typer, pydantic and psutil, per run."""
    samples = []
    for _ in range(reps):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([PYTHON, "-c", "import typer, pydantic, psutil"], check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        samples.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return samples


def throughput_section(cfg: Config, train: Runs) -> Section:
    rates = {n: [float(r.progress()["examples_per_sec"]) for r in train[n]["tfl"]] for n in sorted(train)}  # type: ignore[arg-type]
    base = rates[min(rates)]
    rows = [[str(n), str(cfg.global_batch // n), str(cfg.global_batch), Stats.of(rates[n]).fmt(digits=0, unit=" ex/s"),
             ratio_stats(rates[n], base).fmt(digits=2, unit="×")] for n in rates]
    return Section(
        7, "Throughput", "none (on 2 cores this shows overhead, not speed-up)",
        ["workers", "per-replica batch", "global batch", "examples/s (chief, last epoch)", "vs 1 worker (same repetition)"],
        rows, "n/a",
        notes=[f"**This machine has {os.cpu_count()} cores.** Every worker is a full TensorFlow process; with more workers than "
               "cores they share the same CPUs, and each step adds a cross-process all-reduce over gRPC. So the "
               "figures fall as workers are added: they show the cost of MultiWorkerMirroredStrategy on one small "
               "machine, not a speed-up, and say nothing about several machines.",
               "The rate is the chief's examples/s over its last epoch (steps × global batch / epoch time), as the "
               "job kit reports it in the progress file; the first epoch, which includes graph tracing, is left out.",
               f"The `tfl launch` runs of §2 ({cfg.train_reps} per size). " + _train_note(cfg)],
        raw={f"n={n}": r for n, r in rates.items()},
        headline=", ".join(f"{n}: {Stats.of(r).median:.0f} ex/s" for n, r in rates.items()))

