"""``tfl launch``: cluster spec -> plan -> preflight -> supervised run."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from launcher.console import say
from launcher.contract import HOME
from launcher.describe.hosts import RemoteOptions
from launcher.engines import registry
from launcher.engines.base import Backend
from launcher.engines.preflight import raise_failures
from launcher.errors import ERROR_PREFIX, InterruptedLaunchError, LaunchError, NoPrivateNetwork, UsageError
from launcher.files import open_private, write_atomic
from launcher.plan.build import build_plan, job_name
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.network import choose_network
from launcher.plan.resize import check_elastic
from launcher.plan.run_options import SupervisorConfig
from launcher.plan.storage import check_sharing, preemption_restarts
from launcher.records.identity import ProcessIdentity
from launcher.records.preparing import Preparing, end_preparing, forget_preparing, note_preparing, waiting_parent
from launcher.records.store import STOP_REQUEST, RunRecord, RunStore
from launcher.runs.resume import check_resumable, claim, move_to, recorded_plan
from launcher.supervise.supervisor import Supervisor, initial_record
from launcher.supervise.waker import Waker
from launcher.views.logs import LogFollower

# SIGINT (Ctrl-C) and SIGHUP (the terminal closed) come from a terminal: an inherited SIG_IGN
# (`nohup tfl launch`, `tfl launch … &` in a script) is kept. SIGTERM is how `tfl stop` asks,
# and how a machine going away says so (a preemption): always handled.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KEEP_IGNORED = frozenset({signal.SIGINT, signal.SIGHUP})
# The options of an elastic launch, as the cluster file's elastic block names them (``check_description``).
FILE_FIELDS = (("--min-tasks", "elastic.min_tasks"), ("--global-batch", "elastic.global_batch"),
               ("--elastic-batch", "elastic.batch"))
# The least a detached launch waits for its background launcher to record the run (``record_wait``).
RECORD_WAIT = 300.0
# A SIGINT this soon after the last one is the same Ctrl-C: `uv run tfl launch` passes the terminal's
# SIGINT on to tfl, which is in the terminal's process group too, so one press arrives twice, a few
# milliseconds apart. A person's second press comes later than this.
SAME_PRESS = 0.5


def make_plan(job: str, job_args: tuple[str, ...], spec: Any, store: RunStore,
              remote: RemoteOptions = RemoteOptions(), virtual_devices: int | None = None,
              config: SupervisorConfig | None = None, network: str = "auto") -> LaunchPlan:
    path = Path(job)
    if not path.is_file():
        raise UsageError(f"{job}: no such job script (give the path of a Python file, e.g. jobs/mnist.py)")
    run_id = store.new_run_id(job_name(job))
    for folder in remote.sync_dirs:
        if not os.path.isdir(folder):
            raise UsageError(f"--sync {folder}: no such directory (give a directory to copy to every SSH host)")
    plan = build_plan(spec, str(path.resolve()), job_args, run_id=run_id, run_dir=str(store.run_dir(run_id)),
                      python=sys.executable, cwd=os.getcwd(), remote=remote, virtual_devices=virtual_devices,
                      config=config)
    registry.name_for_plan(plan)  # one backend per run: refused here, before anything is written
    plan = choose_network(plan, network)
    if config is not None:
        plan = check_elastic(plan, min_tasks=config.min_tasks, batch=config.elastic_batch,
                             global_batch=config.global_batch, virtual_devices=virtual_devices)
    check_sharing(plan, config.max_restarts if config else 0)
    return plan


def check_description(spec: Any, runs_dir: str, python: str, cwd: str) -> None:
    """``tfl validate``: refuse what ``make_plan`` would refuse of a launch with the file's own
    options (its elastic block) and the defaults for the rest, as one line. What the command
    line can still answer is left to the launch: a shared ``--model-dir`` (assumed given), the
    elastic global batch (``--global-batch``; checked where the file gives it)."""
    from launcher.plan.resize import elastic_options

    config = SupervisorConfig(**elastic_options(spec, None, None, None))
    try:
        plan = build_plan(spec, f"{cwd}/JOB", ("--model-dir", "DIR"), run_id="RUN", run_dir=f"{runs_dir}/RUN",
                          python=python, cwd=cwd, config=config)
        registry.name_for_plan(plan)
        if config.min_tasks is not None:
            batch = config.elastic_batch if config.global_batch is not None else "per-replica"
            check_elastic(plan, min_tasks=config.min_tasks, batch=batch, global_batch=config.global_batch)
    except UsageError as exc:  # the launch's refusal, naming the file's fields instead of the options
        text = str(exc)
        for option, field in FILE_FIELDS:
            text = text.replace(option, field)
        raise UsageError(text) from None


def plan_launch(job: str, job_args: tuple[str, ...], spec: Any, store: RunStore, remote: RemoteOptions,
                virtual_devices: int | None, config: SupervisorConfig,
                max_preemptions: int | None, network: str = "auto") -> tuple[LaunchPlan, SupervisorConfig, str | None]:
    """``make_plan``, and the run's config with ``--max-preemptions`` as the plan allows it
    (``storage.preemption_restarts``: None = not given), and the note to show when it differs."""
    plan = make_plan(job, job_args, spec, store, remote, virtual_devices, config, network)
    taken, note = preemption_restarts(plan, max_preemptions, config.max_preemptions)
    return plan, dataclasses.replace(config, max_preemptions=taken), note


@dataclass
class Prepared:
    """A plan whose hosts passed their checks, with the backend that got them ready."""

    plan: LaunchPlan
    backend: Backend
    wake: Waker  # woken by the backend when a task may have exited


def prepare(plan: LaunchPlan) -> Prepared:
    """Get the plan's hosts ready (``Backend.prepare``: quick checks, code shipped); the first
    failed check raises, before the run exists, and nothing is left open."""
    wake = Waker()
    backend = registry.get(registry.name_for_plan(plan), notify=wake.wake)
    with _interrupted_by_signals(plan.run_dir) as disarm:
        try:
            raise_failures(backend.prepare(plan))
        except BaseException as exc:
            disarm()  # the hosts are being tidied: a second signal must not cut that short
            backend.close()
            if isinstance(exc, KeyboardInterrupt):  # Ctrl-C: said as SIGTERM and SIGHUP are, once tidied
                raise interrupted(signal.SIGINT) from None
            raise
    return Prepared(backend.resolve(plan), backend, wake)


def execute(prepared: Prepared, store: RunStore, config: SupervisorConfig, out: TextIO | None, *,
            colour: bool = False, reserved: bool = False, verbose: bool = False,
            announce: Callable[[], None] = lambda: None) -> RunRecord:
    """Start the plan and supervise it to the end, streaming every task's output to ``out``
    (without TensorFlow's known start-up noise unless ``verbose``). ``announce``: once the run is
    recorded (a store that refuses it names no run that never was)."""
    plan = prepared.plan
    record = initial_record(plan, created=time.time(), max_restarts=config.max_restarts, backend=prepared.backend.name)
    me = ProcessIdentity.of(os.getpid())
    record.launcher_pid, record.launcher_create_time, record.launcher_start_ticks = me.pid, me.create_time, me.start_ticks
    record.launcher_boot_id, record.launcher_host, record.grace_period = me.boot_id, me.host, config.grace_period
    record.config, record.min_tasks = asdict(config), config.min_tasks
    try:
        store.create(record, reserved=reserved)
    except BaseException:
        prepared.backend.close()
        raise
    announce()
    return supervise(prepared, store, record, config, out, colour=colour, verbose=verbose)


def resume(run_id: str, store: RunStore, config: SupervisorConfig, address: str | None = None) -> tuple[Prepared, RunRecord]:
    """``tfl resume``: the recorded run's plan, prepared on its backend again, and its record
    claimed for the next attempt (``launcher.runs.resume``); ``supervise`` runs it. ``address``: a Ray
    run's cluster at a new address (``move_to``)."""
    record = store.load(run_id)
    check_resumable(record, job=True)  # before the hosts are reached: a live run's ports would only confuse
    move_to(record, address)
    try:
        prepared = prepare(recorded_plan(record))
    except NoPrivateNetwork as exc:
        raise exc.resuming(run_id) from None
    try:
        return prepared, claim(store, run_id, config, address)
    except BaseException:
        prepared.backend.close()
        raise


def supervise(prepared: Prepared, store: RunStore, record: RunRecord, config: SupervisorConfig, out: TextIO | None, *,
              colour: bool = False, verbose: bool = False) -> RunRecord:
    """Supervise a recorded run to its end, following its logs to ``out``."""
    plan = prepared.plan
    supervisor = Supervisor(plan, record, store, config, backend=prepared.backend, wake=prepared.wake, say=say)
    follower = (LogFollower([(t.name, t.log_path) for t in plan.tasks], out, colour=colour, hide_noise=not verbose,
                            from_end=bool(record.attempt),  # a resumed run's earlier attempts are printed already
                            on_gone=lambda: say(f"tfl: the console's reader is gone (stdout closed); run {plan.run_id} "
                                                 f"goes on, its output in {plan.run_dir}/logs; Ctrl-C or `tfl stop` stops it")
                            ).start() if out else None)
    try:
        with _stop_on_signals(supervisor):
            return supervisor.run()
    finally:
        if follower:
            follower.stop()
        prepared.backend.close()


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
                       announce=lambda: forget_preparing(plan.run_dir))
    finally:
        end_preparing(store.home, plan.run_id, plan.run_dir)


def resume_detached(run_id: str, config_json: str, store: RunStore, address: str | None = None) -> RunRecord:
    """The body of a detached resume (``tfl _resume``)."""
    config = SupervisorConfig(**json.loads(config_json))
    prepared, record = resume(run_id, store, config, address)
    return supervise(prepared, store, record, config, None)


def interrupted(signum: signal.Signals, run_dir: str | None = None) -> InterruptedLaunchError:
    """The one line of a launch called off by ``signum`` while its hosts were made ready; exit 128 + it.
    A SIGTERM that `tfl stop` sent (its note in ``run_dir``) is said as that."""
    by = "`tfl stop`" if run_dir and signum == signal.SIGTERM and (Path(run_dir) / STOP_REQUEST).exists() else signum.name
    error = InterruptedLaunchError(f"stopped by {by} while the hosts were being made ready: no task started, "
                                   "and what was shipped to them is removed")
    error.exit_code = 128 + signum
    return error


@contextmanager
def _interrupted_by_signals(run_dir: str) -> Iterator[Callable[[], None]]:
    """SIGTERM and SIGHUP while the hosts are made ready raise ``InterruptedLaunchError`` (as Ctrl-C
    raises KeyboardInterrupt, said by ``prepare`` in the same line), once: their default action would
    end tfl at once, leaving the run's dirs and code on every host reached so far with no record ``tfl rm`` could find. The raise
    lands in ``prepare``, which closes the backend, and so removes them. Yields ``disarm``."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    armed = True

    def disarm() -> None:
        nonlocal armed
        armed = False

    def handler(signum: int, frame: object) -> None:
        if armed:
            disarm()
            raise interrupted(signal.Signals(signum), run_dir)

    handled = [s for s in (signal.SIGTERM, signal.SIGHUP) if not (s in KEEP_IGNORED and signal.getsignal(s) == signal.SIG_IGN)]
    previous = {s: signal.signal(s, handler) for s in handled}
    try:
        yield disarm
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def _stop_on_signals(supervisor: Supervisor) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the run gracefully: the tasks get the notice and the
    grace to save the agreed checkpoint. A second SIGINT (Ctrl-C twice) forces SIGKILL, unless it
    came within ``SAME_PRESS`` of the last one: that is the same press, relayed by `uv run`.
    SIGTERM and SIGHUP never force: `tfl stop` sends SIGTERM, and running it twice must not
    cut the tasks' grace short. A SIGTERM that `tfl stop` did not send ends the run PREEMPTED
    (``Supervisor.request_stop(notice=True)``). The handler takes no lock (``Waker``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupts = 0
    last_interrupt = float("-inf")
    busy = False

    def handler(signum: int, frame: object) -> None:
        # Python runs a handler between two bytecodes, also inside this handler: under a storm of
        # signals each would nest in the last until RecursionError. A signal that lands while the
        # handler runs only counts (a second Ctrl-C still forces); the stop is under way already.
        nonlocal interrupts, last_interrupt, busy
        if signum == signal.SIGINT:
            now = time.monotonic()
            if now - last_interrupt >= SAME_PRESS:  # not the copy of the last press `uv run` relayed
                interrupts += 1
                last_interrupt = now
        if busy:
            return
        busy = True
        try:
            # SIGTERM: this machine is going away (a preemption), unless `tfl stop` sent it (the supervisor tells).
            supervisor.request_stop(force=interrupts > 1, notice=signum == signal.SIGTERM)
            if interrupts > 1:  # a second Ctrl-C that landed while the first was handled
                supervisor.request_stop(force=True)
        except RecursionError:
            supervisor.request_stop()  # a storm that nested anyway: the flags are what matters
        finally:
            busy = False

    handled = [s for s in STOP_SIGNALS if not (s in KEEP_IGNORED and signal.getsignal(s) == signal.SIG_IGN)]
    previous = {s: signal.signal(s, handler) for s in handled}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
