"""Plain-text rendering of runs, tasks and the end-of-run summary."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence, TextIO

from launcher.contract import (
    LEFT_UNSAVED_PHASE,
    PREEMPTED_EXIT_CODE,
    PREEMPTED_PHASE,
    REPLAY_PHASE,
    ModelDirLayout,
    ProgressRecord,
)
from launcher.engines.base import NO_ANSWER
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.storage import EXAMPLE, restart_need
from launcher.records.states import RunState, TaskState
from launcher.records.store import FailureRecord, RunRecord, UnreadableRun
from launcher.tasks import TaskId
from launcher.views.diagnosis import known_fix
from launcher.views.status import PENDING, PREPARING, RunView, TaskView, read_progress
from launcher.views.tensorboard import model_dir_of


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h).upper() for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def duration(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def runs_table(views: Sequence[RunView], unreadable: Sequence[UnreadableRun] = (), hidden: int = 0) -> str:
    """The runs, oldest first; an unreadable record is a row too, its reason below the table;
    ``hidden`` older runs left out are counted on a last line."""
    if not views and not unreadable:
        return "no runs yet (start one with `tfl launch JOB --local 2`)"
    rows: list[tuple[float, tuple[str | None, ...]]] = [
        (v.started, (v.run_id, v.job.rsplit("/", 1)[-1], f"{v.state} on {v.elsewhere}" if v.elsewhere else v.state,
                     f"{v.alive}/{v.total}", _when(v.started), duration(v.duration_s)))
        for v in views]
    rows += [(u.created, (u.run_id, None, "unreadable", None, _when(u.created), None)) for u in unreadable]
    text = table(("run", "job", "state", "alive", "started", "duration"), [r for _, r in sorted(rows, key=lambda r: r[0])])
    more = [f"… and {hidden} older run(s): `tfl status --all` lists every run"] if hidden else []
    return "\n".join([text, *(f"{u.run_id}: unreadable: {u.reason}" for u in unreadable), *more])


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))


def progress_text(data: dict[str, Any] | None, bar_width: int = 0) -> str | None:
    progress = ProgressRecord.from_dict(data)
    if progress is None:
        return None
    parts = []
    fraction = progress.fraction
    if bar_width and fraction is not None:
        filled = int(round(fraction * bar_width))
        parts.append(f"[{'#' * filled}{'.' * (bar_width - filled)}] {fraction * 100:3.0f}%")
    if progress.phase in ("done", PREEMPTED_PHASE):
        parts.append(progress.phase if progress.phase == "done" else f"preempted at step {progress.global_step}")
    if progress.phase == LEFT_UNSAVED_PHASE:
        parts.append("left without saving")
    if progress.phase == REPLAY_PHASE:
        parts.append(f"replaying {progress.global_step} batches to the resume step")
    parts.append(f"epoch {progress.epoch}/{progress.epochs}")
    if progress.steps_per_epoch:
        parts.append(f"step {progress.step}/{progress.steps_per_epoch}")
    if progress.loss is not None:
        parts.append(f"loss {progress.loss:.4f}")
    if progress.examples_per_sec:
        parts.append(f"{progress.examples_per_sec:.0f} ex/s")
    return " ".join(parts)


SHOW_ALL_UP_TO = 16  # tasks: a run this small shows every task; a larger one a summary (``every``: all)
SHOWN = 5  # of the slowest tasks
FAILED_SHOWN = 10
TROUBLE = ("failed", "gone", "unreachable", NO_ANSWER)  # a task's state that the summary lists by name


def run_detail(view: RunView, bar_width: int = 0, every: bool = False) -> str:
    head = [f"run {view.run_id}  {view.state}  ({view.alive}/{view.total} tasks alive, "
            f"{duration(view.duration_s)}, {view.restarts} restart(s)"
            f"{f', {view.preemptions} after a preemption' if view.preemptions else ''})"]
    head.append(f"  network: {network_text(view)}")
    if view.elsewhere:
        head.append(f"  its launcher runs on host {view.elsewhere}: this machine cannot see its processes "
                    f"(run `tfl status {view.run_id}` there)")
    if view.message:
        head.append(f"  {view.message}")
    head += cut_evaluators(view.state, ((t.task, t.state, t.progress) for t in view.tasks))
    if view.backend_state:
        head.append(f"  {view.backend}: " + ", ".join(f"{key} {value}" for key, value in view.backend_state.items()))
    head += [f"  restart {i}: {reason}" for i, reason in enumerate(view.restart_reasons, 1)]
    head += _elastic_lines(view)
    if view.from_launcher:
        head.append(f"  tasks as its launcher (pid {view.launcher_pid}) knows them: the hosts of a run this size are not "
                    "asked (no cpu%, rss_mb), while the launcher hears every one")
    if view.silent_hosts:
        head.append(f"  {len(view.silent_hosts)} host(s) did not answer in time: {_some(view.silent_hosts, 20)}")
    if every or len(view.tasks) <= SHOW_ALL_UP_TO:
        return "\n".join(head) + "\n" + _tasks_table(view.tasks, bar_width)
    return "\n".join(head + _task_summary(view, bar_width))


def _tasks_table(tasks: Sequence[TaskView], bar_width: int = 0) -> str:
    return table(("task", "host", "state", "pid", "cpu%", "rss_mb", "uptime", "exit", "progress"),
                 [_task_row(t, bar_width) for t in tasks])


def _some(items: Sequence[str], limit: int) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _task_summary(view: RunView, bar_width: int) -> list[str]:
    """A large run: counts by state, then the tasks in trouble and the slowest, by name."""
    counts: dict[str, int] = {}
    for task in view.tasks:
        counts[task.state] = counts.get(task.state, 0) + 1
    lines = [f"  tasks: {', '.join(f'{n} {state}' for state, n in sorted(counts.items(), key=lambda c: -c[1]))}"]
    trouble = [t for t in view.tasks if t.state in TROUBLE or (t.exit_code not in (None, 0) and t.state != "stopped")]
    if trouble:
        lines += [f"failed or not answering ({len(trouble)}{f', the first {FAILED_SHOWN}' if len(trouble) > FAILED_SHOWN else ''}):",
                  _tasks_table(trouble[:FAILED_SHOWN], bar_width)]
    behind = sorted((t for t in view.tasks if t.alive and ProgressRecord.from_dict(t.progress) is not None),
                    key=lambda t: _done(t.progress))
    if behind:
        lines += [f"slowest ({min(SHOWN, len(behind))} of {len(behind)} with progress):", _tasks_table(behind[:SHOWN], bar_width)]
    return lines + [f"`tfl status {view.run_id} --all` shows all {len(view.tasks)} tasks"]


def _done(progress: dict[str, Any] | None) -> tuple[float, int]:
    record = ProgressRecord.from_dict(progress)
    if record is None:
        return (2.0, 0)
    return (record.fraction if record.fraction is not None else 1.0, record.global_step)


NETWORK_TEXT = {"private": "private (the tasks' own network namespace: their ports are reachable only by each other)",
                "host": "host (the task ports are open to this machine's networks; docs/security.md)"}


def network_text(view: RunView) -> str:
    """Who reaches the task ports: ``host`` means this machine's networks only for a local run."""
    if view.network == "host" and view.fenced:
        return "host, fenced (the task ports admit only the run's hosts: ssh.firewall; docs/security.md)"
    if view.network == "host" and view.backend != "local":
        return "host (the task ports are open to the networks of the hosts they run on; docs/security.md)"
    return NETWORK_TEXT.get(view.network, view.network)


LIVE_STATES = {PREPARING, RunState.STARTING.value, PENDING, RunState.RUNNING.value, RunState.RESTARTING.value}


def _elastic_lines(view: RunView) -> list[str]:
    """An elastic run's size, lost hosts and resizes (``tfl status RUN``)."""
    if view.min_tasks is None:
        return []
    lines = [f"  elastic: {view.training_tasks} of {view.full_training_tasks} training tasks (--min-tasks {view.min_tasks})"
             + (f"; lost: {', '.join(f'{h} ({why})' for h, why in sorted(view.lost_hosts.items()))}"
                if view.lost_hosts else "")
             + ("; below the minimum: waiting for lost hosts to return (--elastic-wait)"
                if view.training_tasks < view.min_tasks and view.state in LIVE_STATES else "")]
    return lines + [f"  resize at attempt {r['attempt']}: {r['from_tasks']} -> {r['to_tasks']} tasks; {r['reason']}"
                    for r in view.resizes]


def _task_row(t: TaskView, bar_width: int = 0) -> tuple[Any, ...]:
    return (t.task, t.host, t.state, t.pid, t.cpu_percent, t.rss_mb, duration(t.uptime_s), t.exit_code,
            progress_text(t.progress, bar_width))


def watch(draw: Callable[[], tuple[str, bool]], out: TextIO, interval: float = 1.0, *, clear: bool = True) -> None:
    """Redraw ``draw()``'s text every ``interval`` s until it says it is done (or Ctrl-C).
    ``clear``: wipe the screen first (a terminal); else each frame follows the last."""
    while True:
        text, done = draw()
        out.write(("\033[H\033[2J" if clear else "") + text + "\n" + ("" if clear else "\n"))
        out.flush()
        if done:
            return
        time.sleep(interval)


def watch_run(view_of: Callable[[], RunView], out: TextIO, interval: float = 1.0, *, clear: bool = True,
              every: bool = False) -> None:
    """Redraw the run's table with a progress bar per task until the run has ended."""
    def draw() -> tuple[str, bool]:
        view = view_of()
        return run_detail(view, bar_width=20, every=every), view.state not in (*LIVE_STATES, RunState.STOPPING.value)

    watch(draw, out, interval, clear=clear)


def summary(record: RunRecord) -> str:
    """The end-of-run summary: outcome, and for a failure its root cause."""
    took = duration((record.ended or time.time()) - record.created)
    if record.state == RunState.SUCCEEDED:
        lines = [f"tfl: run {record.run_id} succeeded in {took} ({restart_counts(record)})"]
    elif record.state == RunState.STOPPED:
        message = record.message or "stopped by the user"
        by_user = message.startswith("stopped by the user")
        lines = [f"tfl: run {record.run_id} stopped by the user after {took}{message.removeprefix('stopped by the user')}"
                 if by_user else f"tfl: run {record.run_id} stopped after {took}: {message}"]
    else:
        said = (record.message or "").removeprefix(f"{record.state.value}: ")
        lines = [f"tfl: run {record.run_id} {record.state.value} after {took}: {said}"]
    for restart in record.restarts:
        lines.append(f"  restart {restart.attempt}: {restart.reason}")
    for resize in record.resizes:
        lines.append(f"  resize at attempt {resize.attempt}: {resize.from_tasks} -> {resize.to_tasks} training tasks; "
                     f"{resize.reason}")
    if record.state == RunState.FAILED and record.failures:
        last = [f for f in record.failures if f.attempt == record.attempt and not f.task.startswith("evaluator")]
        failed = [f for f in last if f.exit_code != PREEMPTED_EXIT_CODE] or last  # a preemption before it is not the cause
        lines += _failure_lines("root cause", min(failed or record.failures, key=lambda f: f.time))
    lines += [line for f in record.failures if f.task.startswith("evaluator") for line in _failure_lines("evaluator", f)]
    lines += cut_evaluators(record.state.value, ((t.task, t.state.value, read_progress(t.progress_path)) for t in record.tasks),
                            record.config.get("evaluator_timeout"))
    if record.state == RunState.FAILED and record.stopped_because_of_failure:
        lines.append(f"  stopped because of it: {', '.join(record.stopped_because_of_failure)}")
    lines.append(f"  logs: {record.run_dir}/logs   status: tfl status {record.run_id}")
    if record.state in (RunState.STOPPED, RunState.PREEMPTED, RunState.FAILED):
        lines += _resume_hint(record)
    return "\n".join(lines)


def cut_evaluators(state: str, tasks: Iterable[tuple[str, str, dict[str, Any] | None]], timeout: object = None) -> list[str]:
    """A succeeded run's evaluator (``tasks``: name, state, progress) that was not done when training ended:
    the supervisor stopped it at ``--evaluator-timeout``, so its last evaluation, if any, need not be the
    final checkpoint's."""
    if state != RunState.SUCCEEDED.value:
        return []
    after = f" {timeout:g} s after training ended" if isinstance(timeout, (int, float)) else " after training ended"
    return [f"  evaluator: {name} was stopped{after} (--evaluator-timeout), before it was done: "
            f"{f'its last evaluation {last}' if (last := progress_text(progress)) else 'it evaluated no checkpoint'}; "
            "a longer --evaluator-timeout lets it evaluate the final checkpoint"
            for name, task_state, progress in tasks
            if task_state == TaskState.STOPPED.value and not TaskId.parse(name).is_training]


def _resume_hint(record: RunRecord) -> list[str]:
    """How to resume the run, or why a resume would be refused (``tfl resume``'s own rule):
    never a suggestion that ends in a refusal."""
    if not record.plan:  # it never started: there is nothing to resume
        return []
    unseen = restart_need(LaunchPlan.from_dict(record.plan))
    if unseen is not None:
        return [f"  no resume: the chief's checkpoint on {unseen[0]} is not seen on {', '.join(unseen[1])} (no shared "
                f"storage); launch the job again with {EXAMPLE} in the cluster file or a shared --model-dir"]
    fix = " (once its cause is fixed)" if record.state == RunState.FAILED else ""
    kept = kept_checkpoint(record)
    if kept is None:  # the model dir is not readable here: only its host could say
        return [f"  resume it{fix} from its last checkpoint, if the job kept one (else from the start): "
                f"tfl resume {record.run_id}"]
    if not kept:
        return [f"  resume it{fix}: tfl resume {record.run_id} (the job kept no checkpoint in its model dir "
                f"{model_dir_of(record).path}: it starts over)"]
    return [f"  resume it{fix} from its last checkpoint: tfl resume {record.run_id}"]


def kept_checkpoint(record: RunRecord) -> bool | None:
    """Whether the run's model dir holds a checkpoint or backup to resume from, or None when this
    machine cannot read the model dir (on another host, or a cluster's storage not mounted here). A
    preempted run is no exception: its model dir may have been removed since (the agreed checkpoint
    is then gone too)."""
    where = model_dir_of(record)
    if where.host is not None or "://" in where.path:
        return None
    if record.backend != "local" and not os.path.isdir(where.path):
        return None  # storage the cluster's nodes mount (Slurm, Ray, SSH) need not be mounted here
    layout = ModelDirLayout(Path(where.path))
    return (any(_holds_files(d) for d in (layout.checkpoints, layout.backup)) or layout.preempted_file.exists()
            or _saved_elsewhere(layout))


def _holds_files(directory: Path) -> bool:
    try:
        return any(directory.iterdir())
    except OSError:
        return False


def _saved_elsewhere(layout: ModelDirLayout) -> bool:
    """A TensorFlow checkpoint (its ``.index`` file) anywhere else in the model dir: where a custom loop's
    ``jobkit.preemption_handler`` saves (``jobs/custom_loop.py``: ``<model dir>/preemption``)."""
    for top, dirs, files in os.walk(layout.root):
        dirs[:] = [d for d in dirs if os.path.join(top, d) != str(layout.tensorboard)]  # summaries only
        if any(name.endswith(".index") for name in files):
            return True
    return False


def restart_counts(record: RunRecord) -> str:
    """``2 restart(s)``, with the preemptions and resumes among them named."""
    kinds = [r.kind for r in record.restarts]
    apart = [f"{kinds.count(k)} after a {k}" for k in ("preemption",) if kinds.count(k)]
    apart += [f"{kinds.count('resume')} by tfl resume"] if "resume" in kinds else []
    return f"{len(kinds)} restart(s)" + (f": {', '.join(apart)}" if apart else "")


def _failure_lines(label: str, failure: FailureRecord) -> list[str]:
    if failure.of_run:  # the whole unit ended under the tasks: no task to name, no log of one to show
        return [f"  {label}: {failure.reason}"]
    pid = f" (pid {failure.pid})" if failure.pid is not None else ""  # None: it ended before its pid was known
    said = "last lines of its log:" if failure.log_tail else "its log holds nothing"
    lines = [f"  {label}: {failure.task} on {failure.host}{pid} {failure.reason}; {said}"]
    fix = known_fix(failure.log_tail)
    return lines + [f"    | {line}" for line in failure.log_tail] + ([f"  fix: {fix}"] if fix else [])
