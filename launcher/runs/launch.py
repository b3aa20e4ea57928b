"""``tfl launch``: cluster spec -> plan -> preflight -> supervised run."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from launcher.console import say
from launcher.describe.hosts import RemoteOptions
from launcher.engines import registry
from launcher.engines.base import Backend
from launcher.engines.preflight import raise_failures
from launcher.errors import InterruptedLaunchError, NoPrivateNetwork, UsageError
from launcher.plan.build import build_plan, job_name
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.network import choose_network
from launcher.plan.resize import check_elastic
from launcher.plan.run_options import SupervisorConfig
from launcher.plan.storage import check_sharing, preemption_restarts
from launcher.records.identity import ProcessIdentity
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
            announce: Callable[[], None] = lambda: None, exits_after: bool = False) -> RunRecord:
    """Start the plan and supervise it to the end, streaming every task's output to ``out``
    (without TensorFlow's known start-up noise unless ``verbose``). ``announce``: once the run is
    recorded (a store that refuses it names no run that never was). ``exits_after``: see ``supervise``."""
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
    return supervise(prepared, store, record, config, out, colour=colour, verbose=verbose, exits_after=exits_after)


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
              colour: bool = False, verbose: bool = False, exits_after: bool = False) -> RunRecord:
    """Supervise a recorded run to its end, following its logs to ``out``. ``exits_after``: this
    process ends with the run (tfl's own launch): a SIGTERM or SIGHUP that comes once the run has
    ended is ignored from then on, so that it still says its summary and exits with the run's code."""
    plan = prepared.plan
    supervisor = Supervisor(plan, record, store, config, backend=prepared.backend, wake=prepared.wake, say=say)
    follower = (LogFollower([(t.name, t.log_path) for t in plan.tasks], out, colour=colour, hide_noise=not verbose,
                            from_end=bool(record.attempt),  # a resumed run's earlier attempts are printed already
                            on_gone=lambda: say(f"tfl: the console's reader is gone (stdout closed); run {plan.run_id} "
                                                 f"goes on, its output in {plan.run_dir}/logs; Ctrl-C or `tfl stop` stops it")
                            ).start() if out else None)
    try:
        with _stop_on_signals(supervisor, exits_after):
            return supervisor.run()
    finally:
        if follower:
            follower.stop()
        prepared.backend.close()


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
def _stop_on_signals(supervisor: Supervisor, exits_after: bool = False) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP stop the run gracefully: the tasks get the notice and the
    grace to save the agreed checkpoint. A second SIGINT (Ctrl-C twice) forces SIGKILL, unless it
    came within ``SAME_PRESS`` of the last one: that is the same press, relayed by `uv run`.
    SIGTERM and SIGHUP never force: `tfl stop` sends SIGTERM, and running it twice must not
    cut the tasks' grace short. A SIGTERM that `tfl stop` did not send ends the run PREEMPTED
    (``Supervisor.request_stop(notice=True)``). The handler takes no lock (``Waker``). With
    ``exits_after``, a run that has ended leaves SIGTERM and SIGHUP to a handler that does
    nothing (``_after_the_run``) rather than back to their default, which would end the process
    at once: a `tfl stop` in the run's last milliseconds would cut its summary, and a run that
    succeeded would exit 143."""
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
        ended = exits_after and supervisor.record.state.is_terminal
        for s, h in previous.items():
            signal.signal(s, _after_the_run if ended and s != signal.SIGINT else h)


def _after_the_run(signum: int, frame: object) -> None:
    """A SIGTERM or SIGHUP once the run has ended: nothing left to stop, and the summary and exit code
    still to come. A handler, never SIG_IGN, which every process started afterwards would inherit (a
    launcher then took SIGHUP as ignored by `nohup`)."""
