"""TF_CONFIG and the launch plan are pure functions of the spec."""

from __future__ import annotations

import json

import pytest

from launcher.describe.spec import parse_cluster
from launcher.plan.build import build_plan, render_plan
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.tfconfig import TaskId, tasks_of, tf_config

SPEC = parse_cluster({
    "cluster": {"chief": ["h1:1000"], "worker": ["h2:1001", "h3:1002"], "evaluator": ["h4:1003"]},
    "env": {"SHARED": "yes", "OVERRIDE": "global"},
    "hosts": {"h2": {"python": "/opt/py", "workdir": "/srv/w", "env": {"OVERRIDE": "h2"}}},
})


def plan() -> LaunchPlan:
    return build_plan(SPEC, "/abs/job.py", ("--epochs", "2"), run_id="r1", run_dir="/runs/r1", python="/venv/python", cwd="/here")


def test_task_order_and_ids() -> None:
    assert [str(t) for t in tasks_of(SPEC.cluster)] == ["chief:0", "worker:0", "worker:1", "evaluator:0"]
    assert TaskId.parse("worker:1") == TaskId("worker", 1)
    with pytest.raises(ValueError, match="type:index"):
        TaskId.parse("ps:0")


def test_tf_config_of_training_task_excludes_evaluator() -> None:
    assert tf_config(SPEC.cluster, TaskId("worker", 1)) == {
        "cluster": {"chief": ["h1:1000"], "worker": ["h2:1001", "h3:1002"]},
        "task": {"type": "worker", "index": 1},
    }


def test_tf_config_of_evaluator_includes_itself() -> None:
    config = tf_config(SPEC.cluster, TaskId("evaluator", 0))
    assert config["cluster"]["evaluator"] == ["h4:1003"] and config["task"] == {"type": "evaluator", "index": 0}


def test_plan_env_argv_and_paths() -> None:
    p = plan()
    worker0 = p.tasks[1]
    assert worker0.name == "worker:0" and worker0.host == "h2" and worker0.port == 1001
    assert worker0.argv == ("/opt/py", "-u", "/abs/job.py", "--epochs", "2")
    assert worker0.cwd == "/srv/w"
    assert worker0.env["OVERRIDE"] == "h2" and worker0.env["SHARED"] == "yes"
    assert worker0.env["TF_USE_LEGACY_KERAS"] == "1"
    assert json.loads(worker0.env["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert worker0.env["TFL_TASK"] == "worker:0" and worker0.env["TFL_RUN_ID"] == "r1"
    assert worker0.log_path == "/runs/r1/logs/worker-0.log"
    assert p.tasks[0].argv[0] == "/venv/python" and p.tasks[0].cwd == "/here"
    assert p.tasks[0].env["OVERRIDE"] == "global"
    assert [t.name for t in p.training_tasks] == ["chief:0", "worker:0", "worker:1"]


def test_tf_config_never_on_command_line() -> None:
    for task in plan().tasks:
        assert not any("cluster" in arg for arg in task.argv)


def test_plan_round_trips_through_dict() -> None:
    p = plan()
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p


def test_render_shows_every_task_and_pretty_tf_config() -> None:
    text = render_plan(plan())
    for name in ("chief:0", "worker:0", "worker:1", "evaluator:0"):
        assert f"\n{name}  on " in text
    assert '"type": "evaluator"' in text and "/runs/r1/logs/chief-0.log" in text
    assert "command: /opt/py -u /abs/job.py --epochs 2" in text


def test_the_chief_knows_the_run_has_an_evaluator() -> None:
    """Training tasks' TF_CONFIG leaves the evaluator out, so the chief took the run for one without
    and kept 5 checkpoints: an evaluator more than 5 epochs behind (or restarted) lost the others."""
    from launcher.jobkit.context import task_context

    chief = next(t for t in plan().tasks if str(t.task) == "chief:0")
    assert task_context(chief.env).has_evaluator
    alone = parse_cluster({"cluster": {"chief": ["h1:1000"], "worker": ["h2:1001"]}})
    plain = build_plan(alone, "/abs/job.py", (), run_id="r1", run_dir="/runs/r1", python="/venv/python", cwd="/here")
    assert not task_context(plain.tasks[0].env).has_evaluator
