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


def sharing_need(plan: LaunchPlan, max_restarts: int) -> str | None:
    """Why the plan needs storage every host sees and has none, or None."""
    remote = any(t.ssh is not None for t in plan.tasks)
    if not remote or not plan.training_tasks or model_dir_given(plan.job_args):
        return None
    if any(MODEL_DIR in t.env for t in plan.tasks):
        return None
    chief = plan.training_tasks[0]  # the chief, else worker:0 (TensorFlow's rule): tasks are in that order
    others = sorted({t.host for t in plan.training_tasks} - {chief.host})
    if max_restarts and others:
        return (f"--max-restarts {max_restarts}: a restarted group resumes from the chief's backup on {chief.host}, "
                f"which the tasks on {', '.join(others)} cannot see")
    evaluator = next((t for t in plan.tasks if not t.task.is_training and t.host != chief.host), None)
    if evaluator is not None:
        return f"the evaluator on {evaluator.host} would never see the checkpoints the chief writes on {chief.host}"
    return None


def check_sharing(plan: LaunchPlan, max_restarts: int) -> None:
    """Refuse, with the fix, a plan that needs shared storage and has none."""
    need = sharing_need(plan, max_restarts)
    if need is not None:
        raise UsageError(f"{need} (each host keeps its model dir on its own disk); name storage every host mounts "
                         f"at the same path in the cluster file ({EXAMPLE}), or pass the job a shared --model-dir")
