"""Preemption on Slurm without a cluster: the slurm block's options, the sbatch lines, the
batch script's policy run by bash against fake Slurm commands, and how the backend reads a
preempted step. (On the private cluster: tests/test_slurm_preempt_runs.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.contract import PREEMPTED_EXIT_CODE
from launcher.engines.slurm.node.batch import RunFiles, parse_events
from launcher.engines.slurm.outcome import PREEMPTED, Outcome, preempted_step, preemption_counts, training_outcome
from launcher.engines.slurm.script import BatchJob, render_batch_script, sbatch_header
from launcher.engines.slurm.settings import parse_slurm_cluster
from launcher.errors import ClusterFileError
from tests.test_slurm_script import batch, events, fake_slurm, kill_script

PREEMPTED_LINES = ("srun: error: n1: task 0: Exited with exit code 170\n"
                   "srun: error: n2: task 1: Exited with exit code 170\n")
# The training step: on SIGTERM (the notice, passed on by the script) it says what srun says of
# tasks that saved and left, and exits 170; PREEMPT_ATTEMPTS: the attempts that get preempted.
# The evaluator's step is FAKE_SRUN's: had it written training.pid too, an evaluator started just
# after the training step would have taken the pid the notice goes to (CI saw it once).
PREEMPTIBLE_SRUN = """#!/bin/bash
echo "${TFL_ATTEMPT:-} $*" >> "$FAKE/calls"
case "$*" in
  *--job-name=evaluator.*) echo $$ > "$FAKE/evaluator.pid"; [ -n "${EVALUATOR_EXIT:-}" ] && exit "$EVALUATOR_EXIT"; exec sleep 300 ;;
esac
echo $$ > "$FAKE/training.pid"
case " ${PREEMPT_ATTEMPTS:-} " in
  *" $TFL_ATTEMPT "*)
    trap 'kill $!; printf "%s" "$LINES" >&2; exit ${STEP_EXIT:-170}' TERM
    touch "$FAKE/waiting.$TFL_ATTEMPT"
    sleep 300 & wait ;;
esac
exit 0
"""


def preemptible(tmp_path: Path, **env: str) -> dict[str, str]:
    environ = fake_slurm(tmp_path, **env)
    (tmp_path / "bin" / "srun").write_text(PREEMPTIBLE_SRUN)
    return {**environ, "LINES": env.get("LINES", PREEMPTED_LINES)}


def start_script(tmp_path: Path, b: BatchJob, env: dict[str, str]) -> subprocess.Popen[str]:
    b = BatchJob(**{**b.__dict__, "python": str(tmp_path / "bin" / "python"), "cwd": str(tmp_path)})
    return subprocess.Popen(["bash", "-c", render_batch_script(b)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def notice_when_waiting(tmp_path: Path, script: subprocess.Popen[str], attempt: int) -> None:
    """SIGTERM to the script (what --signal=B:TERM@N and scancel --signal=TERM --batch do) once
    ``attempt``'s training step waits for it."""
    deadline = time.monotonic() + 60
    while not (tmp_path / f"waiting.{attempt}").exists():
        assert time.monotonic() < deadline and script.poll() is None, kill_script(script)
        time.sleep(0.05)
    script.send_signal(signal.SIGTERM)


def finish(script: subprocess.Popen[str]) -> str:
    try:
        _, err = script.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # the whole group: a fake step's sleep holds the pipes open
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
        script.communicate()
        raise
    return err


# --- the slurm block ------------------------------------------------------------------

def test_notice_and_requeue_reach_the_header() -> None:
    header = sbatch_header(batch(preemption_notice=120, requeue=True))
    assert "#SBATCH --signal=B:TERM@120" in header and "#SBATCH --requeue" in header and "#SBATCH --no-requeue" not in header
    plain = sbatch_header(batch())
    assert "#SBATCH --no-requeue" in plain and not any("--signal" in line for line in plain)
    assert sbatch_header(batch(allocation=True, preemption_notice=60)) == []  # the allocation is the user's


@pytest.mark.parametrize(("slurm", "message"), [
    ({"preemption_notice": 0}, "slurm.preemption_notice: 0 is out of range; it must be from 1 to 65535"),
    ({"preemption_notice": "90"}, "slurm.preemption_notice: '90' is not a whole number"),
    ({"preemption_notice": 70000}, "slurm.preemption_notice: 70000 is out of range"),
    ({"requeue": "yes"}, "slurm.requeue: 'yes' is not true or false"),
    ({"sbatch_args": ["--signal=B:USR1@60"]}, "tfl sets --signal itself; use slurm.preemption_notice instead"),
    ({"sbatch_args": ["--requeue"]}, "tfl sets --requeue itself; use slurm.requeue instead"),
])
def test_bad_options_are_one_line_naming_the_field(slurm: dict[str, object], message: str) -> None:
    with pytest.raises(ClusterFileError) as caught:
        parse_slurm_cluster({"slurm": {"nodes": 2, **slurm}}, "c.json")
    text = str(caught.value)
    assert message in text and "\n" not in text and text.startswith("c.json: ")


# --- the script's policy, against fake Slurm commands -----------------------------------

def test_notice_goes_to_the_training_step_and_the_group_restarts_without_counting(tmp_path: Path) -> None:
    script = start_script(tmp_path, batch(str(tmp_path), restarts=0, evaluator=True, evaluator_timeout=0.2),
                          preemptible(tmp_path, PREEMPT_ATTEMPTS="0", EVALUATOR_EXIT="0"))
    notice_when_waiting(tmp_path, script, 0)
    err = finish(script)
    assert script.returncode == 0, err  # --max-restarts 0, and still it ends well
    assert "--signal=TERM 7.0" in (tmp_path / "scancel").read_text().splitlines()  # the training step's tasks
    assert "--signal=TERM 7.1" not in (tmp_path / "scancel").read_text()  # not the evaluator's
    training = [e for e in events(tmp_path) if e.startswith("training")]
    assert training == ["training 0 start", "training 0 exit 170", "training 1 start", "training 1 exit 0"]
    assert "tfl: training preempted; restart without counting (1 of at most 100 preemptions)" in err


def test_preemptions_have_their_own_cap(tmp_path: Path) -> None:
    b = BatchJob(**{**batch(str(tmp_path), restarts=5).__dict__, "max_preemptions": 1})
    script = start_script(tmp_path, b, preemptible(tmp_path, PREEMPT_ATTEMPTS="0 1"))
    notice_when_waiting(tmp_path, script, 0)
    notice_when_waiting(tmp_path, script, 1)
    err = finish(script)
    assert script.returncode == PREEMPTED_EXIT_CODE, err
    assert "tfl: training preempted 2 times, more than --max-preemptions 1" in err
    assert events(tmp_path)[-2:] == ["training 1 exit 170", "end 170"]


def test_a_real_failure_before_the_170s_counts_as_a_failure(tmp_path: Path) -> None:
    lines = "srun: error: n2: task 1: Exited with exit code 3\nsrun: error: n1: task 0: Exited with exit code 170\n"
    script = start_script(tmp_path, batch(str(tmp_path), restarts=0), preemptible(tmp_path, PREEMPT_ATTEMPTS="0", LINES=lines))
    notice_when_waiting(tmp_path, script, 0)
    err = finish(script)
    assert script.returncode == 170 and "training 1 start" not in events(tmp_path), err  # no restart left
    assert not preempted_step(170, lines) and preempted_step(170, PREEMPTED_LINES) and not preempted_step(143, PREEMPTED_LINES)


@pytest.mark.parametrize(("first", "preempted"), [("srun: error: n2: task 1: Exited with exit code 170\n", True),
                                                   ("srun: error: n2: task 1: Exited with exit code 3\n", False)])
def test_a_step_that_srun_ends_143_after_its_first_task_saved_and_left_was_preempted(
        tmp_path: Path, first: str, preempted: bool) -> None:
    """Under load Slurm's SIGTERM may reach one task late: the other saved and left first, and srun's
    --kill-on-bad-exit then ended the late one in its handler. srun says 143, the step was preempted."""
    lines = (first + "srun: launch/slurm: _step_signal: Terminating StepId=7.0\n"
             "srun: error: n1: task 0: Terminated\nsrun: Force Terminated StepId=7.0\n")
    script = start_script(tmp_path, batch(str(tmp_path), restarts=0),
                          preemptible(tmp_path, PREEMPT_ATTEMPTS="0", LINES=lines, STEP_EXIT="143"))
    notice_when_waiting(tmp_path, script, 0)
    err = finish(script)
    training = [e for e in events(tmp_path) if e.startswith("training")]
    if preempted:  # --max-restarts 0: only a preemption restarts
        assert script.returncode == 0, err
        assert training == ["training 0 start", "training 0 exit 170", "training 1 start", "training 1 exit 0"]
        assert "tfl: training preempted; restart without counting (1 of at most 100 preemptions)" in err
    else:
        assert script.returncode == 143 and training == ["training 0 start", "training 0 exit 143"], err


def test_no_restart_once_slurm_ends_the_job(tmp_path: Path) -> None:
    script = start_script(tmp_path, batch(str(tmp_path)), preemptible(tmp_path, PREEMPT_ATTEMPTS="0", JOB_STATE="COMPLETING"))
    notice_when_waiting(tmp_path, script, 0)
    err = finish(script)
    assert script.returncode == 170 and "training 1 start" not in events(tmp_path), err


def test_slurm_preempting_without_requeue_ends_the_script(tmp_path: Path) -> None:
    script = start_script(tmp_path, batch(str(tmp_path)),
                          preemptible(tmp_path, PREEMPT_ATTEMPTS="0", PREEMPT_TIME="2026-11-25T01:15:14"))
    notice_when_waiting(tmp_path, script, 0)  # Slurm's own SIGTERM reaches the tasks the same way
    err = finish(script)
    assert script.returncode == 170 and "training 1 start" not in events(tmp_path), err
    assert 'tfl: Slurm preempts job 7 (not requeued: the slurm block has no "requeue": true)' in err


def test_slurm_preempting_with_requeue_waits_for_slurm(tmp_path: Path) -> None:
    script = start_script(tmp_path, batch(str(tmp_path), requeue=True),
                          preemptible(tmp_path, PREEMPT_ATTEMPTS="0", PREEMPT_TIME="2026-11-25T01:15:14"))
    try:  # the script waits for Slurm forever (`while :; do sleep 1; done`): ended here, passed or not
        notice_when_waiting(tmp_path, script, 0)
        deadline = time.monotonic() + 30
        while "training 0 exit 170" not in (events(tmp_path) if Path(RunFiles(str(tmp_path)).events).exists() else []):
            assert time.monotonic() < deadline and script.poll() is None
            time.sleep(0.05)
        time.sleep(1.5)
        assert script.poll() is None  # waits for Slurm to end it (GraceTime), then to requeue the job
        assert "training 1 start" not in events(tmp_path) and "end" not in " ".join(events(tmp_path))
    finally:
        _, err = kill_script(script)
    assert "tfl: Slurm preempts job 7; it will be requeued and go on from the checkpoint" in err


def test_a_requeued_job_goes_on_with_the_next_attempt(tmp_path: Path) -> None:
    env = preemptible(tmp_path, SLURM_RESTART_COUNT="1")
    Path(RunFiles(str(tmp_path)).events).write_text("training 0 start\ntraining 0 exit 170\n")
    script = start_script(tmp_path, BatchJob(**{**batch(str(tmp_path), requeue=True).__dict__, "max_preemptions": 1}), env)
    err = finish(script)
    assert script.returncode == 0, err
    assert events(tmp_path) == ["training 0 start", "training 0 exit 170", "requeued 1", "training 1 start",
                                "training 1 exit 0", "end 0"]
    assert (tmp_path / "calls").read_text().split()[0] == "1"  # TFL_ATTEMPT=1: the job kit resumes as attempt 1
    assert parse_events("\n".join(events(tmp_path)) + "\n").requeued == 1


# --- the backend's reading ---------------------------------------------------------------

def test_every_task_that_saved_reports_preempted() -> None:
    evs = parse_events("training 0 start\ntraining 0 exit 170\n")
    outcomes = [training_outcome(rank, 0, evs, PREEMPTED_LINES, None, {}, job_id="7") for rank in (0, 1)]
    assert outcomes == [Outcome(170, PREEMPTED)] * 2 and "preempted" in PREEMPTED
    mixed = "srun: error: n1: task 0: Exited with exit code 170\nsrun: error: n2: task 1: Terminated\n"
    assert [training_outcome(r, 0, evs, mixed, None, {}, job_id="7") for r in (0, 1)] == [Outcome(170, PREEMPTED), None]


def test_preemptions_and_failures_are_counted_apart() -> None:
    evs = parse_events("training 0 start\ntraining 0 exit 170\ntraining 1 start\ntraining 1 exit 143\n"
                       "training 2 start\ntraining 2 exit 170\ntraining 3 start\n")
    errs = {0: PREEMPTED_LINES, 1: "srun: error: n2: task 1: Exited with exit code 3\n", 2: PREEMPTED_LINES}
    assert preemption_counts(evs, lambda a: errs.get(a, ""), 2) == (2, 1)
    assert preemption_counts(evs, lambda a: errs.get(a, ""), 0) == (1, 0)
    assert json.dumps(PREEMPTED)  # one line for the record


def test_a_resumed_job_begins_at_the_next_attempt_and_counts_from_there(tmp_path: Path) -> None:
    """``tfl resume``: the backend writes the first attempt and moves the last job's events aside."""
    env = preemptible(tmp_path)
    Path(RunFiles(str(tmp_path)).first_attempt).write_text("3\n")
    Path(RunFiles(str(tmp_path)).events).write_text("training 3 start\n")  # e.g. a requeue of the resumed job
    err = finish(start_script(tmp_path, batch(str(tmp_path)), env))
    assert events(tmp_path)[-3:] == ["training 4 start", "training 4 exit 0", "end 0"], err
    Path(RunFiles(str(tmp_path)).events).unlink()
    (tmp_path / "calls").unlink()
    script = start_script(tmp_path, batch(str(tmp_path), restarts=0), {**env, "PREEMPT_ATTEMPTS": "3"})
    notice_when_waiting(tmp_path, script, 3)
    err = finish(script)
    assert script.returncode == 0 and events(tmp_path) == [
        "training 3 start", "training 3 exit 170", "training 4 start", "training 4 exit 0", "end 0"], err
    assert [line.split()[0] for line in (tmp_path / "calls").read_text().splitlines()] == ["3", "4"]  # TFL_ATTEMPT


@pytest.mark.parametrize(("left", "restarted"), [("UNLIMITED", True), ("1-00:00:00", True), ("10:00", True),
                                                  ("2:59", False), ("45", False), ("0:01:30", False)])
def test_a_notice_near_the_time_limit_ends_the_run_preempted(tmp_path: Path, left: str, restarted: bool) -> None:
    """preemption_notice 120: after a notice with at most 120 + 60 s left, no restart."""
    script = start_script(tmp_path, batch(str(tmp_path), preemption_notice=120),
                          preemptible(tmp_path, PREEMPT_ATTEMPTS="0", TIME_LEFT=left))
    notice_when_waiting(tmp_path, script, 0)
    err = finish(script)
    assert ("training 1 start" in events(tmp_path)) is restarted, err
    assert script.returncode == (0 if restarted else PREEMPTED_EXIT_CODE)
    if not restarted:
        assert "before the time limit: too little to restart; tfl resume continues the run" in err
