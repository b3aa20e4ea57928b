"""The ``tfl`` command line. Thin: parse, make one call into the core, render.

Only this module imports typer and decides exit codes. TensorFlow and fabric are never
imported here: the commands that need fabric import it through the backends, lazily.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

from launcher.errors import TflError


def _help_flag_false(option: Any) -> Any:
    """typer 0.29 leaves ``--help``'s value None when it is not given, so every command call
    builds a pydantic TypeAdapter to coerce that None (a third of `tfl status`'s time,
    docs/benchmarks.md §1). With False, a bool, typer skips the coercion; nothing else changes."""
    if option is not None:
        option.default = False
    return option


_COMPLETION_FLAGS = ("install_completion", "show_completion")


class _Group(TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:
        return _help_flag_false(super().get_help_option(ctx))

    def get_params(self, ctx: Any) -> list[Any]:
        # typer's --install-completion / --show-completion default to None too: the same fix.
        return [_help_flag_false(p) if p.name in _COMPLETION_FLAGS and p.default is None else p
                for p in super().get_params(ctx)]


class _Command(TyperCommand):
    def get_help_option(self, ctx: Any) -> Any:
        return _help_flag_false(super().get_help_option(ctx))


def _run_ids(incomplete: str) -> list[str]:
    """Shell completion of RUN: the run dirs' names (a directory listing, no record read)."""
    from launcher.runindex import run_ids
    from launcher.runstore import default_home

    return run_ids(default_home() / "runs", incomplete)


class _RunsCommand(_Command):
    """A command whose RUN comes from its extra arguments (``status``): completes run ids too."""

    def shell_complete(self, ctx: Any, incomplete: str) -> list[Any]:
        from typer._click.shell_completion import CompletionItem  # typer's own click

        found = [] if incomplete.startswith("-") or ctx.args else [CompletionItem(r) for r in _run_ids(incomplete)]
        return found + list(super().shell_complete(ctx, incomplete))


app = typer.Typer(
    name="tfl", no_args_is_help=True, add_completion=True, rich_markup_mode=None, cls=_Group,
    help="Launch, supervise and inspect TensorFlow multi-worker training runs.",
    pretty_exceptions_enable=False,
)
T = TypeVar("T")


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"tfl: error: {message}", err=True)
    return typer.Exit(code)


def _core(call: Callable[[], T]) -> T:
    """Run one call into the core; the launcher's own faults become one line on stderr."""
    try:
        return call()
    except TflError as exc:
        raise _fail(str(exc), exc.exit_code) from None


def _colour() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _store() -> Any:
    from launcher.runstore import RunStore

    return RunStore()


@app.command(cls=_Command, context_settings={"allow_extra_args": True})
def launch(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="the job script, e.g. jobs/mnist.py; its own arguments go after --"),
    cluster: Path | None = typer.Option(None, "--cluster", "-c", help="cluster description (JSON)"),
    local: int | None = typer.Option(None, "--local", help="emulate a cluster: a chief and N-1 workers on free localhost ports"),
    slurm: bool = typer.Option(False, "--slurm", help="inside a Slurm allocation (salloc, sbatch): one task per allocated task"),
    evaluator: bool = typer.Option(False, "--evaluator", help="with --local or --slurm: add a sidecar evaluator"),
    virtual_devices: int | None = typer.Option(None, "--virtual-devices", min=1,
                                               help="split each task's GPU (or its CPU) into N logical devices for its strategy"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would run where; start nothing, write nothing"),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="restart the whole group up to K times after a failure"),
    retry_on: str = typer.Option("any", "--retry-on", help="which failures are restarted: any | preemption (exit 143 / SIGTERM)"),
    grace_period: float = typer.Option(5.0, "--grace-period", min=0, help="seconds between SIGTERM and SIGKILL when stopping tasks"),
    evaluator_timeout: float = typer.Option(600.0, "--evaluator-timeout", min=0, help="seconds the evaluator may run after training ends"),
    stall_timeout: float | None = typer.Option(None, "--stall-timeout", min=0, help="no progress for S seconds = failed"),
    detach: bool = typer.Option(False, "--detach", "-d", help="supervise in the background; print the run id and return"),
    sync: list[Path] = typer.Option([], "--sync", help="SSH hosts: also copy this directory's contents to their working dir (repeatable)"),
    no_sync: bool = typer.Option(False, "--no-sync", help="SSH hosts: copy nothing; the job is already there at the same path"),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys",
                                              help="SSH hosts: trust and remember unknown host keys (never changed ones)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also show TensorFlow's known start-up noise "
                                 "(hidden by default; the task logs keep it)"),
    keep_remote: bool = typer.Option(False, "--keep-remote",
                                     help="SSH hosts: keep the shipped code and job kit there after the run (default: removed)"),
) -> None:
    """Launch JOB on a cluster (--cluster FILE), on local processes (--local N), or inside a Slurm allocation (--slurm)."""
    from launcher import launch as core
    from launcher.hosts import RemoteOptions
    from launcher.plan import render_plan
    from launcher.policy import SupervisorConfig
    from launcher.report import summary

    if retry_on not in ("any", "preemption"):
        raise _fail(f"--retry-on {retry_on}: choose 'any' or 'preemption'")
    if sync and no_sync:
        raise _fail("--sync DIR and --no-sync contradict each other; give one")
    spec = _description(cluster, local, slurm, evaluator, detach)
    store = _store()
    remote = RemoteOptions(ship_code=not no_sync, sync_dirs=tuple(str(d.resolve()) for d in sync),
                           accept_new_host_keys=accept_new_host_keys, keep_remote=keep_remote)
    config = SupervisorConfig(max_restarts=max_restarts, retry_on=retry_on, grace_period=grace_period,
                              evaluator_timeout=evaluator_timeout, stall_timeout=stall_timeout)
    plan = _core(lambda: core.make_plan(job, tuple(ctx.args), spec, store, remote, virtual_devices, config))
    if dry_run:
        typer.echo(render_plan(plan))
        return
    if detach:
        _detach(plan, store, config)
        return
    prepared = _core(lambda: core.prepare(plan))
    typer.echo(f"tfl: run {plan.run_id}: {', '.join(t.name for t in plan.tasks)}; logs in {plan.run_dir}/logs", err=True)
    record = _core(lambda: core.execute(prepared, store, config, sys.stdout, colour=_colour(), verbose=verbose))
    typer.echo(summary(record), err=True)
    raise typer.Exit(record.exit_code or 0)


def _description(cluster: Path | None, local: int | None, slurm: bool, evaluator: bool, detach: bool) -> Any:
    """What a launch runs: a cluster file (hosts, or a `slurm` block), --local N, or the Slurm allocation it is in."""
    import os

    from launcher.descriptions import load_description
    from launcher.spec import local_cluster

    if sum((cluster is not None, local is not None, slurm)) != 1:
        raise _fail("give exactly one of --cluster FILE, --local N (e.g. --local 2) or --slurm (inside a Slurm allocation)")
    if evaluator and cluster is not None:
        raise _fail("--evaluator goes with --local or --slurm; in a cluster file add \"evaluator\": [\"host:port\"] "
                    "(or \"evaluator\": true in a slurm block)")
    if slurm and detach:
        raise _fail("--detach with --slurm: the allocation ends when its command returns; run `tfl launch --slurm` in the "
                    "foreground inside it, or submit with --cluster FILE (a 'slurm' block) and --detach")
    if slurm:
        from launcher.slurm.settings import allocation_cluster

        return _core(lambda: allocation_cluster(os.environ, evaluator))
    return _core(lambda: load_description(cluster) if cluster is not None else local_cluster(local or 0, evaluator))


def _detach(plan: Any, store: Any, config: Any) -> None:
    """``--detach``: the quick checks here (their failures reach this terminal), then a
    background launcher; prints the run id."""
    from launcher import launch as core

    _core(lambda: core.preflight(plan))
    pid = _core(lambda: core.detach(plan, store, config))
    typer.echo(plan.run_id)
    typer.echo(f"tfl: run {plan.run_id} supervised in the background (pid {pid}); "
               f"follow it with `tfl logs {plan.run_id} --follow`, end it with `tfl stop {plan.run_id}`", err=True)


@app.command(cls=_Command)
def doctor(
    cluster: Path = typer.Option(..., "--cluster", "-c", help="cluster description (JSON)"),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="trust and remember unknown host keys"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Check every host of a cluster at once: ssh, python, the job kit, tensorflow/tf_keras, ports, disk, GPUs,
    and that the cluster's storage is shared."""
    from launcher.checks import as_dicts, render
    from launcher.doctor import doctor as diagnose
    from launcher.spec import load_cluster

    spec = _core(lambda: load_cluster(cluster))
    checks = _core(lambda: diagnose(spec, accept_new_host_keys=accept_new_host_keys))
    typer.echo(json.dumps(as_dicts(checks), indent=1) if as_json else render(checks))
    raise typer.Exit(1 if any(c.status == "fail" for c in checks) else 0)


@app.command(cls=_Command)
def validate(file: Path = typer.Argument(..., help="cluster description (JSON)")) -> None:
    """Check a cluster description; print its tasks (a slurm block: also its batch script) or the first problem with its fix."""
    import os

    from launcher.descriptions import load_description
    from launcher.plan import describe

    spec = _core(lambda: load_description(file))
    lines, count = _core(lambda: describe(spec, str(_store().runs_dir), sys.executable, os.getcwd()))
    typer.echo("\n".join(lines))
    typer.echo(f"{file}: valid ({count} tasks)", err=True)


@app.command(cls=_Command)
def schema() -> None:
    """Print the JSON Schema of the cluster description."""
    from launcher.spec import ClusterSpec

    typer.echo(json.dumps(ClusterSpec.model_json_schema(), indent=2))


# RUN is read from the context's extra arguments, not declared as a typer.Argument: typer 0.29
# coerces every non-flag parameter through a pydantic TypeAdapter, whose import alone costs
# `tfl status` a third of its time (docs/benchmarks.md §1). Flags skip that coercion.
@app.command(cls=_RunsCommand, context_settings={"allow_extra_args": True}, options_metavar="[OPTIONS] [RUN]")
def status(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="machine-readable output (the same runs as the table)"),
    watch: bool = typer.Option(False, "--watch", "-w", help="a live view, redrawn every second (Ctrl-C ends it)"),
    every: bool = typer.Option(False, "--all", "-a", help="list every run, not only the active and the 20 latest"),
) -> None:
    """Show the runs, or one run's tasks (state, pid, cpu, memory, progress).

    RUN is a run id or a unique prefix of one. Without it: the active runs and the 20
    latest (whose record changed last), oldest first; --all lists every run.
    """
    from launcher.report import run_detail, runs_table
    from launcher.status import run_list, run_view

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
    view = run_view(_core(lambda: store.resolve(run)), measure=True)
    typer.echo(json.dumps(view.to_dict(), indent=1) if as_json else run_detail(view))


def _watch_status(store: Any, run: str | None, every: bool) -> None:
    """``tfl status --watch``: one run until it ends, or the list until Ctrl-C."""
    from launcher.report import runs_table, watch, watch_run
    from launcher.status import run_list, run_view

    clear = sys.stdout.isatty()
    try:
        if run is not None:
            watch_run(lambda: run_view(store.resolve(run), measure=True), sys.stdout, clear=clear)
        else:
            watch(lambda: (runs_table(*run_list(store, every=every)), False), sys.stdout, clear=clear)
    except KeyboardInterrupt:
        pass
    except TflError as exc:
        raise _fail(str(exc), exc.exit_code) from None


@app.command("_supervise", cls=_Command, hidden=True)
def supervise(plan_file: Path, config_json: str) -> None:
    """The detached launcher's body (started by `tfl launch --detach`)."""
    from launcher.launch import supervise_detached

    record = _core(lambda: supervise_detached(plan_file, config_json, _store()))
    raise typer.Exit(record.exit_code or 0)


@app.command(cls=_Command)
def stop(
    run: str | None = typer.Argument(None, help="run id or unique prefix (default: the latest run)",
                                     autocompletion=_run_ids),
    grace_period: float = typer.Option(5.0, "--grace-period", min=0, help="seconds between SIGTERM and SIGKILL"),
) -> None:
    """Stop a run: every task, even when its launcher was killed. Stopping twice is fine."""
    from launcher.control import stop_run

    store = _store()
    record = _core(lambda: store.resolve(run))
    typer.echo(_core(lambda: stop_run(store, record, grace_period)))


@app.command(cls=_Command)
def logs(
    run: str | None = typer.Argument(None, help="run id or unique prefix (default: the latest run)",
                                     autocompletion=_run_ids),
    task: str | None = typer.Option(None, "--task", "-t", help="only this task, e.g. chief:0"),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing until the run ends"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also show TensorFlow's known start-up noise"),
) -> None:
    """Print a run's task logs, each line prefixed with its task.

    TensorFlow's known start-up noise (oneDNN, CUDA stubs, cuInit without a driver, gRPC and
    coordination-service lines) is hidden and counted per task; --verbose shows every line.
    """
    from launcher.control import show_logs

    store = _store()
    record = _core(lambda: store.resolve(run))
    try:
        _core(lambda: show_logs(store, record, sys.stdout, task=task, follow=follow, colour=_colour(), verbose=verbose))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


export_app = typer.Typer(name="export", no_args_is_help=True, rich_markup_mode=None, cls=_Group,
                         help="Write a job and its cluster roles as manifests for another system to run.")
app.add_typer(export_app)


@export_app.command("k8s", cls=_Command, context_settings={"allow_extra_args": True})
def export_k8s(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="the job script's path inside the image, e.g. jobs/mnist.py; its arguments go after --"),
    cluster: Path | None = typer.Option(None, "--cluster", "-c", help="cluster description (JSON): roles, counts, env, GPUs, storage"),
    local: int | None = typer.Option(None, "--local", help="a chief and N-1 workers"),
    evaluator: bool = typer.Option(False, "--evaluator", help="with --local: add a sidecar evaluator"),
    image: str | None = typer.Option(None, "--image", help="container image with TensorFlow, tf_keras, tfl and the job (required)"),
    fmt: str = typer.Option("jobset", "--format", help="jobset (JobSet, default) | tfjob (Kubeflow TFJob)"),
    namespace: str | None = typer.Option(None, "--namespace", "-n", help="namespace of every object (default: kubectl's)"),
    name: str | None = typer.Option(None, "--name", help="name of the JobSet/TFJob, a DNS label (default: the job's name and the time)"),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="restart the whole group up to K times (TFJob: backoffLimit)"),
    output: Path | None = typer.Option(None, "--output", "-o", help="write the YAML to FILE instead of printing it"),
) -> None:
    """Print JOB on a cluster's roles as Kubernetes manifests: a JobSet (default) or a Kubeflow TFJob."""
    import time

    from launcher.k8s.export import export_k8s as export
    from launcher.k8s.export import write_manifests
    from launcher.k8s.pods import ExportOptions, default_name
    from launcher.spec import load_cluster, local_cluster

    if (cluster is None) == (local is None):
        raise _fail("give exactly one of --cluster FILE or --local N (e.g. --local 2)")
    if evaluator and cluster is not None:
        raise _fail("--evaluator goes with --local; in a cluster file add \"evaluator\": [\"host:port\"]")
    if image is None:
        raise _fail("--image is required: the container image with TensorFlow, tf_keras, tfl and the job "
                    "(e.g. --image registry.example.com/train:1; see docs/kubernetes.md)")
    spec = _core(lambda: load_cluster(cluster) if cluster is not None else local_cluster(local or 0, evaluator))
    options = ExportOptions(job=job, image=image, name=name or default_name(job, time.strftime("%Y%m%d-%H%M%S")),
                            job_args=tuple(ctx.args), format=fmt, namespace=namespace, max_restarts=max_restarts)
    result = _core(lambda: export(spec, options))
    for warning in result.warnings:
        typer.echo(f"tfl: warning: {warning}", err=True)
    if output is None:
        typer.echo(result.text, nl=False)
        return
    _core(lambda: write_manifests(output, result.text))
    count = len(result.documents)
    typer.echo(f"tfl: wrote {count} object{'' if count == 1 else 's'} ({options.name}) to {output}; "
               f"apply them with `kubectl apply -f {output}`", err=True)
@app.command(cls=_Command)
def rm(runs: list[str] = typer.Argument(..., help="run ids or unique prefixes", autocompletion=_run_ids)) -> None:
    """Remove finished runs: their record, logs and default model dir here, and what they left
    on SSH hosts (an unreachable host is reported). A running run is kept (exit 1)."""
    from launcher.prune import rm_runs

    outcome = _core(lambda: rm_runs(_store(), runs))
    typer.echo(outcome.render())
    raise typer.Exit(1 if outcome.refused else 0)


@app.command(cls=_Command)
def prune(
    older_than: str | None = typer.Option(None, "--older-than", help="runs that ended longer ago than this, e.g. 7d, 12h "
                                          "(default 7d when --keep is not given)"),
    keep: int | None = typer.Option(None, "--keep", help="keep the N latest runs whatever their age"),
    dry_run: bool = typer.Option(False, "--dry-run", help="say what would be removed; remove nothing"),
) -> None:
    """Remove finished runs older than --older-than and beyond the --keep latest (as `tfl rm`).
    Running runs are never touched."""
    from launcher.prune import prune_runs

    typer.echo(_core(lambda: prune_runs(_store(), older_than=older_than, keep=keep, dry_run=dry_run)).render())


@app.command(cls=_Command)
def tensorboard(
    run: str | None = typer.Argument(None, help="run id or unique prefix (default: the latest run)", autocompletion=_run_ids),
    port: int | None = typer.Option(None, "--port", "-p", help="port on 127.0.0.1 (default: the first free from 6006)"),
) -> None:
    """TensorBoard on a run's model dir (also while it runs); prints the URL, Ctrl-C stops it.
    A model dir on another host: prints how to reach it through SSH instead."""
    from launcher.tboard import serve

    store = _store()
    record = _core(lambda: store.resolve(run))
    raise typer.Exit(_core(lambda: serve(record, port, sys.stdout)))


def main() -> None:
    app(prog_name="tfl")  # also as `python -m launcher`: completion asks for _TFL_COMPLETE
