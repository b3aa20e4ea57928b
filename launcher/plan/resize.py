"""Elastic runs (``tfl launch --min-tasks N``): what is allowed at launch, and the plan of the
next attempt once hosts are lost or come back. Pure: no I/O, no engine.

MultiWorkerMirroredStrategy cannot change its cluster while it runs, but every attempt
builds TF_CONFIG anew: an attempt after a resize is the launch plan without the lost hosts'
tasks (``resize_plan``), always derived from the *full* plan, so taking a host back is the
same function with a smaller set of lost hosts.

The rules of a resized plan:
- the surviving training tasks keep their order (chief, then workers by index) and are
  renumbered: workers 0..k-1; when the chief's host is lost, the first surviving worker
  becomes ``chief:0`` (a cluster without a chief keeps none: ``worker:0`` leads);
- each survivor's TF_CONFIG is rebuilt from the survivors' own addresses, and its
  ``TFL_TASK`` names its new identity; its log and progress files stay those of the task as
  launched (one file per task slot for the whole run: ``tfl logs`` reads them as before);
- the evaluator stays where its host survived (its TF_CONFIG sees the resized cluster).
  When its host is lost, it moves to a surviving host the cluster file allows
  (``elastic.evaluator_moves_to``: a list of hosts, tried in order, or ``"any"``: the
  surviving training hosts in plan order), else it is left out for as long as its host is
  lost, and the resize says so (training never waits for the evaluator). A moved
  evaluator runs as a training task of its new host does (that host's python, code,
  dirs, environment and devices: it shares that task's GPUs), with its own name, log
  and progress files, on its own port unless a task of the full plan uses that port on
  that host (then the next port up no task there uses). It moves back when its host
  returns: every plan is derived from the full one.

The batch (``check_elastic``): by default the job's global batch is kept whatever the size,
so each replica takes global / replicas and the maths, the learning rate included, is
unchanged. tfl must know that batch (``--global-batch`` or ``elastic.global_batch``); it
reaches the job as ``TFL_GLOBAL_BATCH`` (``jobkit.global_batch_size``). Every size from
``min_tasks`` to the cluster's must divide it. ``--elastic-batch per-replica`` keeps the
per-replica batch instead (the job's own ``--batch-size``): the global batch shrinks with
the group.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from launcher import contract
from launcher.errors import UsageError
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.storage import EXAMPLE, model_dir_given
from launcher.plan.tfconfig import tf_config_of
from launcher.tasks import TaskId

BATCH_MODES = ("global", "per-replica")
ANY_HOST = "any"  # elastic.evaluator_moves_to: the evaluator may move to any surviving training host
# What a training task's environment has that an evaluator moved to its host must not take.
_TRAINING_ONLY = frozenset({contract.GLOBAL_BATCH, contract.COLLECTIVE})
ELASTIC_UNITS = ("slurm",)  # the descriptions with a unit of their own whose engine resizes the group itself


@dataclass(frozen=True)
class Resize:
    """The next attempt's plan, and what changed from the full plan."""

    plan: LaunchPlan
    renamed: tuple[tuple[str, str], ...]  # (as launched, now) for each task whose name changed
    dropped: tuple[str, ...]  # tasks of the full plan left out (their host is lost)
    notes: tuple[str, ...]  # one line each, for the console and the record

    @property
    def training_size(self) -> int:
        return len(self.plan.training_tasks)


def training_size(plan: LaunchPlan, lost: Collection[str] = ()) -> int:
    """How many training tasks the plan has once the ``lost`` hosts' are left out."""
    return sum(t.host not in lost for t in plan.training_tasks)


def plan_hosts(plan: LaunchPlan) -> list[str]:
    """The plan's hosts, in task order."""
    return list(dict.fromkeys(t.host for t in plan.tasks))


def _address(launch: TaskLaunch) -> str:
    """The task's own address, exactly as its launch TF_CONFIG writes it."""
    config = json.loads(launch.env[contract.TF_CONFIG])
    address: str = config["cluster"][launch.task.type][launch.task.index]
    return address


def _new_ids(count: int, had_chief: bool) -> list[TaskId]:
    """The survivors' new ids, in their order: a chief first (the old one, else the first
    worker promoted) when the cluster had one, then workers from 0."""
    chief = [TaskId(contract.CHIEF, 0)] if had_chief and count else []
    return chief + [TaskId(contract.WORKER, i) for i in range(count - len(chief))]


def resize_plan(full: LaunchPlan, lost: Collection[str], evaluator_moves_to: Collection[str] | str = ()) -> Resize:
    """``full`` without the tasks on the ``lost`` hosts (see the module's rules);
    ``evaluator_moves_to``: where the evaluator may go when its host is lost (hosts, or ANY_HOST)."""
    survivors = [t for t in full.training_tasks if t.host not in lost]
    had_chief = any(t.task.type == contract.CHIEF for t in full.training_tasks)
    ids = _new_ids(len(survivors), had_chief)
    evaluator = next((t for t in full.tasks if not t.task.is_training), None)
    kept_evaluator, evaluator_note = _placed_evaluator(full, evaluator, lost, evaluator_moves_to)
    addresses: dict[str, list[str]] = {kind: [] for kind in contract.TASK_TYPES}
    for new, launch in zip(ids, survivors, strict=True):
        addresses[new.type].append(_address(launch))
    if kept_evaluator is not None:
        addresses[contract.EVALUATOR].append(_address(kept_evaluator))
    moved = list(zip(ids, survivors, strict=True)) + ([(kept_evaluator.task, kept_evaluator)] if kept_evaluator else [])
    tasks = tuple(_as(launch, new, addresses) for new, launch in moved)
    renamed = tuple((launch.name, str(new)) for new, launch in moved if new != launch.task)
    dropped = tuple(t.name for t in full.tasks if t.name not in {launch.name for _, launch in moved})
    notes = [f"{old} on {_host_of(full, old)} is now {new}" for old, new in renamed]
    notes += [evaluator_note] if evaluator_note else []
    return Resize(plan=dataclasses.replace(full, tasks=tasks), renamed=renamed, dropped=dropped, notes=tuple(notes))


def _placed_evaluator(full: LaunchPlan, evaluator: TaskLaunch | None, lost: Collection[str],
                      moves_to: Collection[str] | str) -> tuple[TaskLaunch | None, str | None]:
    """The evaluator of the resized plan (at home, moved, or None) and the note that says so."""
    if evaluator is None or evaluator.host not in lost:
        return evaluator, None
    surviving = list(dict.fromkeys(t.host for t in full.training_tasks if t.host not in lost))
    allowed = surviving if moves_to == ANY_HOST else [h for h in moves_to if h in surviving]
    if not allowed:
        why = "; no host of elastic.evaluator_moves_to survives" if moves_to else ""
        return None, f"the evaluator is left out while {evaluator.host} is lost (training goes on without it{why})"
    template = next(t for t in full.training_tasks if t.host == allowed[0])
    port = _free_port(full, template.host, evaluator.port)
    moved = _moved_evaluator(evaluator, template, port)
    return moved, f"{evaluator.name} moves from {evaluator.host} to {template.host}:{port} while {evaluator.host} is lost"


def _free_port(full: LaunchPlan, host: str, wanted: int) -> int:
    """``wanted``, or the next port up, that no task of the full plan uses on ``host``."""
    used = {t.port for t in full.tasks if t.host == host}
    port = wanted
    while port in used:
        port = port + 1 if port < 65535 else 1024
    return port


def _moved_evaluator(evaluator: TaskLaunch, template: TaskLaunch, port: int) -> TaskLaunch:
    """The evaluator on ``template``'s host: that host's command, dirs and environment, its own
    name and files; training-only settings dropped. TF_CONFIG is written by ``_as``."""
    env = {k: v for k, v in template.env.items() if k not in _TRAINING_ONLY}
    env.update(contract.task_variables(evaluator.task.type, evaluator.task.index, env[contract.RUN_DIR]))
    host = _address(template).rsplit(":", 1)[0]  # as TF_CONFIG writes it (an IPv6 host in brackets)
    env[contract.TF_CONFIG] = json.dumps({"cluster": {contract.EVALUATOR: [f"{host}:{port}"]},
                                          "task": {"type": contract.EVALUATOR, "index": 0}})
    return dataclasses.replace(template, task=evaluator.task, port=port, env=env, log_path=evaluator.log_path,
                               progress_path=evaluator.progress_path)


def _host_of(plan: LaunchPlan, name: str) -> str:
    return next(t.host for t in plan.tasks if t.name == name)


def _as(launch: TaskLaunch, new: TaskId, addresses: dict[str, list[str]]) -> TaskLaunch:
    """The task as ``new`` in the resized cluster: its TF_CONFIG and name; same files."""
    env = {**launch.env, contract.TF_CONFIG: json.dumps(tf_config_of(addresses, new), separators=(",", ":")),
           contract.TASK: str(new)}
    return dataclasses.replace(launch, task=new, env=env)


# --- at launch ---------------------------------------------------------------------------
def elastic_options(spec: object, min_tasks: int | None, batch: str | None, global_batch: int | None) -> dict[str, Any]:
    """The run's elastic options: the command line's, else the cluster file's ``elastic`` block."""
    settings = getattr(spec, "elastic", None)
    return {
        "min_tasks": min_tasks if min_tasks is not None else getattr(settings, "min_tasks", None),
        "elastic_batch": batch or getattr(settings, "batch", None) or "global",
        "global_batch": global_batch if global_batch is not None else getattr(settings, "global_batch", None),
        "evaluator_moves_to": _moves_to(getattr(settings, "evaluator_moves_to", None)),
    }


def _moves_to(value: object) -> tuple[str, ...] | str:
    """The cluster file's ``elastic.evaluator_moves_to`` as the supervisor's config holds it."""
    if isinstance(value, str):
        return value
    return tuple(str(h) for h in value) if isinstance(value, Iterable) else ()


def check_elastic(plan: LaunchPlan, *, min_tasks: int | None, batch: str = "global", global_batch: int | None = None,
                  virtual_devices: int | None = None) -> LaunchPlan:
    """Refuse, with the fix, an elastic run that could not go on; else the plan with the kept
    global batch in every training task's environment. Without ``min_tasks``: the plan as is."""
    if batch not in BATCH_MODES:
        raise UsageError(f"--elastic-batch {batch}: choose 'global' (keep the global batch) or 'per-replica'")
    if min_tasks is None:
        if global_batch is not None:
            raise UsageError("--global-batch goes with --min-tasks (an elastic run); remove it, or add --min-tasks N")
        if batch != "global":  # only the command line gives it without min_tasks: a cluster file's elastic block has both
            raise UsageError(f"--elastic-batch {batch} goes with --min-tasks (an elastic run); remove it, or add --min-tasks N")
        return plan
    if plan.unit is not None and plan.unit.kind not in ELASTIC_UNITS:  # Slurm: its batch script resizes (launcher.engines.slurm.resize)
        raise UsageError(f"--min-tasks with a '{plan.unit.kind}' description: elastic runs are not supported there yet; "
                         "launch with a cluster file of hosts (--cluster FILE) or a 'slurm' block, or remove --min-tasks")
    size = len(plan.training_tasks)
    if min_tasks > size:
        raise UsageError(f"--min-tasks {min_tasks}: the cluster has {size} training task{'s' * (size != 1)} "
                         f"(the chief included); give --min-tasks {size} or less")
    _check_shared(plan, min_tasks)
    if batch == "per-replica":
        if global_batch is not None:
            raise UsageError("--global-batch with --elastic-batch per-replica: the per-replica batch is kept, the global "
                             "one changes with the size; remove --global-batch or use --elastic-batch global")
        return plan
    return _with_global_batch(plan, _check_batch(min_tasks, size, global_batch, virtual_devices or 1))


def one_host_warning(plan: LaunchPlan, min_tasks: int | None, blacklist_after: int = 0) -> str | None:
    """An elastic run whose training tasks all share one host (``--local N``) cannot lose part of
    its group: allowed (its kept global batch still counts, as a fixed-size control run uses it),
    said in one line with what ``--min-tasks`` still does there: with ``--blacklist-after K``, K
    failed attempts in a row lose the one host, which ends the run whatever ``--max-restarts`` allows."""
    hosts = {t.host for t in plan.training_tasks}
    if min_tasks is None or plan.unit is not None or len(hosts) != 1:
        return None
    ends = (f", and tasks failing --blacklist-after {blacklist_after} attempts in a row lose that host, which ends the "
            "run whatever --max-restarts allows") if blacklist_after else ""
    return (f"--min-tasks {min_tasks} gains nothing here: every training task runs on {hosts.pop()}, so no host can be "
            f"lost while others go on; it keeps the global batch{ends}; spread the tasks over hosts with --cluster FILE "
            "for an elastic run")


def _check_shared(plan: LaunchPlan, min_tasks: int) -> None:
    hosts = sorted({t.host for t in plan.tasks})
    remote = any(t.ssh is not None for t in plan.tasks)
    shared = model_dir_given(plan.job_args) or any(contract.MODEL_DIR in t.env for t in plan.tasks)
    if remote and len(hosts) > 1 and not shared:
        raise UsageError(f"--min-tasks {min_tasks} on hosts {', '.join(hosts)} without shared storage: the tasks that "
                         f"survive a lost host must find its checkpoint; name storage every host mounts at the same "
                         f"path in the cluster file ({EXAMPLE}), or pass the job a shared --model-dir")


def _check_batch(min_tasks: int, size: int, global_batch: int | None, per_task: int) -> int:
    sizes = range(min_tasks, size + 1)
    hint = math.lcm(*sizes) * per_task
    if global_batch is None:
        raise UsageError(f"--min-tasks {min_tasks} keeps the job's global batch over every size, so tfl must know it: "
                         f"add --global-batch G (all replicas together; e.g. {hint}), or \"global_batch\" in the "
                         f"cluster file's elastic block, or keep the per-replica batch with --elastic-batch per-replica")
    good = [n for n in sizes if global_batch % (n * per_task) == 0]
    bad = [n for n in sizes if n not in good]
    if bad:
        replicas = f" x {per_task} replicas each" if per_task > 1 else ""
        raise UsageError(f"--global-batch {global_batch} cannot be split over {_listed(bad)} training tasks{replicas} "
                         f"(--min-tasks {min_tasks} allows {min_tasks} to {size}); sizes that can: "
                         f"{_listed(good) or 'none'}; use a global batch every size divides (e.g. {hint}) or raise "
                         "--min-tasks")
    return global_batch


def _listed(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


def _with_global_batch(plan: LaunchPlan, global_batch: int) -> LaunchPlan:
    tasks = tuple(dataclasses.replace(t, env={**t.env, contract.GLOBAL_BATCH: str(global_batch)}) if t.task.is_training
                  else t for t in plan.tasks)
    return dataclasses.replace(plan, tasks=tasks)
