"""§14 Elastic runs, the ``elastic`` phase of ``python -m bench``: on the network test bed
(``tests.netbed``, root), a TensorFlow-free job for the time from a lost host to training
again against a restart of the same size (bench/elastic.py), then real TensorFlow for the
steps lost per abrupt loss against the kit's backup interval (bench/elastic_steps.py).

Quick mode runs one TF-free restart and one elastic run (B = 5), and no real-TensorFlow run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bench import elastic, elastic_steps
from bench.common import BenchError, Section, Stats, Workspace
from bench.config import Config
from tests.netbed import make_netbed, netbed_available

# (name, elastic?, backup interval B) of the TF-free runs
TF_FREE_RUNS = (("restart, same size (task killed)", False, 5), ("elastic, B=5 (host cut)", True, 5),
                ("elastic, B=20 (host cut)", True, 20))
RESTART = TF_FREE_RUNS[0][0]
QUICK_TF_FREE = 2  # quick mode: the restart and B=5 only


@dataclass
class ElasticRuns:
    tf_free: dict[str, list[dict[str, float]]] = field(default_factory=dict)  # run -> {again_s, lost_steps, at_step}
    steps: dict[int, list[dict[str, float]]] = field(default_factory=dict)  # B -> {reached, resumed_at, lost_steps, at_step}


def elastic_trials(cfg: Config, ws: Workspace) -> ElasticRuns | str:
    """Every run of §14 on one bed, or why none could be made."""
    why = netbed_available()
    if why:
        return f"not measured: {why}"
    runs = ElasticRuns()
    free_rng, tf_rng = random.Random(12), random.Random(14)  # the seeds of the hand-run scripts
    bed = make_netbed(ws.root / "elastic-bed")
    try:
        for rep in range(cfg.elastic_reps):
            for name, is_elastic, backup in TF_FREE_RUNS[:QUICK_TF_FREE if cfg.quick else None]:
                at = free_rng.randrange(25, 45)
                result = elastic.one_run(bed, ws.root / f"elastic-{rep}-{backup}-{is_elastic}", elastic=is_elastic,
                                         backup=backup, at_step=at)
                runs.tf_free.setdefault(name, []).append({**result, "at_step": at})
        for rep in range(cfg.elastic_reps):
            for backup in cfg.elastic_intervals:
                at = tf_rng.randrange(backup + 5, 2 * backup + 5)
                result = elastic_steps.one_run(bed, ws.root / f"elastic-steps-{rep}-{backup}", backup=backup, at_step=at)
                runs.steps.setdefault(backup, []).append({**result, "at_step": at})
    finally:
        bed.teardown()
    if bed.leftovers():
        raise BenchError(f"the test bed left {bed.leftovers()}")
    return runs


def elastic_section(cfg: Config, runs: ElasticRuns | str) -> Section:
    section = Section(14, "Elastic runs", "report: host lost → training again against a restart of the same size; "
                      "steps lost per abrupt loss against the backup interval B",
                      ["run", "trials", "fault → first step again", "steps lost (redone)"], verdict="n/a")
    steps_rows: list[list[str]] = []
    section.extra_tables = [{"title": "Steps lost per abrupt loss, with the kit's backups (real TensorFlow)",
                             "headers": ["backup interval B (steps)", "trials", "steps lost (trained again), median (min–max)",
                                         "each trial: last step → resumed from", "≤ B"], "rows": steps_rows}]
    if isinstance(runs, str):
        section.verdict, section.headline, section.notes = "not measured", runs, [runs]
        section.rows = [["host lost; restart of the same size", runs, "", ""]]
        steps_rows.append(["5, 20, 50", runs, "", "", ""])
        return section
    for name, results in runs.tf_free.items():
        again, lost = Stats.of([r["again_s"] for r in results]), Stats.of([r["lost_steps"] for r in results])
        section.rows.append([name, str(again.n), again.fmt(digits=1, unit=" s"), lost.fmt(digits=1)])
    for backup, results in runs.steps.items():
        lost_counts = [int(r["lost_steps"]) for r in results]
        trials = ", ".join(f"{int(r['reached'])} → {int(r['resumed_at'])}" for r in results)
        steps_rows.append([str(backup), str(len(results)), Stats.of(lost_counts).fmt(digits=0), trials,
                                    "yes" if max(lost_counts) <= backup else "no"])
    if not runs.steps:
        steps_rows.append(["5, 20, 50", "not measured in quick mode: it needs TensorFlow", "", "", ""])
    section.raw = {"tf_free": runs.tf_free, "steps": {str(b): r for b, r in runs.steps.items()}}
    section.headline = _headline(runs)
    section.notes = _notes(cfg, runs)
    return section


def _headline(runs: ElasticRuns) -> str:
    medians = {name: Stats.of([r["again_s"] for r in results]).median for name, results in runs.tf_free.items()}
    restart = medians.pop(RESTART, None)
    cut = ", ".join(f"{value:.1f} s ({name.removeprefix('elastic, ').removesuffix(' (host cut)')})"
                    for name, value in medians.items())
    parts = [f"host cut → training again {cut}"
             + (f" against {restart:.1f} s for a restart of the same size" if restart is not None else "")]
    if runs.steps:
        lost = {b: Stats.of([r["lost_steps"] for r in results]) for b, results in runs.steps.items()}
        within = all(s.max <= b for b, s in lost.items())
        parts.append("real TensorFlow, steps lost: " + ", ".join(f"median {s.median:g} (B={b})" for b, s in lost.items())
                     + (", every trial ≤ B" if within else ", NOT every trial ≤ B"))
    return "; ".join(parts)


def _notes(cfg: Config, runs: ElasticRuns) -> list[str]:
    notes = [
        "The network test bed (root; hosts in network namespaces, each with its own sshd). Chief on the first host, "
        "workers on the two others. Top table: a TensorFlow-free job that takes a step every 0.1 s (bench/elastic.py), "
        "the chief keeping a checkpoint of the step every B steps in the shared model dir; the fault comes at a random "
        "step between 25 and 44.",
        "**Host lost → training again** is the time from the fault to the first step of the next attempt. A killed task "
        "is seen at once (its exit; `--max-restarts 1`, no elastic), so the restart of the same size is quick (about a "
        "second at load 5–8; the load stretches it). A cut host says nothing (`--min-tasks 2`): the time is nearly "
        "all the SSH watch's detection "
        "(`watch.SILENT_AFTER` 5 s of silence, then its sshd port probed for up to 4 s, issue 20), then the resized "
        "attempt starts on the two hosts that answer (no probe waits on the cut host: it is already known lost). The "
        "elastic run goes on where a fixed-size run would have ended (`no restart on a host known lost`).",
        "**Steps lost** (trained twice) in the top table are the steps since the last backup, so below B, on average "
        "half of it; they do not depend on the resize. This job has no all-reduce to stall on, so its chief steps on "
        "until the loss is known. A host taken *back* loses none: it joins at the step the group agreed on and saved "
        "at the notice (tests/test_elastic_bed.py).",
    ]
    if runs.steps:
        intervals = ", ".join(map(str, runs.steps))
        notes += [
            f"Second table: real TensorFlow, `--min-tasks 2`, bench/jobs/paced.py (a 16-16-2 Keras model on synthetic "
            f"data, every task sleeping 0.05 s a step, the chief logging each step it trains) with the kit's "
            f"`--backup-every-steps B` (B = {intervals}) and `--steps-per-execution 1`. The third host is cut at a "
            "random step between B + 5 and 2B + 5, so the cut falls anywhere in a backup interval. Steps lost = the "
            "last step the chief trained before the cut (the all-reduce stalls at the cut: no step is trained past it) "
            "minus the step the resized attempt resumes from (the last backup). The figures are step counts, not "
            "times, so the machine's load does not change them.",
            "The kit backs up every B global steps and the resized attempt resumes exactly at the last backup, so a "
            "trial loses at most B steps: 0 when the cut comes right after a backup, B − 1 just before one, about B/2 "
            "on average; the resize itself adds none. A host taken *back* loses none with real TensorFlow either: the "
            "group saves at the agreed step and the three-task attempt resumes right after it, every planned step "
            "trained once (tests/test_elastic_tf.py, `…taken_back_at_the_agreed_step…`).",
        ]
    if not cfg.quick:
        notes.append("Hand-run before this was a phase (2026-11-25, load 5–8): TF-free, 3 repetitions: restart 1.2 s "
                     "(0.9–1.9), elastic B=5 10.1 s (9.6–12.0), B=20 12.5 s (9.6–13.5), steps redone 1, 1 and 15; real "
                     "TensorFlow, steps lost B=5: 0, 0, 2; B=20: 5, 13, 15; B=50: 2, 23, 49, and in an earlier run "
                     "B=5: 1, 4; B=20: 4, 12; B=50: 0, 23.")
    return notes
