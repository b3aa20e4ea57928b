"""TF_CONFIG and TFL_* parsing: roles, chief rule, training-task counts, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.jobkit.context import JobKitError, TaskContext, parse_tf_config, task_context


def config(cluster: dict[str, list[str]], task_type: str, index: int = 0) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


CHIEF_WORKER_EVAL = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "evaluator": ["h:4"]}
WORKERS_ONLY = {"worker": ["h:1", "h:2"]}


@pytest.mark.parametrize("raw", [None, "", "   "])
def test_no_tf_config_is_a_lone_chief(raw: str | None) -> None:
    task_type, index, cluster = parse_tf_config(raw)
    ctx = TaskContext(task_type, index, cluster)
    assert (ctx.is_chief, ctx.is_evaluator, ctx.num_training_tasks, ctx.is_multi_worker) == (
        True, False, 1, False)


@pytest.mark.parametrize(
    ("cluster", "task_type", "index", "chief", "evaluator", "training", "multi"),
    [
        (CHIEF_WORKER_EVAL, "chief", 0, True, False, 3, True),
        (CHIEF_WORKER_EVAL, "worker", 0, False, False, 3, True),
        (CHIEF_WORKER_EVAL, "worker", 1, False, False, 3, True),
        (CHIEF_WORKER_EVAL, "evaluator", 0, False, True, 3, False),
        (WORKERS_ONLY, "worker", 0, True, False, 2, True),
        (WORKERS_ONLY, "worker", 1, False, False, 2, True),
        ({"worker": ["h:1"]}, "worker", 0, True, False, 1, False),
        ({"chief": ["h:1"], "evaluator": ["h:2"]}, "chief", 0, True, False, 1, False),
        ({"chief": ["h:1"], "evaluator": ["h:2"]}, "evaluator", 0, False, True, 1, False),
    ],
)
def test_roles(cluster: dict[str, list[str]], task_type: str, index: int, chief: bool,
               evaluator: bool, training: int, multi: bool) -> None:
    ctx = task_context({"TF_CONFIG": config(cluster, task_type, index)})
    assert (ctx.task_type, ctx.task_index) == (task_type, index)
    assert ctx.is_chief is chief
    assert ctx.is_evaluator is evaluator
    assert ctx.num_training_tasks == training
    assert ctx.is_multi_worker is multi


def test_tfl_variables() -> None:
    ctx = task_context({
        "TF_CONFIG": config(WORKERS_ONLY, "worker", 1), "TFL_TASK": "worker:1", "TFL_RUN_ID": "r1",
        "TFL_ATTEMPT": "2", "TFL_RUN_DIR": "/runs/r1", "TFL_PROGRESS_FILE": "/runs/r1/p.json",
        "TFL_PROGRESS_LOG": "/runs/r1/steps.jsonl",
    })
    assert ctx.label == "worker:1" and ctx.run_id == "r1" and ctx.attempt == 2
    assert ctx.run_dir == Path("/runs/r1")
    assert ctx.progress_file == Path("/runs/r1/p.json")
    assert ctx.progress_log == Path("/runs/r1/steps.jsonl")


def test_by_hand_defaults() -> None:
    ctx = task_context({})
    assert ctx.label == "chief:0" and ctx.attempt == 0
    assert ctx.run_id is None and ctx.run_dir is None and ctx.progress_file is None
    assert task_context({"TF_CONFIG": config(WORKERS_ONLY, "worker", 1)}).label == "worker:1"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), "cluster is missing"),
        (json.dumps({"cluster": WORKERS_ONLY}), "task is missing"),
        (config({"worker": ["h:1"], "ps": ["h:2"]}, "worker"), "cluster.ps is not supported"),
        (config(WORKERS_ONLY, "ps"), "'ps'"),
        (config(WORKERS_ONLY, "worker", 2), "cluster.worker has 2 entries"),
        (config(WORKERS_ONLY, "worker", -1), "integer >= 0"),
        (json.dumps({"cluster": WORKERS_ONLY, "task": {"type": "worker", "index": "0"}}), "integer"),
        (config({"chief": ["h:1", "h:2"]}, "chief"), "at most one chief"),
        (config({"evaluator": ["h:1"]}, "evaluator"), "no chief or worker"),
        (config({"worker": "h:1"}, "worker"), "list of 'host:port'"),  # type: ignore[dict-item]
    ],
)
def test_bad_tf_config_says_what_is_wrong(raw: str, fragment: str) -> None:
    with pytest.raises(JobKitError, match="TF_CONFIG") as caught:
        parse_tf_config(raw)
    assert fragment in str(caught.value)


def test_bad_attempt() -> None:
    with pytest.raises(JobKitError, match="TFL_ATTEMPT"):
        task_context({"TFL_ATTEMPT": "first"})
