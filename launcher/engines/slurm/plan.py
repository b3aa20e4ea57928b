"""A Slurm run's plan: the tasks Slurm will place, and the batch script that places them.

Built once, like every plan (``launcher.plan.build.build_plan`` hands a ``slurm`` description
here). The tasks are known before the job exists (chief:0, worker:0.., evaluator:0); their
nodes and ports are not: Slurm picks the nodes, the task driver builds each TF_CONFIG once
the job runs (``launcher.engines.slurm.node.nodes``). So a task's host is ``slurm`` until the run's
record names its node, and its argv is the driver's. The restart policy goes into the
script (``--max-restarts``, and ``--max-preemptions`` for groups that ended preempted: the
script relaunches the training group), so the options it cannot carry are refused here, in
one line. An elastic run (``--min-tasks``) is submitted with ``--no-kill``: after a node
failure the script starts the next attempt on the nodes left (``launcher.engines.slurm.script``);
``launcher.plan.resize.check_elastic`` checks its sizes and batch as for any plan.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping

from launcher.contract import EVALUATOR, GLOBAL_BATCH, LOGS_SUBDIR, PROGRESS_SUBDIR, SLURM_LAYOUT, task_variables
from launcher.describe.hosts import RemoteOptions
from launcher.engines.slurm.node.batch import EVALUATOR_ROLE, TRAINING_ROLE, RunFiles, SlurmJobPlan
from launcher.engines.slurm.node.errors import SlurmLayoutError
from launcher.engines.slurm.node.nodes import parse_tasks_per_node
from launcher.engines.slurm.script import (
    BatchJob,
    batch_env,
    driver_argv,
    evaluator_srun,
    render_batch_script,
    sbatch_command,
    training_srun,
)
from launcher.engines.slurm.settings import AllocationSpec, SlurmClusterSpec
from launcher.errors import UsageError
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.run_options import SupervisorConfig
from launcher.tasks import TaskId, task_ids

SLURM_HOST = "slurm"  # a task's host until its node is known


def refuse_unsupported(config: SupervisorConfig) -> None:
    """The supervisor options a batch script cannot honour."""
    if config.retry_on != "any":
        raise UsageError("--retry-on preemption: on Slurm the batch script restarts the training group after any failure "
                         "(--max-restarts), and a group that saved on a preemption notice (exit 170) apart from those "
                         "(--max-preemptions); drop the option")
    if config.stall_timeout:
        raise UsageError("--stall-timeout is not supported on Slurm (a job may pend for any time before its tasks run); "
                         "bound the run with the slurm block's \"time\" instead")


def _elastic_env(config: SupervisorConfig) -> dict[str, str]:
    """What an elastic run's tasks learn of it: the kept global batch (``jobkit.global_batch_size``)."""
    keep = config.min_tasks is not None and config.elastic_batch == "global" and config.global_batch is not None
    return {GLOBAL_BATCH: str(config.global_batch)} if keep else {}


def build_slurm_plan(spec: SlurmClusterSpec, job: str, job_args: tuple[str, ...], *, run_id: str, run_dir: str,
                     python: str, cwd: str, remote: RemoteOptions, virtual_devices: int | None,
                     config: SupervisorConfig) -> LaunchPlan:
    """What would run: every task, and the batch script with its sbatch command (pure). ``remote``
    is the SSH backend's: Slurm's nodes share the run dir, nothing is shipped to them."""
    refuse_unsupported(config)
    allocation = spec.job_id if isinstance(spec, AllocationSpec) else None
    if allocation is not None and config.min_tasks is not None:
        raise UsageError(f"--min-tasks inside allocation {allocation}: Slurm ends an allocation when one of its nodes "
                         "fails unless it was made with --no-kill, which tfl cannot see; remove --min-tasks, or launch "
                         "with a cluster file with a 'slurm' block (tfl then submits the job with --no-kill)")
    if spec.slurm.requeue and config.min_tasks is not None:
        raise UsageError("--min-tasks with the slurm block's \"requeue\": true: a requeued job starts again on every "
                         "node, at the full size, behind the launcher's back; remove one of the two")
    max_preemptions = config.max_preemptions
    batch = BatchJob(settings=spec.slurm, job=job, job_args=job_args, run_id=run_id, run_dir=run_dir,
                     env={**spec.env, **_elastic_env(config)}, min_tasks=config.min_tasks,
                     python=python, cwd=cwd, max_restarts=config.max_restarts, max_preemptions=max_preemptions,
                     grace_period=config.grace_period,
                     evaluator_timeout=config.evaluator_timeout, virtual_devices=virtual_devices,
                     allocation=allocation is not None)
    counts = {"chief": 1, "worker": spec.slurm.training_tasks - 1, EVALUATOR: int(spec.slurm.evaluator)}
    tasks = tuple(_task(batch, task) for task in task_ids(counts))
    steps = [(TRAINING_ROLE, shlex.join(training_srun(batch)))]
    if spec.slurm.evaluator:
        steps.append((EVALUATOR, shlex.join(evaluator_srun(batch))))
    slurm = SlurmJobPlan(script=render_batch_script(batch), sbatch=() if allocation else tuple(sbatch_command(batch)),
                         job_name=batch.job_name, allocation=allocation,
                         test_only=() if allocation else tuple(sbatch_command(batch, "--test-only")), steps=tuple(steps),
                         max_restarts=config.max_restarts, max_preemptions=max_preemptions,
                         requeue=spec.slurm.requeue and allocation is None, min_tasks=config.min_tasks)
    return LaunchPlan(run_id=run_id, run_dir=run_dir, job=job, job_args=job_args, tasks=tasks, unit=slurm)


def _task(batch: BatchJob, task: TaskId) -> TaskLaunch:
    env = {**batch_env(batch), **task_variables(task.type, task.index, batch.run_dir)}
    role = EVALUATOR_ROLE if task.type == EVALUATOR else TRAINING_ROLE
    return TaskLaunch(task=task, host=SLURM_HOST, port=0, argv=tuple(driver_argv(batch, role)), env=env, cwd=batch.cwd,
                      log_path=f"{batch.run_dir}/{LOGS_SUBDIR}/{task.slug}.log",
                      progress_path=f"{batch.run_dir}/{PROGRESS_SUBDIR}/{task.slug}.json")


def render_slurm_plan(plan: LaunchPlan) -> str:
    """``--dry-run`` (and ``tfl validate``): the tasks, the srun lines and the whole batch script."""
    slurm, files = slurm_unit(plan), RunFiles(plan.run_dir)
    how = (f"run inside allocation {slurm.allocation}: bash {files.script}" if slurm.allocation
           else f"submitted: {shlex.join([*slurm.sbatch, files.script])}")
    lines = [f"run {plan.run_id}", f"  dir: {plan.run_dir} (on storage every node shares)",
             f"  job: {shlex.join([plan.job, *plan.job_args])}", f"  slurm: {how}", "", "tasks:"]
    rank = 0
    for t in plan.tasks:
        where = "a step of its own" if t.task.type == EVALUATOR else f"rank {rank} of the training step"
        rank += t.task.is_training
        lines.append(f"  {t.name}  {where}; log {t.log_path}")
    lines += ["  (each task's TF_CONFIG is built when it starts, from Slurm's node order and NodeAddr)", "", "srun lines:"]
    lines += [f"  {role}: {line}" for role, line in slurm.steps]
    lines += ["", f"batch script ({files.script}):", *(f"  {line}" for line in slurm.script.splitlines())]
    return "\n".join(lines)


def slurm_unit(plan: LaunchPlan) -> SlurmJobPlan:
    """A Slurm plan's batch script (its ``unit``)."""
    if not isinstance(plan.unit, SlurmJobPlan):
        raise UsageError(f"run {plan.run_id}: its plan has no Slurm batch script; it was not planned from a 'slurm' description")
    return plan.unit


def in_allocation(plan: LaunchPlan, environ: Mapping[str, str]) -> LaunchPlan | str:
    """A plan of ``tfl launch --slurm`` for the allocation this process is in (``environ``): the plan
    itself inside its own allocation; for ``tfl resume`` inside another allocation of the same shape
    (the first ended with the command it ran, as ``salloc CMD`` does), the same plan moved there;
    else why it cannot run here, in one line with the fix. The batch script names no job id."""
    slurm = slurm_unit(plan)
    here = environ.get("SLURM_JOB_ID", "")
    if slurm.allocation is None or here == slurm.allocation:
        return plan
    wanted = parse_tasks_per_node(next(t.env.get(SLURM_LAYOUT, "") for t in plan.tasks))  # the plan's own: valid
    try:
        given = parse_tasks_per_node(environ.get("SLURM_TASKS_PER_NODE", ""))
    except SlurmLayoutError:  # outside any allocation
        given = ()
    if not here.isdigit() or given != wanted:
        nodes, per_node = len(wanted), wanted[0]
        where = f"allocation {here} has {environ.get('SLURM_TASKS_PER_NODE') or '?'} tasks per node" if here else "no allocation here"
        return (f"run {plan.run_id} ran inside allocation {slurm.allocation} ({nodes} node(s) x {per_node} task(s)) and "
                f"{where}; resume it inside an allocation of that shape: `salloc -N {nodes} --ntasks-per-node {per_node} "
                f"tfl resume {plan.run_id}`")
    return dataclasses.replace(plan, unit=dataclasses.replace(slurm, allocation=here))


def describe_slurm(spec: SlurmClusterSpec, runs_dir: str, python: str, cwd: str) -> tuple[list[str], int]:
    """``tfl validate``: the plan of a run of a placeholder JOB: its tasks, srun lines and batch script."""
    plan = build_slurm_plan(spec, "JOB", (), run_id="RUN", run_dir=f"{runs_dir}/RUN", python=python, cwd=cwd,
                            remote=RemoteOptions(), virtual_devices=None, config=SupervisorConfig())
    return render_slurm_plan(plan).splitlines(), len(plan.tasks)
