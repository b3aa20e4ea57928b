"""`uv run python -m bench [--quick] [--out FILE] [--only PHASES]`: measure, then write the report.

Phases (each fills some of the issue's sections):
  cli       1. CLI latency
  launch    2. launch overhead, 5. supervisor cost, 7. throughput (one set of runs)
  failures  3. failure → teardown (with TensorFlow alone), 6. restart cost
  scaling   4. local and SSH scaling
  training  8. training throughput: the job kit against hand-written tf_keras, on Fashion-MNIST
  chaos     9. chaos: many runs, each with a random task killed at a random moment
  slurm    10. Slurm: launch to every task running against plain sbatch, death → teardown, notice → tasks
  hosts    13. lost hosts: a host cut off noticed, the run ended, every task stopped; launcher kill -9
  preemption 11. preemption in the job: the notice watch's and input position's cost, notice → checkpoint
  tfl-preemption 12. preemption through tfl: notice → checkpoint, preemption → training again (local, SSH)
  elastic  14. elastic runs: host lost → training again, steps lost against the backup interval (root: netbed)
  manyhosts 18. many hosts: SSH runs of 16-256 hosts on the large bed (root); --many-hosts, --idle-window
"""

from __future__ import annotations

import argparse
import compileall
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from bench import (
    chaos,
    cli_latency,
    elastic_report,
    failures,
    launch,
    lost_hosts,
    many_hosts,
    preempt_launch,
    preemption,
    restart,
    scaling,
    slurm,
    ssh,
    training,
    training_report,
)
from bench.common import PYTHON, ROOT, Section, Workspace, load1
from bench.config import Config, machine, timestamp
from bench.report import previous_report, render

PHASES = ("cli", "launch", "failures", "scaling", "training", "chaos", "slurm", "hosts", "preemption", "tfl-preemption",
          "elastic", "manyhosts")


def make_data(ws: Workspace) -> Path:
    """The job kit's offline fallback data as an .npz, so no task tries the network."""
    path = ws.root / "digits-as-mnist.npz"
    code = ("import sys, numpy as np; from launcher.jobkit.datasets import load_digits_as_mnist as load; "
            "(a, b), (c, d) = load(); np.savez(sys.argv[1], x_train=a, y_train=b, x_test=c, y_test=d)")
    subprocess.run([PYTHON, "-c", code, str(path)], check=True, cwd=ROOT, timeout=300)
    return path


def phase_cli(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    return [cli_latency.measure(cfg, ws)]


def phase_launch(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    tiny = launch.tiny_runs(cfg, ws)
    train = launch.training_runs(cfg, ws, data)
    return [launch.launch_section(cfg, tiny, train), launch.supervisor_section(cfg, train),
            launch.throughput_section(cfg, train)]


def phase_failures(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    tiny = failures.tiny_teardowns(cfg, ws)
    restarts = restart.restart_runs(cfg, ws, data)
    alone = failures.tf_alone(cfg, ws, data)
    return [failures.teardown_section(cfg, tiny, alone, restarts), restart.restart_section(cfg, restarts)]


def phase_scaling(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    local = scaling.local_scaling(cfg, ws)
    remote, note = ssh.ssh_scaling(cfg, ws)
    return [scaling.scaling_section(cfg, local, remote, note)]


def phase_training(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    return [training_report.training_section(cfg, training.training_runs(cfg, ws))]


def phase_chaos(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    trials, seed = chaos.chaos_trials(cfg, ws, data)
    return [chaos.chaos_section(cfg, trials, seed)]


def phase_slurm(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    return [slurm.slurm_section(cfg, slurm.slurm_runs(cfg, ws, data))]


def phase_hosts(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    return [lost_hosts.lost_host_section(cfg, lost_hosts.lost_host_trials(cfg, ws))]


def phase_preemption(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    return [preemption.preemption_section(cfg, preemption.preemption_runs(cfg, ws))]


def phase_tfl_preemption(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    return [preempt_launch.preemption_section(preempt_launch.tfl_preemption_trials(cfg, ws))]


def phase_elastic(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    return [elastic_report.elastic_section(cfg, elastic_report.elastic_trials(cfg, ws))]


def phase_manyhosts(cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    return [many_hosts.many_hosts_section(cfg, many_hosts.many_host_runs(cfg, ws))]


RUNNERS: dict[str, Callable[[Config, Workspace, Path | None], list[Section]]] = {
    "cli": phase_cli, "launch": phase_launch, "failures": phase_failures, "scaling": phase_scaling,
    "training": phase_training, "chaos": phase_chaos, "slurm": phase_slurm,
    "hosts": phase_hosts, "preemption": phase_preemption, "tfl-preemption": phase_tfl_preemption,
    "elastic": phase_elastic, "manyhosts": phase_manyhosts}


def run_phase(name: str, cfg: Config, ws: Workspace, data: Path | None) -> list[Section]:
    print(f"bench: {name} …", file=sys.stderr, flush=True)
    started, load_before, when = time.monotonic(), load1(), timestamp()
    sections = RUNNERS[name](cfg, ws, data)
    took, load_after = time.monotonic() - started, load1()
    for section in sections:
        section.took_s, section.load, section.measured_at = took, (load_before, load_after), when
        print(f"bench:   {section.number}. {section.title}: {section.verdict} ({section.headline})", file=sys.stderr, flush=True)
    return sections


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions, small N, a TF-free training stand-in (CI)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the report to write (default: docs/benchmarks.md; with --quick: printed on stdout, so a smoke "
                             "run never replaces the full report's figures)")
    parser.add_argument("--only", default=",".join(PHASES),
                        help=f"comma-separated phases to measure ({', '.join(PHASES)}; default: all); the report keeps the "
                             "others' sections")
    parser.add_argument("--trials", type=int, default=None,
                        help="trials of each trial-based phase (chaos, hosts, tfl-preemption, elastic) instead of the mode's")
    parser.add_argument("--keep", action="store_true", help="keep the temporary run stores (their path is printed)")
    parser.add_argument("--many-hosts", help="manyhosts: the host counts, one task each (default 16,64,128,256)")
    parser.add_argument("--idle-window", type=float, help="manyhosts: seconds the idle launcher is watched (default 60)")
    args = parser.parse_args(argv)
    phases = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        parser.error(f"--only: unknown phase(s) {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    cfg = Config.quick_mode() if args.quick else Config.full()
    if args.trials is not None:
        if args.trials < 1:
            parser.error(f"--trials: {args.trials} is not a count of trials; give 1 or more")
        cfg = cfg.with_trials(args.trials)
    if args.many_hosts:
        cfg = replace(cfg, many_hosts=tuple(int(h) for h in args.many_hosts.split(",")))
    if args.idle_window is not None:
        cfg = replace(cfg, many_idle_s=args.idle_window)
    started = time.monotonic()
    ws = Workspace(keep=args.keep)
    # The checkout's own modules compiled once, as an installed tfl has them: with PYTHONDONTWRITEBYTECODE=1
    # (this machine) every tfl start-up compiled ~60 of them again, ~15 % of a `tfl launch`'s own CPU (§5).
    compileall.compile_dir(ROOT / "launcher", quiet=1)
    print(f"bench: {'quick' if cfg.quick else 'full'} mode; run stores under {ws.root}", file=sys.stderr, flush=True)
    out = report_path(args.out, quick=cfg.quick)
    sections, history, kept = previous_report(out) if out is not None else ({}, [], [])
    if set(phases) == set(PHASES):  # a whole run starts the report afresh, but for the sections no phase measures
        sections, history = {}, []
    measured: list[int] = []
    try:
        data = make_data(ws) if cfg.uses_mnist and {"launch", "failures", "chaos", "slurm"} & set(phases) else None
        for name in PHASES:
            if name in phases:
                fresh = run_phase(name, cfg, ws, data)
                sections.update({s.number: s for s in fresh})
                measured += [s.number for s in fresh]
    finally:
        ws.close()
    run = {"command": "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:]), "finished": timestamp(),
           "took_min": round((time.monotonic() - started) / 60, 1), "sections": sorted(measured)}
    meta = {"mode": "quick" if cfg.quick else "full", "history": history + [run] if measured else history,
            "machine": machine()}
    text = render(list(sections.values()), meta, kept)
    if out is None:
        sys.stdout.write(text)
        print(f"bench: printed the quick report above in {run['took_min']} min (--out FILE writes it)", file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"bench: wrote {out} in {run['took_min']} min", file=sys.stderr)
    return 0


def report_path(out: Path | None, *, quick: bool) -> Path | None:
    """Where the report goes: --out, else docs/benchmarks.md for a full run; a quick run without
    --out prints it (None): its figures, from a few repetitions and a stand-in job, are no report."""
    if out is not None:
        return out
    return None if quick else ROOT / "docs" / "benchmarks.md"


if __name__ == "__main__":
    sys.exit(main())
