"""9. Chaos: trials that each SIGKILL one random task at a random moment of a real run.

A trial is ``tfl launch JOB --local 2 --evaluator --max-restarts 2``; its victim is the
chief, the worker or the evaluator, and its moment is start-up (a random delay after the
victim's process appears: TensorFlow importing, the group forming), training (once the
chief has done a random number of steps) or teardown (a random delay after the chief's
last step: the end of ``fit``, the done marker, the tasks leaving together, the evaluator's
last evaluation). Every trial must end with:

- the run succeeded (exit 0), with one restart when a training task was killed and none
  when the evaluator was (its failure is recorded, training goes on);
- resumed: when the kill came after a backup, the restarted group redid no step up to that
  backup (every step the restarted chief reports lies beyond it);
- no process of the run left once the launcher has returned.

The test suite runs a few trials (tests/test_e2e_tf.py); ``python -m bench`` runs 20.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.common import BenchError, Section, Workspace, tfl_command
from bench.config import Config
from tests.procs import tfl_processes

VICTIMS = ("chief:0", "worker:0", "evaluator:0")
MOMENTS = ("start-up", "training", "teardown")


@dataclass(frozen=True)
class ChaosJob:
    """The job every trial runs, and how long its start-up and teardown last (for the moments)."""

    script: Path
    epochs: int
    steps_per_epoch: int
    backup_every: int
    startup_s: float  # kill within this long after the victim's process appears
    teardown_s: float  # kill within this long after the chief's last step
    extra_args: tuple[str, ...] = ()

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def args(self) -> list[str]:
        return ["--epochs", str(self.epochs), "--steps-per-epoch", str(self.steps_per_epoch),
                "--backup-every-steps", str(self.backup_every), *self.extra_args]


@dataclass
class Trial:
    number: int
    victim: str
    moment: str
    at: float  # start-up/teardown: seconds after the trigger; training: the chief's step
    killed: bool = False  # the SIGKILL found the victim alive
    exit_code: int | None = None
    restarts: int = 0
    steps_before_kill: int = 0  # the chief's last step before the kill
    last_backup: int = 0  # the last backup before the kill (0: none yet)
    redone_from: int | None = None  # the first step the restarted chief reported
    left: int = 0  # processes of the run alive after the launcher returned
    took_s: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def plan_trials(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """``n`` (victim, moment) pairs: every pair in turn, shuffled, so that a few trials
    already cover every victim and every moment; the draw is random, the coverage is not."""
    pairs = [(v, m) for v in VICTIMS for m in MOMENTS]
    planned: list[tuple[str, str]] = []
    while len(planned) < n:
        rng.shuffle(pairs)
        planned += pairs
    return planned[:n]


def run_trial(number: int, victim: str, moment: str, job: ChaosJob, home: Path, env: dict[str, str],
              rng: random.Random, timeout: float = 900.0) -> Trial:
    at = rng.uniform(0, job.startup_s) if moment == "start-up" else (
        rng.randint(1, job.total_steps - 1) if moment == "training" else rng.uniform(0, job.teardown_s))
    trial = Trial(number, victim, moment, round(at, 2))
    progress = home / "progress.jsonl"
    started = time.monotonic()
    with open(home / "launcher.log", "wb") as log:
        launcher = subprocess.Popen(
            [*tfl_command(), "launch", str(job.script), "--local", "2", "--evaluator", "--max-restarts", "2",
             "--grace-period", "5", "--", *job.args()],
            env={**env, "TFL_PROGRESS_LOG": str(progress)}, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            _strike(trial, home, progress, job, launcher, timeout)
            trial.exit_code = launcher.wait(max(1.0, timeout - (time.monotonic() - started)))
        except (subprocess.TimeoutExpired, BenchError) as exc:
            trial.problems.append(f"{type(exc).__name__}: {exc}")
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
    trial.took_s = round(time.monotonic() - started, 1)
    trial.left = len(tfl_processes(home=str(home)))
    if not trial.problems:
        _judge(trial, home, progress, job)
    elif trial.left:
        trial.problems.append(f"{trial.left} process(es) of the run left alive")
    return trial


def _strike(trial: Trial, home: Path, progress: Path, job: ChaosJob, launcher: subprocess.Popen[bytes],
            timeout: float) -> None:
    """Wait for the trial's moment, then SIGKILL its victim (if it is still there)."""
    deadline = time.monotonic() + timeout

    def until(ready: Any, what: str) -> None:
        while not ready():
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the run ended (or timed out) before {what}")
            time.sleep(0.01)

    if trial.moment == "start-up":
        until(lambda: _victim(home, trial.victim) is not None, f"{trial.victim} started")
        time.sleep(trial.at)
    elif trial.moment == "training":
        until(lambda: max(_chief_steps(progress, 0), default=0) >= trial.at, f"the chief reached step {trial.at:g}")
    else:
        until(lambda: max(_chief_steps(progress, 0), default=0) >= job.total_steps, "the chief's last step")
        time.sleep(trial.at)
    trial.steps_before_kill = max(_chief_steps(progress, 0), default=0)
    victim = _victim(home, trial.victim)
    if victim is not None:
        try:
            victim.kill()
            trial.killed = True
        except psutil.Error:
            pass


def _judge(trial: Trial, home: Path, progress: Path, job: ChaosJob) -> None:
    states = list(home.glob("runs/*/state.json"))
    if len(states) != 1:
        trial.problems.append(f"expected one run record, found {len(states)}")
        return
    state = states[0]
    record = json.loads(state.read_text())
    trial.restarts = len(record["restarts"])
    died = any(f["task"] == trial.victim and f["attempt"] == 0 and f["exit_code"] == -9 for f in record["failures"])
    training = not trial.victim.startswith("evaluator")
    problems = trial.problems
    if trial.exit_code != 0 or record["state"] != "succeeded":
        problems.append(f"the run ended {record['state']} (exit {trial.exit_code}): {record['message']}")
    done = state.parent / "model" / "training_done.json"
    if not done.exists():
        problems.append("no done marker: training never completed")
    expected = 1 if died and training else 0
    if trial.restarts != expected:
        problems.append(f"{trial.restarts} restart(s), expected {expected} ({trial.victim} {'died' if died else 'was not killed'})")
    trial.last_backup = trial.steps_before_kill // job.backup_every * job.backup_every
    after = [s for a in range(1, trial.restarts + 1) for s in _chief_steps(progress, a)]
    trial.redone_from = min(after) if after else None
    if died and training and trial.last_backup and after and min(after) <= trial.last_backup:
        problems.append(f"not resumed: killed after the backup at step {trial.last_backup}, the restarted chief "
                        f"reported step {min(after)} again")
    if trial.left:
        problems.append(f"{trial.left} process(es) of the run left alive after the launcher returned")


def _victim(home: Path, task: str) -> psutil.Process | None:
    for proc in tfl_processes(home=str(home)):
        try:
            env = proc.environ()
        except psutil.Error:
            continue
        if env.get("TFL_TASK") == task and env.get("TFL_ATTEMPT") == "0":
            return proc
    return None


def _chief_steps(progress: Path, attempt: int) -> list[int]:
    try:
        lines = progress.read_text().splitlines()
    except OSError:
        return []
    steps = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # being written
        if record.get("task") == "chief:0" and record.get("phase") == "train" and record.get("attempt") == attempt:
            steps.append(int(record["global_step"]))
    return steps


# --- the benchmark section ---------------------------------------------------------------------
def chaos_job(cfg: Config, data: Path | None) -> ChaosJob:
    if cfg.uses_mnist:
        return ChaosJob(cfg.train_job, epochs=2, steps_per_epoch=10, backup_every=3, startup_s=8.0, teardown_s=0.5,
                        extra_args=("--batch-size", "32", *(["--data", str(data)] if data else [])))
    return ChaosJob(cfg.train_job, epochs=2, steps_per_epoch=10, backup_every=3, startup_s=0.3, teardown_s=0.1)


def chaos_trials(cfg: Config, ws: Workspace, data: Path | None, seed: int | None = None) -> tuple[list[Trial], int]:
    seed = random.randrange(2**32) if seed is None else seed
    rng, job = random.Random(seed), chaos_job(cfg, data)
    trials = []
    for number, (victim, moment) in enumerate(plan_trials(cfg.chaos_trials, rng), 1):
        home = ws.home(f"chaos-{number}")
        trials.append(run_trial(number, victim, moment, job, home, ws.env(home), rng))
    return trials, seed


def chaos_section(cfg: Config, trials: list[Trial], seed: int) -> Section:
    passed = sum(t.ok for t in trials)
    rows = []
    for victim in VICTIMS:
        for moment in MOMENTS:
            mine = [t for t in trials if t.victim == victim and t.moment == moment]
            if mine:
                rows.append([victim, moment, f"{sum(t.ok for t in mine)}/{len(mine)}", str(sum(t.killed for t in mine)),
                             ", ".join(str(t.restarts) for t in mine), f"{max(t.took_s for t in mine):.0f} s"])
    failed = [f"trial {t.number} ({t.victim}, {t.moment} at {t.at:g}): {'; '.join(t.problems)}" for t in trials if not t.ok]
    resumed = [t for t in trials if t.restarts and t.last_backup]
    return Section(
        9, "Chaos", f"{len(trials)} trials, each ending in success after restarts, resumed after a backup, no process left",
        ["victim", "moment", "succeeded", "killed alive", "restarts", "longest trial"], rows,
        "met" if passed == len(trials) else "missed",
        notes=[f"`tfl launch {cfg.train_job.name} --local 2 --evaluator --max-restarts 2 -- "
               f"{' '.join(chaos_job(cfg, None).args())}`; one SIGKILL per trial (bench/chaos.py, seed {seed}).",
               "Moments: start-up = up to the given delay after the victim's process appears; training = once the chief "
               "has done a random number of steps; teardown = up to the given delay after the chief's last step. A "
               "victim already gone at its moment is not killed (\"killed alive\" counts the others).",
               f"Restarted after a backup in {len(resumed)} trial(s); the restarted chief's first step, with the last "
               "backup before the kill in brackets: " + ", ".join(
                   f"{t.redone_from or 'none (training was done)'} ({t.last_backup})" for t in resumed) + "."
               if resumed else "",
               *failed],
        raw={"seed": seed, "trials": [asdict(t) for t in trials]},
        headline=f"{passed}/{len(trials)} trials succeeded")
