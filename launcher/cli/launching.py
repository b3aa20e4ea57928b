"""``tfl launch`` and the commands about a description before any run: doctor, validate,
schema, export k8s; and the detached launcher's hidden ``_supervise``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from launcher.cli.app import _colour, _Command, _core, _fail, _Group, _JobCommand, _store, app
from launcher.console import say
from launcher.plan.run_options import DEFAULT_GRACE_S, DEFAULT_MAX_PREEMPTIONS


@app.command(cls=_JobCommand, context_settings={"allow_extra_args": True})
def launch(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="the job script, e.g. jobs/mnist.py; its own arguments go after --"),
    cluster: Path | None = typer.Option(None, "--cluster", "-c", help="cluster description (JSON)"),
    local: int | None = typer.Option(None, "--local", help="emulate a cluster: a chief and N-1 workers on free localhost ports"),
    slurm: bool = typer.Option(False, "--slurm", help="inside a Slurm allocation (salloc, sbatch): one task per allocated task"),
    evaluator: bool = typer.Option(False, "--evaluator", help="with --local or --slurm: add a sidecar evaluator"),
    virtual_devices: int | None = typer.Option(None, "--virtual-devices", min=1,
                                               help="split each task's GPU (or its CPU) into N logical devices for its strategy "
                                               "(default: none split)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print what would run where; start nothing, write nothing"),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="restart the whole group up to K times after a failure"),
    retry_on: str = typer.Option("any", "--retry-on", help="which failures are restarted: any | preemption (exit 143 / SIGTERM)"),
    max_preemptions: int | None = typer.Option(None, "--max-preemptions", min=0, show_default=False,
                                               help="restart the group up to N times after a preemption (a task saved on "
                                               "notice and exited 170); not counted against --max-restarts  [default: "
                                               "100; 0 on hosts without shared storage]"),
    grace_period: float = typer.Option(DEFAULT_GRACE_S, "--grace-period", min=0,
                                       help="seconds from the notice (SIGTERM) to SIGKILL when stopping tasks: time for them "
                                       "to agree on a step and save there"),
    evaluator_timeout: float = typer.Option(600.0, "--evaluator-timeout", min=0, help="seconds the evaluator may run after training ends"),
    stall_timeout: float | None = typer.Option(None, "--stall-timeout", min=0, help="a training task that reports no progress "
                                               "for S seconds has failed (default: never)"),
    detach: bool = typer.Option(False, "--detach", "-d", help="supervise in the background; print the run id and return"),
    sync: list[Path] = typer.Option([], "--sync", help="SSH hosts: also copy this directory's contents to their working dir (repeatable)"),
    no_sync: bool = typer.Option(False, "--no-sync", help="SSH hosts: copy nothing; the job is already there at the same path"),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys",
                                              help="SSH hosts: trust and remember unknown host keys (never changed ones)"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also show TensorFlow's known start-up noise "
                                 "(hidden by default; the task logs keep it)"),
    keep_remote: bool = typer.Option(False, "--keep-remote",
                                     help="SSH hosts: keep the shipped code and job kit there after the run (default: removed)"),
    min_tasks: int | None = typer.Option(None, "--min-tasks", min=1, help="elastic: go on with at least N training tasks "
                                         "(the chief included) when hosts are lost; take them back when they return (default: the "
                                         "cluster file's elastic.min_tasks, else none: not elastic)"),
    elastic_batch: str | None = typer.Option(None, "--elastic-batch", help="elastic: what a resize keeps: global (the "
                                             "global batch, default) | per-replica"),
    global_batch: int | None = typer.Option(None, "--global-batch", min=1, help="elastic: the job's global batch, kept "
                                            "over every size (the job gets it as TFL_GLOBAL_BATCH; default: the cluster "
                                            "file's elastic.global_batch)"),
    blacklist_after: int = typer.Option(2, "--blacklist-after", min=0, help="elastic: a host whose tasks failed K "
                                        "attempts in a row is lost (0: never)"),
    elastic_wait: float = typer.Option(600.0, "--elastic-wait", min=0, help="elastic: below --min-tasks, wait this "
                                       "long for lost hosts to return, then fail"),
    probe_interval: float = typer.Option(30.0, "--probe-interval", min=0.1, help="elastic: probe lost hosts every "
                                         "S seconds"),
    network: str = typer.Option("auto", "--network", help="who can reach the task ports: private (tasks on this machine "
                                "in a network namespace of their own), host (this machine's networks), auto (private "
                                "where it can be; docs/security.md)"),
) -> None:
    """Launch JOB on a cluster (--cluster FILE), on local processes (--local N), or inside a Slurm allocation (--slurm)."""
    from launcher.describe.hosts import RemoteOptions
    from launcher.plan.build import render_plan
    from launcher.plan.network import public_warnings
    from launcher.plan.resize import elastic_options, one_host_warning
    from launcher.plan.run_options import SupervisorConfig
    from launcher.runs import launch as core
    from launcher.views.report import summary

    if retry_on not in ("any", "preemption"):
        raise _fail(f"--retry-on {retry_on}: choose 'any' or 'preemption'")
    if sync and no_sync:
        raise _fail("--sync DIR and --no-sync contradict each other; give one")
    spec = _description(cluster, local, slurm, evaluator, detach)
    store = _store()
    remote = RemoteOptions(ship_code=not no_sync, sync_dirs=tuple(str(d.resolve()) for d in sync),
                           accept_new_host_keys=accept_new_host_keys, keep_remote=keep_remote)
    config = SupervisorConfig(max_restarts=max_restarts, retry_on=retry_on, grace_period=grace_period,
                              evaluator_timeout=evaluator_timeout, stall_timeout=stall_timeout,
                              max_preemptions=DEFAULT_MAX_PREEMPTIONS if max_preemptions is None else max_preemptions,
                              blacklist_after=blacklist_after, elastic_wait=elastic_wait, probe_interval=probe_interval,
                              **elastic_options(spec, min_tasks, elastic_batch, global_batch))
    plan, config, note = _core(lambda: core.plan_launch(job, tuple(ctx.args), spec, store, remote, virtual_devices, config,
                                                        max_preemptions, network))
    if dry_run:
        typer.echo(render_plan(plan))
        _note(note)
        return
    for warning in [*public_warnings(plan), one_host_warning(plan, config.min_tasks, config.blacklist_after)]:
        if warning:
            typer.echo(f"tfl: warning: {warning}", err=True)
    if detach:
        _detach(plan, store, config, note)
        return
    prepared = _core(lambda: core.prepare(plan))
    _note(note)  # once the hosts passed their checks: their refusal stays the one line
    said = f"tfl: run {plan.run_id}: {', '.join(t.name for t in plan.tasks)}; logs in {plan.run_dir}/logs"
    record = _core(lambda: core.execute(prepared, store, config, sys.stdout, colour=_colour(), verbose=verbose,
                                        announce=lambda: typer.echo(said, err=True), exits_after=True))
    say(summary(record))
    raise typer.Exit(record.exit_code or 0)


def _description(cluster: Path | None, local: int | None, slurm: bool, evaluator: bool, detach: bool) -> Any:
    """What a launch runs: a cluster file (hosts, or a `slurm` block), --local N, or the Slurm allocation it is in."""
    import os

    from launcher.describe.kinds import load_description
    from launcher.describe.spec import local_cluster

    if sum((cluster is not None, local is not None, slurm)) != 1:
        raise _fail("give exactly one of --cluster FILE, --local N (e.g. --local 2) or --slurm (inside a Slurm allocation)")
    if evaluator and cluster is not None:
        raise _fail("--evaluator goes with --local or --slurm; in a cluster file add \"evaluator\": [\"host:port\"] "
                    "(or \"evaluator\": true in a slurm block)")
    if slurm and detach:
        raise _fail("--detach with --slurm: the allocation ends when its command returns; run `tfl launch --slurm` in the "
                    "foreground inside it, or submit with --cluster FILE (a 'slurm' block) and --detach")
    if slurm:
        from launcher.engines.slurm.settings import allocation_cluster

        return _core(lambda: allocation_cluster(os.environ, evaluator))
    return _core(lambda: load_description(cluster) if cluster is not None else local_cluster(local or 0, evaluator))


def _note(note: str | None) -> None:
    if note:
        typer.echo(note, err=True)


def _detach(plan: Any, store: Any, config: Any, note: str | None) -> None:
    """``--detach``: a background launcher, which checks the hosts (a refusal reaches this terminal
    as its one line) and records the run; prints the run id."""
    from launcher.runs import detach as core

    pid = _core(lambda: core.detach(plan, store, config))
    _note(note)
    for note in core.launcher_notes(store, plan.run_id):
        typer.echo(note, err=True)
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
    from launcher.describe.spec import load_cluster
    from launcher.engines.doctor import doctor as diagnose
    from launcher.engines.preflight import as_dicts, render

    spec = _core(lambda: load_cluster(cluster))
    checks = _core(lambda: diagnose(spec, accept_new_host_keys=accept_new_host_keys))
    typer.echo(json.dumps(as_dicts(checks), indent=1) if as_json else render(checks))
    raise typer.Exit(1 if any(c.status == "fail" for c in checks) else 0)


@app.command(cls=_Command)
def validate(file: Path = typer.Argument(..., help="cluster description (JSON)")) -> None:
    """Check a cluster description; print its tasks (a slurm block: also its batch script) or the first problem with its fix."""
    import os

    from launcher.describe.kinds import load_description
    from launcher.plan.build import describe
    from launcher.runs.launch import check_description

    spec = _core(lambda: load_description(file))
    _core(lambda: check_description(spec, str(_store().runs_dir), sys.executable, os.getcwd()))
    lines, count = _core(lambda: describe(spec, str(_store().runs_dir), sys.executable, os.getcwd()))
    typer.echo("\n".join(lines))
    typer.echo(f"{file}: valid ({count} tasks)", err=True)


@app.command(cls=_Command)
def schema() -> None:
    """Print the JSON Schema of the cluster description."""
    from launcher.describe.spec import ClusterSpec

    typer.echo(json.dumps(ClusterSpec.model_json_schema(), indent=2))


@app.command("_supervise", cls=_Command, hidden=True)
def supervise(plan_file: Path, config_json: str) -> None:
    """The detached launcher's body (started by `tfl launch --detach`)."""
    from launcher.runs.detach import supervise_detached

    record = _core(lambda: supervise_detached(plan_file, config_json, _store()))
    raise typer.Exit(record.exit_code or 0)


@app.command("_resume", cls=_Command, hidden=True)
def resume_body(run_id: str, config_json: str, address: str | None = typer.Option(None, "--address", hidden=True)) -> None:
    """The detached launcher of `tfl resume --detach`."""
    from launcher.runs.detach import resume_detached

    record = _core(lambda: resume_detached(run_id, config_json, _store(), address))
    raise typer.Exit(record.exit_code or 0)


export_app = typer.Typer(name="export", no_args_is_help=True, rich_markup_mode=None, cls=_Group,
                         help="Write a job and its cluster roles as manifests for another system to run.")
app.add_typer(export_app)


@export_app.command("k8s", cls=_JobCommand, context_settings={"allow_extra_args": True})
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
    termination_grace: int | None = typer.Option(
        None, "--termination-grace", min=0, metavar="SECONDS",
        help="every pod's terminationGracePeriodSeconds: from the notice (SIGTERM) to SIGKILL, the time for the agreed "
             "checkpoint (default: Kubernetes' 30)"),
    output: Path | None = typer.Option(None, "--output", "-o", help="write the YAML to FILE instead of printing it ('-': print it)"),
) -> None:
    """Print JOB on a cluster's roles as Kubernetes manifests: a JobSet (default) or a Kubeflow TFJob."""
    import time

    from launcher.describe.spec import load_cluster, local_cluster
    from launcher.engines.k8s.export import export_k8s as export
    from launcher.engines.k8s.export import write_manifests
    from launcher.engines.k8s.pods import ExportOptions, default_name

    if (cluster is None) == (local is None):
        raise _fail("give exactly one of --cluster FILE or --local N (e.g. --local 2)")
    if evaluator and cluster is not None:
        raise _fail("--evaluator goes with --local; in a cluster file add \"evaluator\": [\"host:port\"]")
    if image is None:
        raise _fail("--image is required: the container image with TensorFlow, tf_keras, tfl and the job "
                    "(e.g. --image registry.example.com/train:1; see docs/kubernetes.md)")
    spec = _core(lambda: load_cluster(cluster) if cluster is not None else local_cluster(local or 0, evaluator))
    options = ExportOptions(job=job, image=image, name=name or default_name(job, time.strftime("%Y%m%d-%H%M%S")),
                            job_args=tuple(ctx.args), format=fmt, namespace=namespace, max_restarts=max_restarts,
                            termination_grace=termination_grace)
    result = _core(lambda: export(spec, options))
    for warning in result.warnings:
        typer.echo(f"tfl: warning: {warning}", err=True)
    if output is None or str(output) == "-":  # `-o - | kubectl apply -f -`: a file named '-' would leave the pipe empty
        typer.echo(result.text, nl=False)
        return
    _core(lambda: write_manifests(output, result.text))
    count = len(result.documents)
    typer.echo(f"tfl: wrote {count} object{'' if count == 1 else 's'} ({options.name}) to {output}; "
               f"apply them with `kubectl apply -f {output}`", err=True)
