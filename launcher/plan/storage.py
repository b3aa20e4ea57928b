"""When a run over several hosts needs storage they all see, and its refusal when it has none.

Without ``storage`` in the cluster file, each remote host keeps its tasks' run dir, and the
default model dir in it, on its own disk. That is enough for one training group that runs
once. It is not when the group may restart (every task restores the *chief's* backup: a
worker that finds none starts again from epoch 0 while the chief resumes, and the group
dies in a collective) or when the evaluator runs on another host than the chief (it would
never see a checkpoint). Such a run is refused before anything starts. A ``--model-dir``
job argument is the user's own choice of a dir, taken as shared, as before. Pure.
"""

from __future__ import annotations

from launcher.contract import MODEL_DIR
from launcher.errors import UsageError
from launcher.plan.launch_plan import LaunchPlan

EXAMPLE = '"storage": {"path": "/mnt/shared/tfl"}'


def model_dir_given(job_args: tuple[str, ...]) -> bool:
    return any(a == "--model-dir" or a.startswith("--model-dir=") for a in job_args)


def restart_need(plan: LaunchPlan) -> tuple[str, list[str]] | None:
    """The chief's host and the other training hosts, when a restarted group could not see the
    chief's backup (remote hosts, no storage they all see); else None."""
    remote = any(t.ssh is not None for t in plan.tasks)
    if not remote or not plan.training_tasks or model_dir_given(plan.job_args):
        return None
    if any(MODEL_DIR in t.env for t in plan.tasks):
        return None
    chief = plan.training_tasks[0]  # the chief, else worker:0 (TensorFlow's rule): tasks are in that order
    others = sorted({t.host for t in plan.training_tasks} - {chief.host})
    return (chief.host, others) if others else None


def _unseen_backup(option: str, need: tuple[str, list[str]]) -> str:
    return (f"{option}: a restarted group resumes from the chief's backup on {need[0]}, "
            f"which the tasks on {', '.join(need[1])} cannot see")


def sharing_need(plan: LaunchPlan, max_restarts: int, max_preemptions: int = 0) -> str | None:
    """Why the plan needs storage every host sees and has none, or None."""
    restart = restart_need(plan)
    if restart is not None and max_restarts:
        return _unseen_backup(f"--max-restarts {max_restarts}", restart)
    if restart is not None and max_preemptions:
        return _unseen_backup(f"--max-preemptions {max_preemptions}", restart)
    if any(MODEL_DIR in t.env for t in plan.tasks) or model_dir_given(plan.job_args) or not any(t.ssh for t in plan.tasks):
        return None
    chief = plan.training_tasks[0] if plan.training_tasks else None
    evaluator = next((t for t in plan.tasks if not t.task.is_training and chief and t.host != chief.host), None)
    if chief is not None and evaluator is not None:
        return f"the evaluator on {evaluator.host} would never see the checkpoints the chief writes on {chief.host}"
    return None


def check_sharing(plan: LaunchPlan, max_restarts: int, max_preemptions: int = 0) -> None:
    """Refuse, with the fix, a plan that needs shared storage and has none."""
    need = sharing_need(plan, max_restarts, max_preemptions)
    if need is not None:
        raise UsageError(f"{need} (each host keeps its model dir on its own disk); name storage every host mounts "
                         f"at the same path in the cluster file ({EXAMPLE}), or pass the job a shared --model-dir")


def preemption_restarts(plan: LaunchPlan, asked: int | None, default: int) -> tuple[int, str | None]:
    """``--max-preemptions`` as the run takes it, and a note when it is not what the user would assume.

    A preemption restart resumes from the chief's agreed checkpoint like any restart: without
    storage the hosts share, it is doomed (the other hosts' tasks find no backup). Asked for,
    it is refused (``check_sharing``); left at its default, it is 0 for such a plan: a preempted
    run ends PREEMPTED at once, and the note says how to have the restarts."""
    if asked is not None:
        check_sharing(plan, 0, asked)
        return asked, None
    need = restart_need(plan)
    if need is None:
        return default, None
    return 0, (f"tfl: no preemption restarts (--max-preemptions 0): the tasks on {', '.join(need[1])} could not see the "
               f"chief's checkpoint on {need[0]}; for them, name storage every host mounts in the cluster file ({EXAMPLE}) "
               "or pass the job a shared --model-dir")
