"""A run record grows linearly with its tasks: TF_CONFIG's cluster is kept once per plan
(``plan.tf_cluster``), each task's own TF_CONFIG is rebuilt from it when the plan is read, and
plans recorded by an older tfl (every TF_CONFIG whole in its task's env) still load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import contract
from launcher.describe.kinds import load_description
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.run_options import SupervisorConfig
from launcher.records.store import FailureRecord, RunRecord, RunStore
from launcher.runs.launch import make_plan
from launcher.supervise.recording import initial_record


def ssh_plan(tmp_path: Path, hosts: int, per_host: int = 1, evaluator: bool = True) -> LaunchPlan:
    """A plan (never launched) of ``hosts`` SSH hosts of ``per_host`` tasks each, shared storage."""
    names = [f"10.{i // 250}.{i % 250}.7" for i in range(hosts)]
    addresses = [f"{h}:{2222 + k}" for h in names for k in range(per_host)]
    cluster = {"chief": addresses[:1], "worker": addresses[1:-1] if evaluator else addresses[1:],
               **({"evaluator": addresses[-1:]} if evaluator else {})}
    path = tmp_path / f"c{hosts}x{per_host}.json"
    path.write_text(json.dumps({"cluster": cluster, "ssh": {"user": "u", "known_hosts": str(tmp_path / "kh")},
                                "storage": {"path": "/shared/models"}}))
    job = tmp_path / "job.py"
    job.write_text("pass\n")
    return make_plan(str(job), ("--epochs", "2"), load_description(path), RunStore(tmp_path / "home"),
                     config=SupervisorConfig())


def record_size(plan: LaunchPlan) -> int:
    return len(initial_record(plan, 1.0, 0, "ssh").to_json().encode())


def test_record_is_at_most_4_kb_per_task_and_grows_linearly(tmp_path: Path) -> None:
    sizes = {t: record_size(ssh_plan(tmp_path, t)) for t in (64, 128, 256)}
    assert sizes[256] <= 4096 * 256, sizes
    # Doubling the tasks doubles the record (T² would make it 4×): a constant part is allowed.
    assert 1.8 <= sizes[256] / sizes[128] <= 2.2, sizes
    assert 1.8 <= sizes[128] / sizes[64] <= 2.2, sizes


def test_many_tasks_per_host_keep_the_rule(tmp_path: Path) -> None:
    plan = ssh_plan(tmp_path, 32, per_host=8)
    assert len(plan.tasks) == 256
    assert record_size(plan) <= 4096 * 256


def test_the_recorded_plan_gives_back_every_tasks_tf_config(tmp_path: Path) -> None:
    plan = ssh_plan(tmp_path, 5)
    recorded = json.loads(initial_record(plan, 1.0, 0, "ssh").to_json())["plan"]
    assert recorded["tf_cluster"] == {"chief": ["10.0.0.7:2222"], "worker": [f"10.0.{i}.7:2222" for i in (1, 2, 3)],
                                      "evaluator": ["10.0.4.7:2222"]}
    assert all(contract.TF_CONFIG not in t["env"] and t["tf_config"] == "plan" for t in recorded["tasks"])
    again = LaunchPlan.from_dict(recorded)
    assert again == plan
    for before, after in zip(plan.tasks, again.tasks, strict=True):
        assert after.env[contract.TF_CONFIG] == before.env[contract.TF_CONFIG]
    evaluator = json.loads(again.tasks[-1].env[contract.TF_CONFIG])
    assert evaluator["task"] == {"type": "evaluator", "index": 0} and "evaluator" in evaluator["cluster"]
    assert "evaluator" not in json.loads(again.tasks[1].env[contract.TF_CONFIG])["cluster"]


def test_a_task_whose_tf_config_is_its_own_keeps_it_whole(tmp_path: Path) -> None:
    """A resized evaluator's TF_CONFIG names only itself: not drawn from the plan's cluster."""
    import dataclasses

    plan = ssh_plan(tmp_path, 4)
    own = json.dumps({"cluster": {"evaluator": ["elsewhere:1"]}, "task": {"type": "evaluator", "index": 0}})
    evaluator = dataclasses.replace(plan.tasks[-1], env={**plan.tasks[-1].env, contract.TF_CONFIG: own})
    plan = dataclasses.replace(plan, tasks=(*plan.tasks[:-1], evaluator))
    recorded = plan.to_dict()
    assert recorded["tasks"][-1]["env"][contract.TF_CONFIG] == own and "tf_config" not in recorded["tasks"][-1]
    assert LaunchPlan.from_dict(json.loads(json.dumps(recorded))) == plan


def test_a_record_of_the_older_form_still_loads(tmp_path: Path) -> None:
    """Records of main 211f8bd (version 4): every task's TF_CONFIG whole in its env, no tf_cluster."""
    plan = ssh_plan(tmp_path, 3)
    data = json.loads(initial_record(plan, 1.0, 0, "ssh").to_json())
    data["version"] = 4
    del data["plan"]["tf_cluster"]
    for task, launch in zip(data["plan"]["tasks"], plan.tasks, strict=True):
        del task["tf_config"]
        task["env"][contract.TF_CONFIG] = launch.env[contract.TF_CONFIG]
    record = RunRecord.from_json(json.dumps(data, indent=1))
    assert LaunchPlan.from_dict(record.plan) == plan


def test_saving_a_record_copies_nothing_and_writes_what_asdict_gave(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dataclasses.asdict`` deep-copied the whole plan on every save (0.2 s of CPU per save at 64 tasks)."""
    import copy
    import dataclasses

    record = initial_record(ssh_plan(tmp_path, 64), 1.0, 0, "ssh")
    record.failures.append(FailureRecord("worker:0", "10.0.1.7", 12, 3, "exit code 3", ["boom"], 2.0, 0))
    record.lost_hosts["10.0.2.7"] = "unreachable"
    expected = json.dumps(dataclasses.asdict(record), separators=(",", ":"))
    copies: list[object] = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda value, *args: copies.append(value) or real(value, *args))
    assert record.to_json() == expected
    assert copies == []
    assert RunRecord.from_json(record.to_json()) == RunRecord.from_json(expected)
