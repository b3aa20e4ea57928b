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


def _two_host_launch(tmp_path: Path, *options: str) -> Any:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": TWO_HOSTS}))
    job = tmp_path / "job.py"
    job.write_text("")
    return CliRunner().invoke(app, ["launch", str(job), "--cluster", str(cluster), *options, "--dry-run"])


def test_preemption_restarts_asked_for_without_shared_storage_are_refused_in_one_line(tmp_path: Path, tfl_home: Path) -> None:
    result = _two_host_launch(tmp_path, "--max-preemptions", "3")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "tfl: error: --max-preemptions 3: a restarted group resumes from the chief's backup on h1, which the tasks on h2 "
        "cannot see (each host keeps its model dir on its own disk); name storage every host mounts at the same path in "
        'the cluster file ("storage": {"path": "/mnt/shared/tfl"}), or pass the job a shared --model-dir')
    assert not (tfl_home / "runs").exists()


def test_by_default_such_a_run_has_no_preemption_restarts_and_says_so(tmp_path: Path) -> None:
    from launcher.plan.run_options import DEFAULT_MAX_PREEMPTIONS
    from launcher.plan.storage import preemption_restarts

    result = _two_host_launch(tmp_path)
    assert result.exit_code == 0 and "chief:0" in result.stdout
    (note,) = [line for line in result.stderr.splitlines() if "preemption" in line]
    assert note.startswith("tfl: no preemption restarts (--max-preemptions 0): the tasks on h2 could not see the chief's "
                           "checkpoint on h1") and "storage" in note
    assert preemption_restarts(plan(TWO_HOSTS), None, DEFAULT_MAX_PREEMPTIONS)[0] == 0
    assert preemption_restarts(plan(TWO_HOSTS), 0, DEFAULT_MAX_PREEMPTIONS) == (0, None)  # asked for: as asked
    for shared in (plan(TWO_HOSTS, storage={"path": "/mnt/shared"}), plan(TWO_HOSTS, "--model-dir", "/nfs/m"),
                   plan({"chief": ["localhost:1"], "worker": ["localhost:2"]})):
        assert preemption_restarts(shared, None, DEFAULT_MAX_PREEMPTIONS) == (DEFAULT_MAX_PREEMPTIONS, None)


def test_resume_of_a_multi_host_run_without_shared_storage_is_refused_in_one_line(tmp_path: Path, tfl_home: Path) -> None:
    """A resume is a restart of the whole group: the tasks on h2 would find no backup, start again from
    nothing while the chief resumes, and the group would die in a collective. Refused before any host is asked."""
    from launcher.records.states import RunState
    from launcher.records.store import RunRecord, RunStore
    from launcher.runs.resume import refusal

    def stopped(the_plan: LaunchPlan, run_id: str) -> RunRecord:
        return RunRecord(run_id=run_id, job="/j.py", job_args=[], run_dir=str(tfl_home / "runs" / run_id), created=1.0,
                         state=RunState.STOPPED, plan=the_plan.to_dict())

    alone = stopped(plan(TWO_HOSTS), "r1")
    RunStore(tfl_home).create(alone)
    result = CliRunner().invoke(app, ["resume", "r1"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "tfl: error: run r1: a resume restores the chief's checkpoint on h1, which the tasks on h2 cannot see (each host "
        "keeps its model dir on its own disk); launch the job again with storage every host mounts in the cluster file "
        '("storage": {"path": "/mnt/shared/tfl"}) or a shared --model-dir')
    assert RunStore(tfl_home).load("r1").state == RunState.STOPPED  # nothing claimed
    # With storage every host sees, or a shared --model-dir, or on one host, this is no reason to refuse.
    for shared in (plan(TWO_HOSTS, storage={"path": "/mnt/shared"}), plan(TWO_HOSTS, "--model-dir", "/nfs/m"),
                   plan({"chief": ["h1:1000"], "worker": ["h1:1001"]})):
        why = refusal(stopped(shared, "r2"))
        assert why is None or "cannot see" not in why, why


def test_the_summary_suggests_a_resume_only_where_tfl_resume_would_take_it() -> None:
    """A stopped two-host run without shared storage: `tfl resume` refuses it, so its summary says
    why instead of sending the user to that refusal."""
    from launcher.records.states import RunState
    from launcher.records.store import RunRecord
    from launcher.views.report import summary

    def stopped(the_plan: LaunchPlan) -> str:
        return summary(RunRecord(run_id="r1", job="/j.py", job_args=[], run_dir="/runs/r1", created=1.0,
                                 state=RunState.STOPPED, plan=the_plan.to_dict()))

    alone = stopped(plan(TWO_HOSTS))
    assert "tfl resume" not in alone
    assert alone.splitlines()[-1] == ("  no resume: the chief's checkpoint on h1 is not seen on h2 (no shared storage); launch "
                                      'the job again with "storage": {"path": "/mnt/shared/tfl"} in the cluster file or a '
                                      "shared --model-dir")
    for shared in (plan(TWO_HOSTS, storage={"path": "/mnt/shared"}), plan({"chief": ["h1:1000"], "worker": ["h1:1001"]})):
        # The model dir is on the hosts, not readable here: whether the job kept a checkpoint is not known.
        assert stopped(shared).splitlines()[-1] == ("  resume it from its last checkpoint, if the job kept one (else from "
                                                    "the start): tfl resume r1")
