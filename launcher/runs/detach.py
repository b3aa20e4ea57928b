"""``tfl launch --detach`` and ``tfl resume --detach``: the run's launcher in the background.

The foreground reserves the run dir, writes the plan (0600) and starts ``tfl _supervise`` (or
``tfl _resume``) in a session of its own, then waits until the record names that launcher, so
``tfl status`` sees the run at once. The background launcher records the run only once its
``prepare`` has passed; one that exits before that has its one-line refusal said here as the
foreground's own (``refusal``), and leaves no run dir. Ctrl-C while waiting calls the launch off
(``_call_off``). ``supervise_detached`` and ``resume_detached`` are the background launcher's bodies.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from launcher.contract import HOME
from launcher.errors import ERROR_PREFIX, LaunchError
from launcher.files import open_private, write_atomic
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.run_options import SupervisorConfig
from launcher.records.identity import ProcessIdentity
from launcher.records.preparing import Preparing, end_preparing, forget_preparing, note_preparing, waiting_parent
from launcher.records.store import RunRecord, RunStore
from launcher.runs.launch import execute, interrupted, prepare, resume, supervise
from launcher.runs.resume import check_resumable, move_to, recorded_plan

# The least a detached launch waits for its background launcher to record the run (``record_wait``).
RECORD_WAIT = 300.0


def detach(plan: LaunchPlan, store: RunStore, config: SupervisorConfig) -> int:
    """Run the supervisor as a background process in its own session; returns its pid.

    Returns once the run is recorded, so ``tfl status`` sees it at once. The background launcher
    records the run only once its ``prepare`` has passed (the hosts' checks, the code shipped), so
    the checks are made once, there, on the connections the run keeps: a refusal is its one line,
    said here as the foreground's own (``_spawn``), and leaves no run dir.
    """
    run_dir = Path(plan.run_dir)
    store.reserve(run_dir)  # 0700, never an existing dir; the launcher's store.create(reserved=True) fills it
    plan_file = run_dir / "plan.json"
    write_atomic(plan_file, json.dumps(plan.to_dict()))  # 0600: it holds every task's env
    return _spawn(["_supervise", str(plan_file), json.dumps(asdict(config))], store, plan.run_id, record_wait(plan))


def detach_resume(run_id: str, store: RunStore, config: SupervisorConfig, address: str | None = None) -> int:
    """``tfl resume --detach``: the refusals here, then ``resume`` in a background launcher."""
    record = store.load(run_id)
    check_resumable(record, job=True)
    move_to(record, address)
    args = ["_resume", run_id, json.dumps(asdict(config)), *(["--address", address] if address is not None else [])]
    return _spawn(args, store, run_id, record_wait(recorded_plan(record)))


def record_wait(plan: LaunchPlan) -> float:
    """How long ``--detach`` waits at most for its background launcher to record the run (a hang guard:
    it returns as soon as the record names the launcher, or says why the launcher exited). The launcher
    records the run once its backend has prepared it: SSH hosts reached and the code shipped, or a Ray
    placement group ready (up to its ``ready_timeout``) and its actors started on their nodes."""
    return RECORD_WAIT + 2 * float(getattr(plan.unit, "ready_timeout", 0.0))


def _spawn(args: list[str], store: RunStore, run_id: str, timeout: float) -> int:
    """A background launcher (``tfl ARGS``) in its own session; returns its pid once the run's
    record names it as its launcher (so ``tfl status`` sees it at once). One that exits before
    that: its refusal is raised here (``refusal``)."""
    run_dir = store.run_dir(run_id)
    with open_private(run_dir / "launcher.log") as log:
        offset = os.fstat(log.fileno()).st_size  # a resumed run's log holds its earlier launchers' lines
        child = subprocess.Popen([sys.executable, "-m", "launcher", *args],
                                 stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, HOME: str(store.home)})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            # Asked before the record is looked at: one that records the run, runs it and exits between the two looks is a run
            ended = child.poll() is not None
            if (run_dir / "state.json").exists() and store.load(run_id).launcher_pid == child.pid:
                return child.pid
            if ended:
                raise refusal(run_dir, offset, child.returncode)
            time.sleep(0.05)
    except KeyboardInterrupt:
        if _call_off(child, run_dir):
            raise
        raise interrupted(signal.SIGINT) from None
    return child.pid  # still preparing after the guard: it records the run when it can (`tfl status` shows it then)


def _call_off(child: subprocess.Popen[bytes], run_dir: Path) -> bool:
    """Ctrl-C while ``--detach`` waits is a no to the launch, not to the waiting alone: the background
    launcher (in a session of its own, which the terminal's SIGINT does not reach) gets it too, and so
    removes what it shipped to the hosts, or stops the run it recorded meanwhile, as a foreground
    launch would. Waited for (a second Ctrl-C leaves it to finish alone); a run dir it left with no
    record is removed, as a refusal's is. Returns whether the run was recorded (and so stopped)."""
    child.send_signal(signal.SIGINT)
    child.wait()
    if (run_dir / "state.json").exists():
        return True
    shutil.rmtree(run_dir, ignore_errors=True)
    return False


def refusal(run_dir: Path, offset: int, code: int) -> LaunchError:
    """Why a background launcher exited before recording its run: its own one-line error and exit
    code (a host's failed check, said as a foreground launch says it), and its run dir, holding no
    record, removed (a resume's has one); else (a crash) the last lines it wrote from ``offset`` of
    its log, which is kept."""
    try:
        with open(run_dir / "launcher.log", "rb") as f:
            f.seek(offset)
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    said = [line.removeprefix(ERROR_PREFIX) for line in lines if line.startswith(ERROR_PREFIX)]
    error = LaunchError(said[-1] if said else f"the detached launcher exited with code {code}: {' | '.join(lines[-3:])}")
    if said:
        error.exit_code = code if 0 < code < 256 else error.exit_code
        if not (run_dir / "state.json").exists():
            shutil.rmtree(run_dir, ignore_errors=True)
    return error


def launcher_notes(store: RunStore, run_id: str) -> list[str]:
    """The one-line warnings and notes a detached launcher wrote while preparing the run (a
    private network that could not be made, or has no route out): the terminal shows them too."""
    try:
        text = (store.run_dir(run_id) / "launcher.log").read_text(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.startswith(("tfl: warning: ", "tfl: note: "))]


def supervise_detached(plan_file: Path, config_json: str, store: RunStore) -> RunRecord:
    """The body of a detached launcher (``tfl _supervise``): a launch being prepared (``tfl status``
    lists it, ``tfl stop`` calls it off: ``records.preparing``) until its run is recorded."""
    plan = LaunchPlan.from_dict(json.loads(plan_file.read_text()))
    note_preparing(store.home, Preparing(plan.run_id, plan.run_dir, plan.job, time.time(), ProcessIdentity.of(os.getpid()),
                                         waiting_parent(), [(t.name, t.host) for t in plan.tasks], plan.network))
    try:
        return execute(prepare(plan), store, SupervisorConfig(**json.loads(config_json)), None, reserved=True,
                       announce=lambda: forget_preparing(plan.run_dir), exits_after=True)
    finally:
        end_preparing(store.home, plan.run_id, plan.run_dir)


def resume_detached(run_id: str, config_json: str, store: RunStore, address: str | None = None) -> RunRecord:
    """The body of a detached resume (``tfl _resume``)."""
    config = SupervisorConfig(**json.loads(config_json))
    prepared, record = resume(run_id, store, config, address)
    return supervise(prepared, store, record, config, None, exits_after=True)
