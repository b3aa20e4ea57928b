"""When a run over several hosts needs shared storage (pure), and the refusal, in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.describe.spec import parse_cluster
from launcher.plan.build import build_plan
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.storage import sharing_need

TWO_HOSTS = {"chief": ["h1:1000"], "worker": ["h2:1001"]}


def plan(cluster: dict[str, list[str]], *job_args: str, **extra: Any) -> LaunchPlan:
    return build_plan(parse_cluster({"cluster": cluster, **extra}), "/j.py", job_args, run_id="r1", run_dir="/runs/r1",
                      python="/py", cwd="/c")


@pytest.mark.parametrize(("cluster", "restarts", "needs"), [
    (TWO_HOSTS, 1, "--max-restarts 1: a restarted group resumes from the chief's backup on h1, which the tasks on h2 cannot see"),
    (TWO_HOSTS, 0, None),  # one group that runs once: each host's own disk will do
    ({**TWO_HOSTS, "evaluator": ["h2:1002"]}, 0, "the evaluator on h2 would never see the checkpoints the chief writes on h1"),
    ({**TWO_HOSTS, "evaluator": ["h1:1002"]}, 0, None),  # beside the chief
    ({"chief": ["h1:1000"], "worker": ["h1:1001"], "evaluator": ["h1:1002"]}, 3, None),  # one host, one disk
    ({"worker": ["h1:1000", "h2:1001"], "evaluator": ["h1:1002"]}, 0, None),  # worker:0 is the chief
    ({"chief": ["localhost:1000"], "worker": ["127.0.0.1:1001"]}, 2, None),  # this machine
])
def test_when_a_run_needs_storage_every_host_sees(cluster: dict[str, list[str]], restarts: int, needs: str | None) -> None:
    assert sharing_need(plan(cluster), restarts) == needs


def test_storage_or_an_explicit_model_dir_answers_the_need() -> None:
    assert sharing_need(plan(TWO_HOSTS, storage={"path": "/mnt/shared"}), 1) is None
    assert sharing_need(plan(TWO_HOSTS, "--model-dir", "/nfs/m"), 1) is None
    assert sharing_need(plan(TWO_HOSTS, "--model-dir=/nfs/m"), 1) is None
    assert sharing_need(plan(TWO_HOSTS, "--model-dirt"), 1) is not None


def test_launch_refuses_it_before_anything_starts_with_the_fix(tmp_path: Path, tfl_home: Path) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": TWO_HOSTS}))
    job = tmp_path / "job.py"
    job.write_text("")
    result = CliRunner().invoke(app, ["launch", str(job), "--cluster", str(cluster), "--max-restarts", "1", "--dry-run"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "tfl: error: --max-restarts 1: a restarted group resumes from the chief's backup on h1, which the tasks on h2 "
        "cannot see (each host keeps its model dir on its own disk); name storage every host mounts at the same path in "
        'the cluster file ("storage": {"path": "/mnt/shared/tfl"}), or pass the job a shared --model-dir')
    assert not (tfl_home / "runs").exists()


def test_the_job_kit_takes_the_shared_model_dir_when_the_launcher_names_one() -> None:
    from launcher.jobkit import default_model_dir
    from launcher.jobkit.context import task_context

    shared = task_context({"TFL_RUN_DIR": "/host/run", "TFL_MODEL_DIR": "/mnt/shared/tfl/r1/model"})
    assert default_model_dir(shared, "mnist") == Path("/mnt/shared/tfl/r1/model")
    assert default_model_dir(task_context({"TFL_RUN_DIR": "/host/run"}), "mnist") == Path("/host/run/model")
