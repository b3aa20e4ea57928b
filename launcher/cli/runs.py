"""The commands about recorded runs, from any terminal: status, stop, logs, rm, prune,
tensorboard."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from launcher.cli.app import _colour, _Command, _core, _fail, _run_ids, _RunsCommand, _store, app
from launcher.console import say
from launcher.errors import TflError


# RUN is read from the context's extra arguments, not declared as a typer.Argument: typer 0.29
# coerces every non-flag parameter through a pydantic TypeAdapter, whose import alone costs
# `tfl status` a third of its time (docs/benchmarks.md §1). Flags skip that coercion.
@app.command(cls=_RunsCommand, context_settings={"allow_extra_args": True}, options_metavar="[OPTIONS] [RUN]")
def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="machine-readable output (the same runs as the table)"),
    watch: bool = typer.Option(False, "--watch", "-w", help="a live view, redrawn every second (Ctrl-C ends it)"),
    every: bool = typer.Option(False, "--all", "-a", help="list every run, not only the active and the 20 latest; "
                                                              "with RUN: every task, not a summary"),
) -> None:
    """Show the runs, or one run's tasks (state, pid, cpu, memory, progress).

    RUN is a run id or a unique prefix of one. Without it: the active runs and the 20
    latest (whose record changed last), oldest first; --all lists every run. With RUN, a run
    of up to 16 tasks shows each; a larger one a summary (counts by state, the tasks failed or
    not answering, the slowest); --all shows every task.
    """
    from launcher.views.report import run_detail, runs_table
    from launcher.views.status import one_view, run_list

    if len(ctx.args) > 1:
        raise _fail(f"status takes one RUN, got {len(ctx.args)}: {' '.join(ctx.args)} (see `tfl status --help`)")
    run = ctx.args[0] if ctx.args else None
    store = _store()
    if watch:
        _watch_status(store, run, every)
        return
    if run is None:
        views, unreadable, hidden = run_list(store, every=every)
        rows = [v.to_dict() for v in views] + [u.to_dict() for u in unreadable]
        typer.echo(json.dumps(rows, indent=1) if as_json else runs_table(views, unreadable, hidden))
        return
    view = _core(lambda: one_view(store, run))
    typer.echo(json.dumps(view.to_dict(), indent=1) if as_json else run_detail(view, every=every))


def _watch_status(store: Any, run: str | None, every: bool) -> None:
    """``tfl status --watch``: one run until it ends, or the list until Ctrl-C."""
    from launcher.views.report import runs_table, watch, watch_run
    from launcher.views.status import one_view, run_list

    clear = sys.stdout.isatty()
    try:
        if run is not None:
            watch_run(lambda: one_view(store, run), sys.stdout, clear=clear, every=every)
        else:
            watch(lambda: (runs_table(*run_list(store, every=every)), False), sys.stdout, clear=clear)
    except KeyboardInterrupt:
        pass
    except TflError as exc:
        raise _fail(str(exc), exc.exit_code) from None


@app.command(cls=_Command)
def stop(
    run: str | None = typer.Argument(None, help="run id or unique prefix (default: the latest active run)",
                                     autocompletion=_run_ids),
    grace_period: float | None = typer.Option(None, "--grace-period", min=0,
                                              help="seconds from the notice (SIGTERM) to SIGKILL (default: the run's own)"),
) -> None:
    """Stop a run: every task gets the notice (SIGTERM) and the grace to save the agreed checkpoint,
    then SIGKILL; also when its launcher was killed. Stopping twice is fine. `tfl resume` continues it."""
    from launcher.runs.stop import stop_ref

    store = _store()
    typer.echo(_core(lambda: stop_ref(store, run, grace_period)))


@app.command(cls=_Command)
def resume(
    run: str | None = typer.Argument(None, help="run id or unique prefix (default: the latest run)", autocompletion=_run_ids),
    detach: bool = typer.Option(False, "--detach", "-d", help="supervise in the background; print the run id and return"),
    max_restarts: int | None = typer.Option(None, "--max-restarts", min=0, help="instead of the run's own"),
    max_preemptions: int | None = typer.Option(None, "--max-preemptions", min=0, help="instead of the run's own"),
    grace_period: float | None = typer.Option(None, "--grace-period", min=0, help="instead of the run's own"),
    address: str | None = typer.Option(None, "--address", metavar="HOST:PORT",
                                       help="a Ray run: its cluster's new address, once started again elsewhere "
                                            "(default: the address the run recorded)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also show TensorFlow's known start-up noise"),
) -> None:
    """Continue a stopped, preempted or failed run from its last checkpoint: the same plan, hosts and
    model dir, the next attempt. Refused for a run that succeeded or still runs."""
    from launcher.runs import launch as core
    from launcher.runs.detach import detach_resume
    from launcher.runs.resume import resume_config, starts_over
    from launcher.views.report import summary

    store = _store()
    record = _core(lambda: store.resolve(run))
    config = resume_config(record, {"max_restarts": max_restarts, "max_preemptions": max_preemptions,
                                    "grace_period": grace_period})
    note = starts_over(record)
    if detach:
        pid = _core(lambda: detach_resume(record.run_id, store, config, address))
        typer.echo(record.run_id)
        typer.echo(f"tfl: run {record.run_id} resumed in the background (pid {pid}); follow it with "
                   f"`tfl logs {record.run_id} --follow`, end it with `tfl stop {record.run_id}`", err=True)
        if note:
            say(note)
        return
    prepared, claimed = _core(lambda: core.resume(record.run_id, store, config, address))
    typer.echo(f"tfl: resuming run {record.run_id} (attempt {claimed.attempt}); logs in {record.run_dir}/logs", err=True)
    if note:
        say(note)
    done = _core(lambda: core.supervise(prepared, store, claimed, config, sys.stdout, colour=_colour(), verbose=verbose,
                                        exits_after=True))
    say(summary(done))
    raise typer.Exit(done.exit_code or 0)


@app.command(cls=_Command, context_settings={"allow_extra_args": True})
def logs(
    ctx: typer.Context,
    run: str | None = typer.Argument(None, help="run id or unique prefix (default: the latest run)",
                                     autocompletion=_run_ids),
    task: str | None = typer.Option(None, "--task", "-t", help="only this task, e.g. chief:0"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the run ends"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also show TensorFlow's known start-up noise"),
    tail: int | None = typer.Option(None, "--tail", "-n", min=0, help="only each task's last N lines so far (then, "
                                    "with --follow, every new line)"),
) -> None:
    """Print a run's task logs, each line prefixed with its task.

    TensorFlow's known start-up noise (oneDNN, CUDA stubs, cuInit without a driver, gRPC and
    coordination-service lines) is hidden and counted per task; --verbose shows every line.
    """
    from launcher.runs.stop import logs_of, show_logs

    if ctx.args:  # `tfl logs RUN chief:0`: a task is given with --task, and saying so beats "unexpected extra argument"
        raise _fail(f"logs takes one RUN, got also {' '.join(ctx.args)}; for one task's log give --task, e.g. "
                    f"`tfl logs {run or 'RUN'} --task {ctx.args[0] if ':' in ctx.args[0] else 'chief:0'}`")
    store = _store()
    record = _core(lambda: logs_of(store, run))
    try:
        _core(lambda: show_logs(store, record, sys.stdout, task=task, follow=follow, colour=_colour(), verbose=verbose,
                                   tail=tail))
    except KeyboardInterrupt:
        pass  # a user who stops following did not fail: exit 0, as `tfl status --watch` and `tfl tensorboard`


@app.command(cls=_Command)
def rm(runs: list[str] = typer.Argument(..., help="run ids or unique prefixes", autocompletion=_run_ids),
       force: bool = typer.Option(False, "--force", help="remove the record even when part of the run stays on a "
                                  "host that could not be reached (tfl then forgets it)")) -> None:
    """Remove finished runs: their record, logs and default model dir here, and what they left
    on SSH hosts. A running run is kept (exit 1); so is one with a host that could not be
    reached, named, until `tfl rm` again once it is back (or --force)."""
    from launcher.runs.prune import rm_runs

    outcome = _core(lambda: rm_runs(_store(), runs, force=force))
    typer.echo(outcome.render())
    raise typer.Exit(1 if outcome.refused or outcome.held else 0)


@app.command(cls=_Command)
def prune(
    older_than: str | None = typer.Option(None, "--older-than", help="runs that ended longer ago than this, e.g. 7d, 12h "
                                          "(default 7d when --keep is not given)"),
    keep: int | None = typer.Option(None, "--keep", help="keep the N latest runs whatever their age (default: none; "
                                    "--older-than alone decides)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="say what would be removed; remove nothing"),
) -> None:
    """Remove finished runs older than --older-than and beyond the --keep latest (as `tfl rm`).
    Running runs are never touched; one with a host that could not be reached is kept (exit 1)."""
    from launcher.runs.prune import prune_runs

    outcome = _core(lambda: prune_runs(_store(), older_than=older_than, keep=keep, dry_run=dry_run))
    typer.echo(outcome.render())
    raise typer.Exit(1 if outcome.held else 0)  # part of a run stays on a host it could not reach: its record too


@app.command(cls=_Command)
def tensorboard(
    run: str | None = typer.Argument(None, help="run id or unique prefix (default: the latest run)", autocompletion=_run_ids),
    port: int | None = typer.Option(None, "--port", "-p", min=1, max=65535,
                                    help="port on 127.0.0.1 (default: the first free from 6006)"),
) -> None:
    """TensorBoard on a run's model dir (also while it runs); prints the URL, Ctrl-C stops it.
    A model dir on another host: prints how to reach it through SSH instead."""
    from launcher.views.tensorboard import serve

    store = _store()
    record = _core(lambda: store.resolve(run))
    raise typer.Exit(_core(lambda: serve(record, port, sys.stdout)))
