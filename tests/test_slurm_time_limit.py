"""The Slurm time limit ends the whole job under every task: the run's cause, naming no task.

The texts below are what Slurm 22.05 wrote for `sbatch --time=1 -N2 --ntasks-per-node=1 --wrap
"srun sleep 600 2> srun.err"` on the tests' cluster (tests/slurm_cluster.py), job id 2 made 7;
`scontrol show job` then said JobState=TIMEOUT Reason=TimeLimit."""

from __future__ import annotations

from launcher.engines.slurm.node.batch import StepEvents
from launcher.engines.slurm.outcome import JobEnd, Outcome, training_outcome
from launcher.records.store import FailureRecord
from launcher.supervise.recording import failure_said

BATCH_OUT = "slurmstepd-n1: error: *** JOB 7 ON n1 CANCELLED AT 2026-11-27T10:04:28 DUE TO TIME LIMIT ***\n"
SRUN_ERR = ("srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
            "srun: got SIGCONT\n"
            "slurmstepd-n1: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-11-27T10:04:28 DUE TO TIME LIMIT ***\n"
            "srun: forcing job termination\n"
            "srun: error: n2: task 1: Terminated\n"
            "srun: launch/slurm: _step_signal: Terminating StepId=7.0\n"
            "srun: error: n1: task 0: Terminated\n")
TERMINATED = "srun: forcing job termination\nsrun: error: n2: task 1: Terminated\nsrun: error: n1: task 0: Terminated\n"
EXITED_143 = StepEvents(started=(0,), exits={0: 143})
SAID = "Slurm job 7 reached its time limit (TIMEOUT); give the slurm block a longer \"time\""


def test_the_time_limit_is_the_runs_cause_whichever_of_slurms_words_comes_first() -> None:
    cases = [  # (srun's stderr, the batch output, Slurm's word on the job, the script's events)
        (SRUN_ERR, BATCH_OUT, None, EXITED_143),  # the script saw the step end before tfl saw the job end
        (TERMINATED, BATCH_OUT, None, EXITED_143),  # srun's stderr without slurmstepd's line: the batch output says it
        (SRUN_ERR, "", None, EXITED_143),  # the batch output not read yet: srun's stderr says it
        (SRUN_ERR, BATCH_OUT, JobEnd("7", "TIMEOUT", 0, False), EXITED_143),
        ("", "", JobEnd("7", "TIMEOUT", 0, False), StepEvents(started=(0,))),  # the script ended with the job, noting nothing
    ]
    for srun_err, batch_out, end, events in cases:
        chief = training_outcome(0, 0, events, srun_err, end, {0: "n1", 1: "n2"}, job_id="7", batch_out=batch_out)
        assert chief is not None and chief.ended_by == SAID and chief.of_run, (srun_err, batch_out, end, chief)
        assert training_outcome(1, 0, events, srun_err, end, {0: "n1", 1: "n2"}, job_id="7", batch_out=batch_out) is None


def test_the_summary_says_the_time_limit_about_the_run_not_chief_0() -> None:
    outcome = training_outcome(0, 0, EXITED_143, TERMINATED, None, {0: "n1"}, job_id="7", batch_out=BATCH_OUT)
    assert outcome == Outcome(143, SAID, of_run=True)
    failure = FailureRecord(task="chief:0", host="n1", pid=1, exit_code=143, reason=SAID, log_tail=[], time=1.0,
                            attempt=0, of_run=outcome.of_run)
    assert failure_said(failure) == SAID  # not "chief:0 on n1 failed: …"


def test_a_preemption_and_tfls_own_stop_are_not_the_time_limit() -> None:
    preempted = BATCH_OUT.replace("TIME LIMIT", "PREEMPTION")
    chief = training_outcome(0, 0, EXITED_143, TERMINATED, None, {}, job_id="7", batch_out=preempted)
    assert chief is None or chief.ended_by != SAID
    assert training_outcome(0, 0, EXITED_143, SRUN_ERR, JobEnd("7", "TIMEOUT", 0, True), {}, job_id="7",
                            batch_out=BATCH_OUT, stopped=True) == Outcome(-15)
