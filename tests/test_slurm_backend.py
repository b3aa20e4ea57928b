"""The Slurm backend without a cluster: each task's outcome from the script's events and
srun's stderr, the one-line errors, prepare/start/restarted against fake Slurm commands,
and the CLI's plan, validate and dry-run of a slurm description."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.describe.kinds import load_description
from launcher.describe.spec import load_cluster
from launcher.engines.registry import get, name_for_plan
from launcher.engines.slurm.backend import SlurmBackend
from launcher.engines.slurm.job import JobRef, SlurmJob, sbatch_message
from launcher.engines.slurm.jobstate import CommandResult
from launcher.engines.slurm.node.batch import RunFiles, SlurmJobPlan, StepEvents
from launcher.engines.slurm.node.errors import SlurmError
from launcher.engines.slurm.outcome import (
    JobEnd,
    Outcome,
    cancellation,
    describe_end,
    evaluator_alive,
    evaluator_outcome,
    job_cancellation,
    training_alive,
    training_outcome,
)
from launcher.engines.slurm.settings import allocation_cluster, parse_slurm_cluster
from launcher.errors import ClusterFileError, LaunchError, UsageError
from launcher.plan.build import build_plan
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.run_options import SupervisorConfig
from launcher.records.loader import load
from launcher.records.store import FailureRecord
from launcher.runs import launch
from launcher.supervise.recording import failure_said

runner = CliRunner()
KILL_ON_BAD_EXIT = ("srun: error: n2: task 1: Exited with exit code 3\n"
                    "srun: launch/slurm: _step_signal: Terminating StepId=2.0\n"
                    "srun: error: n1: task 0: Terminated\n")
EXITED_143 = StepEvents(started=(0,), exits={0: 143})


# --- outcomes ---------------------------------------------------------------------------

def test_the_task_that_ended_the_step_fails_the_others_were_stopped() -> None:
    worker = training_outcome(1, 0, EXITED_143, KILL_ON_BAD_EXIT, None, {}, job_id="7")
    chief = training_outcome(0, 0, EXITED_143, KILL_ON_BAD_EXIT, None, {}, job_id="7")
    assert worker == Outcome(3) and chief is None
    assert not training_alive(0, EXITED_143, None)


def test_killed_task_reports_its_signal() -> None:
    err = "srun: error: n2: task 1: Killed\nsrun: error: n1: task 0: Terminated\n"
    assert training_outcome(1, 0, StepEvents((0,), {0: 137}), err, None, {}, job_id="7") == Outcome(-signal.SIGKILL)
    assert training_outcome(0, 0, StepEvents((0,), {0: 137}), err, None, {}, job_id="7") is None


def test_a_step_that_failed_without_naming_a_task_fails_the_chief() -> None:
    err = "srun: error: Unable to create step for job 7: Requested node configuration is not available\n"
    chief = training_outcome(0, 0, StepEvents((0,), {0: 1}), err, None, {}, job_id="7")
    assert chief == Outcome(1, "the training step ended with status 1: srun: error: Unable to create step for job 7: "
                               "Requested node configuration is not available")
    assert training_outcome(1, 0, StepEvents((0,), {0: 1}), err, None, {}, job_id="7") is None


def test_success_and_running() -> None:
    assert training_outcome(0, 1, StepEvents((0, 1), {0: 143, 1: 0}), "", None, {}, job_id="7") == Outcome(0)
    assert training_outcome(0, 1, StepEvents((0, 1), {0: 143}), "", None, {}, job_id="7") is None
    assert training_alive(1, StepEvents((0, 1), {0: 143}), None)
    assert training_alive(0, StepEvents(), None)  # pending: may still run


def test_a_job_stopped_by_tfl_stops_every_task() -> None:
    stopped = JobEnd("7", "CANCELLED", 0, by_tfl=True)
    assert training_outcome(0, 0, StepEvents((0,)), "", stopped, {}, job_id="7") == Outcome(-signal.SIGTERM)
    assert training_outcome(1, 0, EXITED_143, KILL_ON_BAD_EXIT, None, {}, job_id="7", stopped=True) == Outcome(-signal.SIGTERM)
    assert evaluator_outcome(StepEvents(), stopped) == Outcome(-signal.SIGTERM)


def test_node_failure_is_the_failure_of_a_task_on_that_node() -> None:
    end = JobEnd("7", "NODE_FAIL", 0, by_tfl=False)
    err = "srun: error: Node failure on n2\nsrun: error: n2: task 1: Terminated\n"
    nodes = {0: "n1", 1: "n2"}
    expected = "node n2 failed: Slurm ended job 7 (NODE_FAIL); `sinfo -R` says why"
    # the job ended under the step (the batch script went with it) ...
    assert training_outcome(1, 0, StepEvents((0,)), err, end, nodes, job_id="7") == Outcome(1, expected, "n2")
    assert training_outcome(0, 0, StepEvents((0,)), err, end, nodes, job_id="7") is None
    # ... or the script saw its step end first: srun's stderr names the node all the same
    assert training_outcome(1, 0, EXITED_143, err, None, nodes, job_id="7") == Outcome(143, expected, "n2")
    assert training_outcome(0, 0, EXITED_143, err, None, nodes, job_id="7") is None


# srun's stderr after `scancel 7` from another terminal (Slurm 22.05): every task "Terminated"
SCANCELLED = ("srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
              "slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-11-26T22:33:15 ***\n"
              "srun: error: n2: task 1: Terminated\nsrun: forcing job termination\nsrun: error: n1: task 0: Terminated\n")


def test_a_scancel_outside_tfl_or_the_time_limit_is_the_cause_not_the_task_srun_named_first() -> None:
    # the script saw its step end (143) before tfl saw the job end: no task is to blame
    expected = Outcome(143, "Slurm step 7.0 was cancelled outside tfl (scancel at 2026-11-26T22:33:15)")
    assert training_outcome(0, 0, EXITED_143, SCANCELLED, None, {}, job_id="7") == expected
    assert training_outcome(1, 0, EXITED_143, SCANCELLED, None, {}, job_id="7") is None
    # ... and once Slurm says CANCELLED, its word: the whole job's, the run's cause (no task's)
    end = JobEnd("7", "CANCELLED", 0, False)
    assert training_outcome(0, 0, EXITED_143, SCANCELLED, end, {}, job_id="7") == Outcome(143, describe_end(end), of_run=True)
    assert training_outcome(1, 0, EXITED_143, SCANCELLED, end, {}, job_id="7") is None
    # a preemption is not someone's scancel (the preempted steps' own rules apply) ...
    preempted = SCANCELLED.replace(" ***", " DUE TO PREEMPTION ***")
    assert training_outcome(1, 0, EXITED_143, preempted, None, {}, job_id="7") == Outcome(-signal.SIGTERM)
    # ... and the time limit is the time limit, not the task srun named first: the whole job's, the run's cause
    timeout = Outcome(143, "Slurm job 7 reached its time limit (TIMEOUT); give the slurm block a longer \"time\"", of_run=True)
    timed_out = SCANCELLED.replace(" ***", " DUE TO TIME LIMIT ***")
    assert training_outcome(0, 0, EXITED_143, timed_out, None, {}, job_id="7") == timeout
    assert training_outcome(1, 0, EXITED_143, timed_out, None, {}, job_id="7") is None
    assert training_outcome(0, 0, EXITED_143, timed_out, JobEnd("7", "TIMEOUT", 0, False), {}, job_id="7") == timeout
    # srun's own cancel of the step once a task failed (a real srun's stderr) is not someone's scancel: the task is the cause
    srun_ended = ("srun: error: n2: task 1: Killed\nsrun: launch/slurm: _step_signal: Terminating StepId=3.0\n"
                  "slurmstepd-n1: error: *** STEP 3.0 ON n1 CANCELLED AT 2026-11-26T23:07:41 ***\n"
                  "srun: error: n1: task 0: Terminated\nsrun: Force Terminated StepId=3.0\n")
    assert cancellation(srun_ended, None, "3") is None
    assert cancellation(srun_ended.replace("srun: error: n2: task 1: Killed\n", ""), None, "3") is None
    assert cancellation(SCANCELLED, None, "7") == expected.ended_by


def test_a_scancel_of_the_whole_job_is_the_runs_cause_as_the_batch_output_says_before_slurms_state() -> None:
    # slurmstepd's line in batch-7.out; srun's stderr may name only the step, or only the tasks it "Terminated"
    batch_out = ("slurmstepd-n1: error: *** JOB 7 ON n1 CANCELLED AT 2026-11-26T22:33:15 ***\n"
                 "scancel: error: Kill job error on job step id 7.0: Invalid job id specified\n")
    expected = Outcome(143, "Slurm job 7 was cancelled outside tfl (scancel at 2026-11-26T22:33:15)", of_run=True)
    terminated = "srun: forcing job termination\nsrun: error: n2: task 1: Terminated\nsrun: error: n1: task 0: Terminated\n"
    for srun_err in (SCANCELLED, terminated):
        assert training_outcome(0, 0, EXITED_143, srun_err, None, {}, job_id="7", batch_out=batch_out) == expected
        assert training_outcome(1, 0, EXITED_143, srun_err, None, {}, job_id="7", batch_out=batch_out) is None
    assert job_cancellation(batch_out.replace(" ***", " DUE TO PREEMPTION ***"), None) is None  # a preemption's rules
    assert job_cancellation("", JobEnd("7", "CANCELLED", 0, True)) is None  # tfl's own stop
    # the record keeps it: the summary and status say it about the run
    failure = FailureRecord(task="chief:0", host="n1", pid=1, exit_code=143, reason=expected.ended_by or "", log_tail=[],
                            time=1.0, attempt=0, of_run=True)
    assert failure_said(failure) == expected.ended_by
    assert load(FailureRecord, dataclasses.asdict(failure), "failure") == failure


@pytest.mark.parametrize(("end", "expected"), [
    (JobEnd("7", "CANCELLED", 0, False), "Slurm job 7 was cancelled outside tfl (scancel)"),
    (JobEnd("7", "TIMEOUT", 0, False), "Slurm job 7 reached its time limit (TIMEOUT); give the slurm block a longer \"time\""),
    (JobEnd("7", "FAILED", 1, False, batch_tail="/x/python: No such file or directory"),
     "tfl's batch script for Slurm job 7 ended with status 1 before training did: /x/python: No such file or directory"),
    (JobEnd("7", "EXITED", 1, False, allocation=True), "tfl's batch script for allocation 7 ended with status 1 before training did: no output"),
    (JobEnd("7", "UNKNOWN", None, False), "Slurm no longer knows job 7: it ended unseen (MinJobAge passed)"),
    (JobEnd("7", "OUT_OF_MEMORY", None, False), "Slurm ended job 7: OUT_OF_MEMORY"),
])
def test_job_ends_are_one_line_each(end: JobEnd, expected: str) -> None:
    assert describe_end(end) == expected
    of_run = end.state in ("CANCELLED", "TIMEOUT")  # someone's scancel of the whole job, its time limit: the run's cause
    assert training_outcome(0, 0, StepEvents(), "", end, {}, job_id="7") == Outcome(end.exit_code or 1, expected, of_run=of_run)


def test_evaluator_outcomes() -> None:
    assert evaluator_outcome(StepEvents(evaluator_exit=0), None) == Outcome(0)
    assert evaluator_outcome(StepEvents(evaluator_exit=1), None) == Outcome(1)
    # stopped by the script after training, or ended with the job: not a failure of its own
    assert evaluator_outcome(StepEvents(evaluator_exit=143, evaluator_stopping=True), None) is None
    assert evaluator_outcome(StepEvents(), JobEnd("7", "NODE_FAIL", 0, False)) is None
    assert evaluator_alive(StepEvents(), None) and not evaluator_alive(StepEvents(evaluator_exit=0), None)


@pytest.mark.parametrize(("said", "expected"), [
    ("sbatch: error: invalid partition specified: nosuch\nallocation failure: Invalid partition name specified",
     "Invalid partition name specified; the slurm block names a partition this cluster does not have (`sinfo -s` lists them)"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "Requested node configuration is not available; the cluster's nodes that are up cannot hold it: lower slurm.nodes"),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     "Invalid account or account/partition combination specified"),
    ("sbatch: error: fetch_config: DNS SRV lookup failed\nsbatch: error: _establish_config_source: failed to fetch config\n"
     "sbatch: fatal: Could not establish a configuration source",  # Slurm 22.05 with no slurm.conf and no SLURM_CONF
     "Could not establish a configuration source; the Slurm client here finds no slurm.conf: set SLURM_CONF to"),
    ("sbatch: unrecognized option '--acount=ml'\nTry \"sbatch --help\" for more information\n",  # sbatch's own words, exit 255
     "unrecognized option '--acount=ml'; slurm.sbatch_args holds an option this sbatch does not take"),
    ("sbatch: error: Parse error in file /etc/slurm/slurm.conf line 1: \"garbage\"\nsbatch: error: ClusterName needs to be "
     "specified\nsbatch: fatal: Unable to process configuration file\n",  # Slurm 22.05 with a slurm.conf it cannot read
     "Unable to process configuration file (Parse error in file /etc/slurm/slurm.conf line 1: \"garbage\"); set SLURM_CONF"),
    ("", "no output"),
])
def test_sbatch_messages(said: str, expected: str) -> None:
    assert sbatch_message(said).startswith(expected) and "\n" not in sbatch_message(said)


# --- the backend against fake Slurm commands ------------------------------------------

class FakeSlurm:
    """Answers each command by its name (callables get the argv); records what was asked."""

    def __init__(self, **answers: CommandResult) -> None:
        self.answers, self.asked = answers, []  # type: ignore[var-annotated]

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        self.asked.append(list(argv))
        return self.answers.get(argv[0], CommandResult(0, "", ""))


def slurm_plan(tmp_path: Path, config: SupervisorConfig = SupervisorConfig(), **slurm: object) -> LaunchPlan:
    spec = parse_slurm_cluster({"slurm": {"nodes": 2, "evaluator": True, **slurm}})
    return build_plan(spec, "/jobs/mnist.py", ("--epochs", "2"), run_id="mnist-1", run_dir=str(tmp_path / "runs" / "mnist-1"),
                      python="/venv/bin/python", cwd="/work", config=config)


def fake_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        (bin_dir / name).write_text("#!/bin/sh\n")
        (bin_dir / name).chmod(0o700)
    monkeypatch.setenv("PATH", str(bin_dir))


def test_prepare_without_slurm_commands_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path(tmp_path, monkeypatch, "squeue")
    plan = slurm_plan(tmp_path)
    monkeypatch.setattr("launcher.engines.registry.get", lambda name, notify=None: SlurmBackend(run=FakeSlurm()))
    with pytest.raises(LaunchError) as err:
        launch.prepare(plan)
    assert str(err.value) == ("slurm: sbatch, scontrol, scancel not on PATH; install Slurm's client commands "
                              "(slurm-client) or fix PATH")


def test_a_slurm_conf_that_names_no_file_is_one_line_before_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch retried such a SLURM_CONF for 60 s, then said only "Unable to process configuration file"."""
    fake_path(tmp_path, monkeypatch, "sbatch", "squeue", "scontrol", "scancel")
    fake = FakeSlurm()
    conf = tmp_path / "etc" / "slurm.conf"
    monkeypatch.setattr("launcher.engines.registry.get",
                        lambda name, notify=None: SlurmBackend(run=fake, environ={"SLURM_CONF": str(conf)}))
    with pytest.raises(LaunchError) as err:
        launch.prepare(slurm_plan(tmp_path))
    assert str(err.value) == (f"slurm: SLURM_CONF={conf} is not a file; set it to the cluster's slurm.conf, or unset it "
                              "where Slurm's commands find their own")
    assert fake.asked == []  # sbatch --test-only was not run


def test_prepare_tries_the_script_with_sbatch_test_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path(tmp_path, monkeypatch, "sbatch", "squeue", "scontrol", "scancel")
    refused = FakeSlurm(sbatch=CommandResult(1, "", "sbatch: error: invalid partition specified: nosuch\n"
                                                    "allocation failure: Invalid partition name specified\n"))
    plan = slurm_plan(tmp_path, partition="nosuch")
    monkeypatch.setattr("launcher.engines.registry.get", lambda name, notify=None: SlurmBackend(run=refused))
    with pytest.raises(LaunchError, match=r"^slurm: sbatch refused the job: Invalid partition name specified; the slurm block "
                                          r"names a partition this cluster does not have \(`sinfo -s` lists them\)$"):
        launch.prepare(plan)
    (argv,) = refused.asked
    assert argv[:-1] == ["sbatch", "--parsable", "--test-only"] and not os.path.exists(argv[-1])  # its temp file is gone
    assert not Path(plan.run_dir).exists()  # nothing written before the run exists


def test_start_submits_once_and_records_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_path(tmp_path, monkeypatch, "sbatch", "squeue", "scontrol", "scancel")
    fake = FakeSlurm(sbatch=CommandResult(0, "42\n", ""))
    plan = slurm_plan(tmp_path, config=SupervisorConfig(max_restarts=1))
    backend = SlurmBackend(run=fake)
    assert [c.status for c in backend.prepare(plan)] == ["ok", "ok"]
    assert backend.run_data() == {}
    procs = [backend.start(t, 0) for t in plan.tasks]
    submits = [a for a in fake.asked if "--test-only" not in a]
    assert submits == [["sbatch", "--parsable", RunFiles(plan.run_dir).script]]
    assert Path(RunFiles(plan.run_dir).script).read_text() == plan.unit.script  # type: ignore[union-attr]
    assert oct(Path(RunFiles(plan.run_dir).script).stat().st_mode & 0o777) == "0o600"
    assert backend.run_data() == {"job_id": "42", "job_name": "tfl-mnist-1"}
    assert all(p.pid is None and p.handle is procs[0].handle for p in procs)
    events = Path(RunFiles(plan.run_dir).events)
    events.write_text("training 0 start\ntraining 0 exit 143\n")
    fake.answers["squeue"] = CommandResult(0, "42|RUNNING|None|n[1-2]\n", "")
    assert backend.restarted(0) is None  # the script has not decided yet
    events.write_text("training 0 start\ntraining 0 exit 143\ntraining 1 start\n")
    assert backend.restarted(0) is True
    assert backend.restarted(1) is None  # still running: it may yet end preempted, which does not count
    events.write_text("training 0 start\ntraining 0 exit 143\ntraining 1 start\ntraining 1 exit 143\n")
    assert backend.restarted(1) is False  # max_restarts 1: the script will not start attempt 2


def test_an_exit_written_as_the_job_ended_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The script writes the step's exit, then ends. A poll that read the events just before the exit
    and asked Slurm just after the end reads them again: the task succeeded, its script did not end
    "before training did" (a quiet fresh-clone run of the Slurm notice test failed so)."""
    fake_path(tmp_path, monkeypatch, "sbatch", "squeue", "scontrol", "scancel")
    plan = slurm_plan(tmp_path)
    backend = SlurmBackend(run=FakeSlurm(sbatch=CommandResult(0, "42\n", "")))
    backend.prepare(plan)
    procs = [backend.start(t, 0) for t in plan.tasks if t.task.is_training]
    events = Path(RunFiles(plan.run_dir).events)
    events.write_text("training 0 start\n")

    def ended_meanwhile() -> JobEnd:  # the script's last writes fall between the poll's two reads
        events.write_text("training 0 start\ntraining 0 exit 0\nend 0\n")
        return JobEnd("42", "COMPLETED", 0, by_tfl=False)

    monkeypatch.setattr(procs[0].handle, "end", ended_meanwhile)
    assert [backend.poll(p) for p in procs] == [0, 0]
    assert [p.ended_by for p in procs] == [None, None]  # no cause to name


def test_a_restart_started_as_the_job_ended_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same race for the restart: attempt 1 started (and ended) between the events' read and the end."""
    fake_path(tmp_path, monkeypatch, "sbatch", "squeue", "scontrol", "scancel")
    plan = slurm_plan(tmp_path, config=SupervisorConfig(max_restarts=1))
    backend = SlurmBackend(run=FakeSlurm(sbatch=CommandResult(0, "42\n", "")))
    backend.prepare(plan)
    proc = backend.start(plan.tasks[0], 0)
    events = Path(RunFiles(plan.run_dir).events)
    events.write_text("training 0 start\ntraining 0 exit 143\n")

    def ended_meanwhile() -> JobEnd:
        events.write_text("training 0 start\ntraining 0 exit 143\ntraining 1 start\ntraining 1 exit 0\nend 0\n")
        return JobEnd("42", "COMPLETED", 0, by_tfl=False)

    monkeypatch.setattr(proc.handle, "end", ended_meanwhile)
    assert backend.restarted(0) is True


def test_a_teardown_of_every_task_stops_the_shared_unit_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks share one unit: the graceful stop goes out once (inside an allocation each one was a
    SIGINT to the batch script, which passed SIGTERM on again); SIGKILL still goes out."""
    fake_path(tmp_path, monkeypatch, "sbatch", "squeue", "scontrol", "scancel")
    fake = FakeSlurm(sbatch=CommandResult(0, "42\n", ""))
    plan = slurm_plan(tmp_path)
    backend = SlurmBackend(run=fake)
    backend.prepare(plan)
    procs = [backend.start(t, 0) for t in plan.tasks if t.task.is_training]
    for proc in procs:
        backend.signal(proc, signal.SIGUSR2)
    assert [a for a in fake.asked if a[0] == "scancel"] == [["scancel", "42"]]
    backend.signal(procs[0], signal.SIGKILL)
    assert [a for a in fake.asked if a[0] == "scancel"][1:] == [["scancel", "--signal=KILL", "--full", "42"], ["scancel", "42"]]


def test_sbatch_refusing_at_submission_is_one_line(tmp_path: Path) -> None:
    backend = SlurmBackend(run=FakeSlurm(sbatch=CommandResult(1, "", "sbatch: error: Batch job submission failed: "
                                                                        "Job violates accounting/QOS policy\n")))
    plan = slurm_plan(tmp_path)
    backend._job = SlurmJob(plan, backend._run)  # as prepare() leaves it, had sbatch --test-only accepted the job
    with pytest.raises(SlurmError, match="^sbatch refused the job: Job violates accounting/QOS policy$"):
        backend.start(plan.tasks[0], 0)


def test_job_ref_round_trips_through_the_record() -> None:
    plan = SlurmJobPlan(script="", sbatch=(), job_name="tfl-r1", allocation="12")
    ref = JobRef("r1", RunFiles("/runs/r1"), "tfl-r1", "12", allocation=True, script_pid=345, script_create_time=1700000000.25)
    assert JobRef.from_record("r1", "/runs/r1", plan, ref.data()) == ref
    submitted = JobRef("r1", RunFiles("/runs/r1"), "tfl-r1", "77")
    assert JobRef.from_record("r1", "/runs/r1", SlurmJobPlan("", ("sbatch",), "tfl-r1"), submitted.data()) == submitted


def test_the_backend_is_registered_and_chosen_by_the_plan(tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path)
    assert name_for_plan(plan) == "slurm" and isinstance(get("slurm"), SlurmBackend)
    assert LaunchPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


# --- the plan: tasks, refusals, the description and the CLI -----------------------------

def test_plan_tasks_and_environment(tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path, tasks_per_node=2)
    assert [t.name for t in plan.tasks] == ["chief:0", "worker:0", "worker:1", "worker:2", "evaluator:0"]
    worker = plan.tasks[2]
    assert worker.argv == ("/venv/bin/python", "-u", "-m", "launcher.engines.slurm.node.task", "training", "/jobs/mnist.py", "--epochs", "2")
    assert worker.env["TFL_TASK"] == "worker:1" and worker.env["TFL_RUN_ID"] == "mnist-1" and "TF_CONFIG" not in worker.env
    assert worker.log_path == f"{plan.run_dir}/logs/worker-1.log" and worker.host == "slurm"
    assert plan.tasks[-1].argv[4] == "evaluator"


@pytest.mark.parametrize(("config", "expected"), [
    (SupervisorConfig(retry_on="preemption"), "--retry-on preemption: on Slurm the batch script restarts"),
    (SupervisorConfig(stall_timeout=60), "--stall-timeout is not supported on Slurm"),
])
def test_plan_refuses_what_the_script_cannot_do(tmp_path: Path, config: SupervisorConfig, expected: str) -> None:
    with pytest.raises(UsageError, match=expected):
        slurm_plan(tmp_path, config=config)


def test_descriptions_part_in_one_place(tmp_path: Path) -> None:
    slurm = tmp_path / "slurm.json"
    slurm.write_text(json.dumps({"slurm": {"nodes": 2}}))
    assert type(load_description(slurm)).__name__ == "SlurmClusterSpec"
    with pytest.raises(ClusterFileError, match="a 'slurm' description has no hosts of its own for this command"):
        load_cluster(slurm)
    both = tmp_path / "both.json"
    both.write_text(json.dumps({"slurm": {"nodes": 2}, "cluster": {"chief": ["h:1"]}}))
    with pytest.raises(ClusterFileError, match="'cluster' cannot be used with 'slurm'"):
        load_description(both)


def test_allocation_from_slurms_variables() -> None:
    spec = allocation_cluster({"SLURM_JOB_ID": "12", "SLURM_TASKS_PER_NODE": "2(x3)"}, evaluator=True)
    assert (spec.job_id, spec.slurm.nodes, spec.slurm.tasks_per_node, spec.slurm.evaluator) == ("12", 3, 2, True)
    with pytest.raises(UsageError, match="--slurm runs inside a Slurm allocation, and SLURM_JOB_ID is not set"):
        allocation_cluster({}, evaluator=False)
    with pytest.raises(UsageError, match="the allocation has 2,1 tasks per node; --slurm needs the same number on every node"):
        allocation_cluster({"SLURM_JOB_ID": "12", "SLURM_TASKS_PER_NODE": "2,1"}, evaluator=False)


def test_cli_validate_and_dry_run_show_the_script_and_srun_lines(tmp_path: Path, tfl_home: Path) -> None:
    cluster = tmp_path / "slurm.json"
    cluster.write_text(json.dumps({"slurm": {"nodes": 2, "evaluator": True, "partition": "debug", "gpus_per_task": 1,
                                             "sbatch_args": ["--account=ml"]}, "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}}))
    done = runner.invoke(app, ["validate", str(cluster)])
    assert done.exit_code == 0 and done.stderr.endswith("valid (3 tasks)\n")
    assert "  chief:0  rank 0 of the training step" in done.stdout and "  evaluator:0  a step of its own" in done.stdout
    assert "  #SBATCH --gpus-per-task=1" in done.stdout and "srun lines:\n  training: srun --exact --nodes=2" in done.stdout
    dry = runner.invoke(app, ["launch", "jobs/mnist.py", "--cluster", str(cluster), "--dry-run", "--max-restarts", "2", "--", "--epochs", "1"])
    assert dry.exit_code == 0, dry.output
    assert "slurm: submitted: sbatch --parsable --account=ml " in dry.stdout and "[ $failed -gt 2 ]" in dry.stdout
    assert "training jobs/mnist.py" not in dry.stdout and "mnist.py --epochs 1" in dry.stdout
    assert not tfl_home.exists()  # a dry run writes nothing


@pytest.mark.parametrize(("args", "message"), [
    (["--slurm"], "--slurm runs inside a Slurm allocation, and SLURM_JOB_ID is not set"),
    (["--slurm", "--local", "2"], "give exactly one of --cluster FILE, --local N (e.g. --local 2) or --slurm"),
    (["--slurm", "--detach"], "--detach with --slurm: the allocation ends when its command returns"),
])
def test_cli_slurm_usage_errors(tfl_home: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    done = runner.invoke(app, ["launch", "jobs/mnist.py", *args])
    assert done.exit_code == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.output
