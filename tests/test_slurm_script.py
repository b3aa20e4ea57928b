"""The Slurm batch script and its srun lines, without a cluster: their shape, and the script
run by bash against fake srun/squeue/scancel (restarts, stop, the evaluator's end, events)."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.engines.slurm.node.batch import RunFiles, StepEvents, parse_events
from launcher.engines.slurm.node.errors import SlurmError
from launcher.engines.slurm.script import BatchJob, evaluator_srun, render_batch_script, sbatch_command, sbatch_header, training_srun
from launcher.engines.slurm.settings import SlurmSettings

ISSUE_SLURM = {"nodes": 2, "tasks_per_node": 1, "evaluator": True, "partition": "debug", "time": "01:00:00",
               "gpus_per_task": 1, "sbatch_args": ["--account=ml"]}
DRIVER = ["/opt/venv/bin/python", "-u", "-m", "launcher.engines.slurm.node.task"]


def batch(run_dir: str = "/shared/tfl/runs/mnist-1", restarts: int = 0, **options: Any) -> BatchJob:
    fields = {k: options.pop(k) for k in ("grace_period", "evaluator_timeout", "allocation", "virtual_devices", "python", "cwd")
              if k in options}
    settings = SlurmSettings.model_validate({"nodes": 2, **options})
    return BatchJob(**{"settings": settings, "job": "/home/u/jobs/mnist.py", "job_args": ("--epochs", "3"), "run_id": "mnist-1",
                       "run_dir": run_dir, "env": {"TF_CPP_MIN_LOG_LEVEL": "2", "NOTE": "it's a \"test\" $HOME"},
                       "python": "/opt/venv/bin/python", "cwd": "/home/u/my project", "max_restarts": restarts, **fields})


def test_sbatch_header_of_the_issue_example() -> None:
    b = batch(**ISSUE_SLURM)
    assert sbatch_header(b) == [
        "#SBATCH --job-name=tfl-mnist-1", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",  # 1 + the evaluator
        "#SBATCH --output=/shared/tfl/runs/mnist-1/slurm/batch-%j.out", "#SBATCH --no-requeue", "#SBATCH --partition=debug",
        "#SBATCH --time=01:00:00", "#SBATCH --gpus-per-task=1",
    ]
    assert sbatch_command(b) == ["sbatch", "--parsable", "--account=ml"]
    assert sbatch_command(b, "--test-only") == ["sbatch", "--parsable", "--account=ml", "--test-only"]


def test_inside_an_allocation_there_is_no_header() -> None:
    b = batch(allocation=True, evaluator=True)
    assert sbatch_header(b) == []
    assert "#SBATCH" not in render_batch_script(b)
    assert "inside an allocation" in render_batch_script(b).splitlines()[2]


def test_srun_lines() -> None:
    b = batch(tasks_per_node=2, evaluator=True, gpus_per_task=1, cpus_per_task=4)
    assert training_srun(b) == ["srun", "--exact", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--distribution=block",
                                "--kill-on-bad-exit=1", "--cpus-per-task=4", "--gpus-per-task=1", "--job-name=training.mnist-1",
                                *DRIVER, "training", "/home/u/jobs/mnist.py", "--epochs", "3"]
    assert evaluator_srun(b) == ["srun", "--exact", "--nodes=1", "--ntasks=1", "--cpus-per-task=4", "--gpus-per-task=1",
                                 "--job-name=evaluator.mnist-1", *DRIVER, "evaluator", "/home/u/jobs/mnist.py", "--epochs", "3"]


def test_srun_lines_inside_an_allocation() -> None:
    b = batch(allocation=True, evaluator=True)
    assert training_srun(b)[:8] == ["srun", "--exact", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--distribution=block",
                                    "--kill-on-bad-exit=1", "--job-name=training.mnist-1"]
    # every allocated task trains: the evaluator shares the first node's resources
    assert evaluator_srun(b)[:5] == ["srun", "--exact", "--overlap", "--nodes=1", "--ntasks=1"]


def test_script_without_evaluator() -> None:
    text = render_batch_script(batch())
    assert "evaluator" not in text
    assert "TFL_ATTEMPT=$attempt srun --exact --nodes=2 --ntasks=2 --ntasks-per-node=1" in text
    assert 'exit $status 2> "$files/training-$attempt.err" &' not in text and '2> "$files/training-$attempt.err" &' in text
    assert text.endswith("note end $status\nexit $status\n")
    assert "TF_CONFIG" not in text  # built by the driver in each task, never written out


def test_script_with_evaluator_starts_it_first_and_stops_it_after_training() -> None:
    lines = render_batch_script(batch(evaluator=True, evaluator_timeout=60, grace_period=2)).splitlines()
    start = next(i for i, ln in enumerate(lines) if "--job-name=evaluator.mnist-1" in ln)
    training = next(i for i, ln in enumerate(lines) if "--job-name=training.mnist-1" in ln)
    stopping = lines.index("  note evaluator stopping")
    assert lines[start].startswith("{ srun ") and lines[start].endswith('2> "$files/evaluator.err"; note evaluator exit $?; } &')
    assert lines[start + 1] == "evaluator=$!" and start < training < stopping
    assert "[ $waited -lt 600 ]" in lines[stopping - 2] and "[ $waited -lt 20 ]" in lines[stopping + 2]  # 60 s, then 2 s
    assert "awk '$2 == \"evaluator.mnist-1\" {print $1}'" in lines[stopping + 1]  # its step, found by name
    assert lines[-3:] == ["wait_step $evaluator", "note end $status", "exit $status"]


def test_script_is_valid_bash() -> None:
    for b in (batch(evaluator=True, restarts=2), batch(allocation=True, evaluator=True)):
        done = subprocess.run(["bash", "-n"], input=render_batch_script(b), text=True, capture_output=True)
        assert done.returncode == 0, done.stderr


def test_script_exports_env_exactly(tmp_path: Path) -> None:
    text = render_batch_script(batch(str(tmp_path), cwd=str(tmp_path), virtual_devices=4))
    exports = "\n".join(ln for ln in text.splitlines() if ln.startswith("export ") and "TFL_SLURM_NODES" not in ln)
    names = "NOTE TF_CPP_MIN_LOG_LEVEL TFL_RUN_ID TFL_RUN_DIR TFL_SLURM_TRAINING_LAYOUT TF_USE_LEGACY_KERAS PYTHONUNBUFFERED TFL_VIRTUAL_DEVICES"
    done = subprocess.run(["bash", "-c", exports + f"\nprintenv {names}"], capture_output=True, text=True, env={"HOME": "/nowhere"})
    assert done.stdout.splitlines() == ["it's a \"test\" $HOME", "2", "mnist-1", str(tmp_path), "1(x2)", "1", "1", "4"]


def test_script_refuses_what_it_cannot_carry() -> None:
    with pytest.raises(SlurmError, match="run dir '/my runs/x' has characters an #SBATCH line cannot carry"):
        render_batch_script(batch("/my runs/x"))
    b = batch()
    with pytest.raises(SlurmError, match="env key 'A B' is not a variable name"):
        render_batch_script(BatchJob(**{**b.__dict__, "env": {"A B": "1"}}))
    with pytest.raises(SlurmError, match="run id 'my job-1' has characters"):  # step names carry it too
        render_batch_script(BatchJob(**{**b.__dict__, "run_id": "my job-1", "allocation": True}))


# --- the script run by bash, against fake Slurm commands ---------------------------------

FAKE_SRUN = """#!/bin/bash
echo "${TFL_ATTEMPT:-} $*" >> "$FAKE/calls"
case "$*" in
  *--job-name=evaluator.*) echo $$ > "$FAKE/evaluator.pid"; [ -n "${EVALUATOR_EXIT:-}" ] && exit "$EVALUATOR_EXIT"; exec sleep 300 ;;
esac
echo $$ > "$FAKE/training.pid"
if [ "$(grep -c -- --job-name=training "$FAKE/calls")" -le "$FAILS" ]; then echo "srun: error: n2: task 1: Exited with exit code 3" >&2; exit 1; fi
[ -n "${HANG:-}" ] && exec sleep 300
exit 0
"""
FAKE_SQUEUE = """#!/bin/bash
case "$*" in *%T*) echo "${JOB_STATE:-RUNNING}"; exit 0 ;; esac  # the job's state (job_running)
case "$*" in *%L*) echo "${TIME_LEFT:-UNLIMITED}"; exit 0 ;; esac  # its time left (time_left)
if [ -n "${SQUEUE_GATE:-}" ]; then  # hold the listing until the test opens the gate
  echo listing >> "$FAKE/squeue.calls"; while [ ! -e "$SQUEUE_GATE" ]; do sleep 0.02; done
fi
echo "7.0 training.mnist-1"; echo "7.1 evaluator.mnist-1"; echo "7.2 training.other-run"
"""
FAKE_SCONTROL = '#!/bin/bash\necho "JobId=7 JobState=RUNNING PreemptTime=${PREEMPT_TIME:-None} SuspendTime=None"\n'
# A step squeue lists has been started, but its srun may not have written its pid yet (a loaded
# machine: the evaluator's step took over its 0.5 s evaluator_timeout to get there, the kill found no
# pid, and the step ended 137 after the grace): scancel waits for it, as Slurm signals a step it knows.
FAKE_SCANCEL = """#!/bin/bash
echo "$*" >> "$FAKE/scancel"
sig=${1#--signal=}
case "$2" in 7.0) pid_file="$FAKE/training.pid" ;; 7.1) pid_file="$FAKE/evaluator.pid" ;; *) exit 0 ;; esac
for _ in $(seq 600); do [ -s "$pid_file" ] && break; sleep 0.05; done  # a hang guard: 30 s
kill -s "$sig" "$(cat "$pid_file")"
"""
FAKE_PYTHON = '#!/bin/bash\n[ "$2" = launcher.engines.slurm.node.task ] && [ "$3" = nodes ] && echo n1=127.0.0.1,n2=127.0.0.1\n'


def fake_slurm(tmp_path: Path, fails: int = 0, **env: str) -> dict[str, str]:
    """A PATH with fake srun/squeue/scancel and python (the nodes step), and the script's files dir."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fakes = {"srun": FAKE_SRUN, "squeue": FAKE_SQUEUE, "scancel": FAKE_SCANCEL, "scontrol": FAKE_SCONTROL, "python": FAKE_PYTHON}
    for name, text in fakes.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    Path(RunFiles(str(tmp_path)).root).mkdir()
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE": str(tmp_path), "FAILS": str(fails), "SLURM_JOB_ID": "7", **env}


def run_script(tmp_path: Path, b: BatchJob, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    b = BatchJob(**{**b.__dict__, "python": str(tmp_path / "bin" / "python"), "cwd": str(tmp_path)})
    return subprocess.run(["bash", "-c", render_batch_script(b)], env=env, capture_output=True, text=True, timeout=200)


def events(tmp_path: Path) -> list[str]:
    return Path(RunFiles(str(tmp_path)).events).read_text().splitlines()


@pytest.mark.parametrize(("fails", "restarts", "attempts", "status"), [(0, 2, ["0"], 0), (2, 2, ["0", "1", "2"], 0),
                                                                        (5, 2, ["0", "1", "2"], 1), (1, 0, ["0"], 1)])
def test_script_restarts_the_training_group(tmp_path: Path, fails: int, restarts: int, attempts: list[str], status: int) -> None:
    done = run_script(tmp_path, batch(str(tmp_path), restarts=restarts), fake_slurm(tmp_path, fails))
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0] for c in calls] == attempts and done.returncode == status, done.stderr
    assert done.stderr.count("tfl: training step failed") == len(attempts) - 1
    expected = [line for a in attempts for line in (f"training {a} start", f"training {a} exit {int(int(a) < fails)}")]
    assert events(tmp_path) == [*expected, f"end {status}"]
    parsed = parse_events("\n".join(events(tmp_path)) + "\n")
    assert parsed == StepEvents(tuple(int(a) for a in attempts), {int(a): int(int(a) < fails) for a in attempts}, None, False, status)
    if fails:  # each attempt's srun stderr in a file of its own
        assert "task 1: Exited with exit code 3" in Path(RunFiles(str(tmp_path)).training_err(0)).read_text()


def test_script_nodes_step_failing_ends_it(tmp_path: Path) -> None:
    env = fake_slurm(tmp_path)
    (tmp_path / "bin" / "python").write_text("#!/bin/bash\necho 'scontrol: error: no such node' >&2\nexit 2\n")
    done = run_script(tmp_path, batch(str(tmp_path), evaluator=True), env)
    assert done.returncode == 1 and "no such node" in done.stderr
    assert events(tmp_path) == ["end 1"] and not (tmp_path / "calls").exists()


def test_script_evaluator_that_ends_by_itself(tmp_path: Path) -> None:
    done = run_script(tmp_path, batch(str(tmp_path), evaluator=True), fake_slurm(tmp_path, EVALUATOR_EXIT="0"))
    assert done.returncode == 0, done.stderr
    assert sorted(events(tmp_path)) == sorted(["evaluator exit 0", "training 0 start", "training 0 exit 0", "end 0"])
    assert not (tmp_path / "scancel").exists()


def test_script_stops_the_evaluator_after_its_time(tmp_path: Path) -> None:
    started = time.monotonic()
    done = run_script(tmp_path, batch(str(tmp_path), evaluator=True, evaluator_timeout=0.5, grace_period=5),
                      fake_slurm(tmp_path))
    assert done.returncode == 0, done.stderr  # the evaluator does not decide the result
    assert time.monotonic() - started < 120  # a hang guard: the fake evaluator sleeps 300 s
    assert events(tmp_path)[-3:] == ["evaluator stopping", "evaluator exit 143", "end 0"]
    assert (tmp_path / "scancel").read_text().splitlines() == ["--signal=TERM 7.1"]  # its step only, SIGTERM first


def start_with_both_steps(tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    """The script (restarts allowed, an evaluator), its steps hanging, once both have started."""
    b = BatchJob(**{**batch(str(tmp_path), restarts=3, evaluator=True).__dict__, "python": str(tmp_path / "bin" / "python"),
                    "cwd": str(tmp_path)})
    script = subprocess.Popen(["bash", "-c", render_batch_script(b)], env=fake_slurm(tmp_path, 0, HANG="1", **env),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 20
    while not ((tmp_path / "training.pid").exists() and (tmp_path / "evaluator.pid").exists()):
        if time.monotonic() > deadline or script.poll() is not None:
            raise AssertionError(kill_script(script))
        time.sleep(0.05)
    return script


def kill_script(script: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGKILL to the script's whole group (started in a session of its own), then its output. A
    kill() of bash alone left its fake steps' `sleep 300` holding its pipes: communicate() then
    waited for them, and a failed wait became a 300 s hang. Only while bash is not yet reaped:
    its pid, and so its group's id, cannot be another's."""
    if script.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
    return script.communicate(timeout=30)


def test_script_sigint_stops_the_steps_and_does_not_restart(tmp_path: Path) -> None:
    """SIGINT is tfl's stop (SIGTERM is a preemption notice: tests/test_slurm_preemption.py)."""
    script = start_with_both_steps(tmp_path)
    try:
        script.send_signal(signal.SIGINT)
        _, err = script.communicate(timeout=120)
    finally:
        kill_script(script)
    assert script.returncode == 143, (err, events(tmp_path))
    # this run's steps got SIGTERM through scancel (another run's step in the same allocation did not)
    assert sorted((tmp_path / "scancel").read_text().splitlines()) == ["--signal=TERM 7.0", "--signal=TERM 7.1"]
    assert [e for e in events(tmp_path) if e.startswith("training")] == ["training 0 start", "training 0 exit 143"]
    assert events(tmp_path)[-1] == "end 143" and "evaluator exit 143" in events(tmp_path)
    for pid_file in ("training.pid", "evaluator.pid"):
        pid = int((tmp_path / pid_file).read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_signals_while_one_is_passed_on_each_step_gets_one_sigterm(tmp_path: Path) -> None:
    """A teardown stops each of a run's tasks, so the script may get SIGINT twice (and a notice) while
    its trap is still listing the steps. bash then ran the trap inside the running one, which broke its
    loop: steps skipped or signalled again, and once a step ended 130 instead of 143 (a flaky
    test_slurm_runs test). Now each signal is noted, and one pass at a time passes it on."""
    gate = tmp_path / "gate"
    script = start_with_both_steps(tmp_path, SQUEUE_GATE=str(gate))
    try:
        deadline = time.monotonic() + 20
        script.send_signal(signal.SIGINT)
        while not (tmp_path / "squeue.calls").exists():  # the first pass is listing the steps, held at the gate
            assert time.monotonic() < deadline and script.poll() is None, kill_script(script)
            time.sleep(0.02)
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
            script.send_signal(signum)
            time.sleep(0.1)  # time for bash to take each one (the outcome must not depend on it)
        gate.touch()
        _, err = script.communicate(timeout=120)
    finally:
        kill_script(script)
    assert script.returncode == 143, (err, events(tmp_path))
    assert sorted((tmp_path / "scancel").read_text().splitlines()) == ["--signal=TERM 7.0", "--signal=TERM 7.1"], err
    assert (tmp_path / "squeue.calls").read_text().splitlines() == ["listing"]  # one pass: the stop; a notice after it is moot
    assert [e for e in events(tmp_path) if e.startswith("training")] == ["training 0 start", "training 0 exit 143"]
    assert "unexpected EOF" not in err


def test_parse_events_leaves_a_line_being_written() -> None:
    assert parse_events("training 0 start\ntraining 0 ex") == StepEvents((0,), {}, None, False, None)
    assert parse_events("training 0 start\ntraining 0 exit 143\ntraining 1 start\nevaluator stopping\nevaluator exit 0\nend 0\n") == \
        StepEvents((0, 1), {0: 143}, 0, True, 0)
    assert parse_events("garbage\ntraining x start\n\nend\n") == StepEvents()
    assert parse_events("training 0 start\ntraining 0 exit 170\nrequeued 1\ntraining 1 start\n") == \
        StepEvents((0, 1), {0: 170}, None, False, None, requeued=1)
