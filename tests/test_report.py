"""Rendering: progress bars, the live watch, the tables."""

from __future__ import annotations

import io
from pathlib import Path

from launcher.describe.spec import parse_cluster
from launcher.plan.build import build_plan
from launcher.records.states import RunState
from launcher.records.store import FailureRecord, RunRecord
from launcher.views.report import progress_text, run_detail, runs_table, summary, watch_run
from launcher.views.status import RunView, TaskView


def view(state: str, step: int) -> RunView:
    task = TaskView(task="chief:0", host="127.0.0.1", state="running", attempt=1, pid=42, alive=True, cpu_percent=50.0,
                    rss_mb=300.0, uptime_s=65, exit_code=None,
                    progress={"epoch": 2, "epochs": 4, "step": step, "steps_per_epoch": 10, "loss": 0.25, "examples_per_sec": 900.0})
    return RunView(run_id="r1", job="/x/mnist.py", state=state, alive=1, total=1, started=0.0, duration_s=3700, restarts=1,
                   restart_reasons=["worker:0 on h: killed by SIGKILL"], message=None, tasks=[task])


def test_progress_text_and_bar() -> None:
    assert progress_text({"epoch": 2, "epochs": 4, "step": 5, "steps_per_epoch": 10, "loss": 0.5}) == "epoch 2/4 step 5/10 loss 0.5000"
    assert progress_text({"epoch": 2, "epochs": 4, "step": 5, "steps_per_epoch": 10}, bar_width=8).startswith("[###.....]  38%")
    assert progress_text(None) is None


def test_a_done_task_and_an_evaluated_epoch_are_whole() -> None:
    """The evaluator's record (and a finished run's again) says epoch 4/4 with no steps: its bar
    showed 75% beside `done epoch 4/4`."""
    done = {"phase": "done", "epoch": 4, "epochs": 4, "step": 0, "steps_per_epoch": None, "loss": 0.39}
    assert progress_text(done, bar_width=4) == "[####] 100% done epoch 4/4 loss 0.3900"
    evaluated = {"phase": "eval", "epoch": 1, "epochs": 4, "step": 0, "steps_per_epoch": None}
    assert progress_text(evaluated, bar_width=4) == "[#...]  25% epoch 1/4"


def test_run_detail_shows_restart_reasons_and_progress() -> None:
    text = run_detail(view("running", 5))
    assert "restart 1: worker:0 on h: killed by SIGKILL" in text
    assert "1h01m40s" in text and "epoch 2/4 step 5/10 loss 0.2500 900 ex/s" in text


def test_watch_redraws_until_the_run_ends() -> None:
    views = iter([view("running", 2), view("running", 6), view("succeeded", 10)])
    out = io.StringIO()
    watch_run(lambda: next(views), out, interval=0)
    frames = out.getvalue().split("\033[H\033[2J")[1:]
    assert len(frames) == 3 and "step 6/10" in frames[1] and frames[2].splitlines()[0].startswith("run r1  succeeded")


def test_runs_table() -> None:
    lines = runs_table([view("lost", 1)]).splitlines()
    assert lines[0].split() == ["RUN", "JOB", "STATE", "ALIVE", "STARTED", "DURATION"]
    assert lines[1].split()[:4] == ["r1", "mnist.py", "lost", "1/1"]


def test_a_failure_whose_pid_was_never_known_names_no_pid() -> None:
    """A Slurm evaluator step ended (its allocation revoked) before its driver noted its pid: the summary
    said "evaluator:0 on n1 (pid None) exit code 143"."""
    record = RunRecord(run_id="r", job="job.py", job_args=[], run_dir="/runs/r", created=0.0, ended=5.0,
                       state=RunState.FAILED, message="worker:0 on n2 failed: exit code 3",
                       failures=[FailureRecord("worker:0", "n2", 12, 3, "exit code 3", ["boom"], 1.0, 0),
                                 FailureRecord("evaluator:0", "n1", None, 143, "exit code 143", [], 2.0, 0)])
    lines = summary(record).splitlines()
    assert "  root cause: worker:0 on n2 (pid 12) exit code 3; last lines of its log:" in lines
    # Its log was empty: no "last lines of its log:" heading over nothing.
    assert lines[lines.index("  evaluator: evaluator:0 on n1 exit code 143; its log holds nothing") + 1].startswith("  logs: ")


def test_the_resume_hint_promises_a_checkpoint_only_where_there_is_one(tmp_path: Path) -> None:
    """A stopped or failed run whose job kept no checkpoint was told "resume it from its last
    checkpoint": `tfl resume` then starts it over. Its model dir here says which it is."""
    run_dir = tmp_path / "r1"
    plan = build_plan(parse_cluster({"cluster": {"chief": ["localhost:1000"], "worker": ["localhost:1001"]}}), "/j.py", (),
                      run_id="r1", run_dir=str(run_dir), python="/py", cwd="/c")

    def hint(state: RunState) -> str:
        return summary(RunRecord(run_id="r1", job="/j.py", job_args=[], run_dir=str(run_dir), created=1.0, state=state,
                                 plan=plan.to_dict())).splitlines()[-1]

    model = run_dir / "model"
    assert hint(RunState.STOPPED) == f"  resume it: tfl resume r1 (the job kept no checkpoint in its model dir {model}: it starts over)"
    (model / "checkpoints").mkdir(parents=True)  # made, but nothing saved in it yet
    assert hint(RunState.FAILED).startswith("  resume it (once its cause is fixed): tfl resume r1 (the job kept no checkpoint")
    assert "kept no checkpoint" in hint(RunState.PREEMPTED)  # exit 170 said it saved one, but nothing is left here
    (model / "checkpoints" / "ckpt-1.index").write_text("")
    assert hint(RunState.STOPPED) == "  resume it from its last checkpoint: tfl resume r1"


def test_a_preempted_run_promises_its_checkpoint_only_while_its_model_dir_holds_it(tmp_path: Path) -> None:
    """A preempted run whose model dir was removed since was told "resume it from its last checkpoint",
    and `tfl resume` gave no "starts over" note: a preempted run was taken to have one, unlooked."""
    from launcher.runs.resume import starts_over

    run_dir = tmp_path / "r1"
    plan = build_plan(parse_cluster({"cluster": {"chief": ["localhost:1000"]}}), "/j.py", (), run_id="r1",
                      run_dir=str(run_dir), python="/py", cwd="/c")
    record = RunRecord(run_id="r1", job="/j.py", job_args=[], run_dir=str(run_dir), created=1.0,
                       state=RunState.PREEMPTED, plan=plan.to_dict())
    model = run_dir / "model"
    assert summary(record).splitlines()[-1] == (f"  resume it: tfl resume r1 (the job kept no checkpoint in its model "
                                                f"dir {model}: it starts over)")
    assert starts_over(record) == (f"tfl: note: run r1's model dir {model} holds no checkpoint or backup: the job "
                                   "starts over from step 0")
    (model / "tensorboard" / "train").mkdir(parents=True)
    (model / "tensorboard" / "train" / "x.index").write_text("")  # summaries are no checkpoint
    assert starts_over(record) is not None
    (model / "preemption").mkdir()  # where a custom loop's preemption_handler saves (jobs/custom_loop.py)
    (model / "preemption" / "ckpt-1.index").write_text("")
    assert summary(record).splitlines()[-1] == "  resume it from its last checkpoint: tfl resume r1"
    assert starts_over(record) is None
    (model / "preemption" / "ckpt-1.index").unlink()
    (model / "preempted.json").write_text("{}")  # the kit's record of the agreed save
    assert summary(record).splitlines()[-1] == "  resume it from its last checkpoint: tfl resume r1"


def test_a_cluster_runs_model_dir_not_seen_here_is_not_called_empty(tmp_path: Path) -> None:
    """A Slurm, Ray or SSH run's model dir on the cluster's storage need not be mounted where `tfl`
    runs: not seeing it here is no proof that the job kept nothing, so no "starts over" is said."""
    from launcher.runs.resume import starts_over
    from launcher.views.report import kept_checkpoint

    run_dir = tmp_path / "r1"
    plan = build_plan(parse_cluster({"cluster": {"chief": ["localhost:1000"]}}), "/j.py", (), run_id="r1",
                      run_dir=str(run_dir), python="/py", cwd="/c")
    for backend, expected in (("slurm", None), ("ray", None), ("local", False)):
        record = RunRecord(run_id="r1", job="/j.py", job_args=[], run_dir=str(run_dir), created=1.0,
                           state=RunState.PREEMPTED, plan=plan.to_dict(), backend=backend)
        assert kept_checkpoint(record) is expected, backend
        assert (starts_over(record) is None) is (expected is None), backend


def test_progress_text_says_a_replay_and_a_task_that_left_unsaved() -> None:
    """During a replay `tfl status` showed only the resume position, as if training; a task that left
    before training showed its last record as if it had trained on."""
    replay = {"phase": "replay", "global_step": 40300, "epoch": 3, "epochs": 4, "step": 6, "steps_per_epoch": 12}
    assert progress_text(replay) == "replaying 40300 batches to the resume step epoch 3/4 step 6/12"
    left = {"phase": "left-unsaved", "global_step": 40, "epoch": 2, "epochs": 4}
    assert progress_text(left) == "left without saving epoch 2/4"
