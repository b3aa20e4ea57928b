"""Elastic runs, the pure part: the launch-time refusals and the resize planner."""

from __future__ import annotations

import json
import os
from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from launcher.describe.spec import parse_cluster
from launcher.errors import UsageError
from launcher.plan.build import build_plan
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.resize import check_elastic, elastic_options, resize_plan, training_size

STORAGE = {"path": "/mnt/shared/tfl"}
# Chief on h0, workers on h1 and h2 (two on h2 in the bigger one), evaluator on h3 or beside the chief.
THREE = {"chief": ["h0:1000"], "worker": ["h1:1001", "h2:1002"]}
WIDE = {"chief": ["h0:1000"], "worker": ["h1:1001", "h2:1002", "h2:1003"], "evaluator": ["h3:1004"]}


def plan(cluster: dict[str, list[str]], *job_args: str, **extra: Any) -> LaunchPlan:
    spec = parse_cluster({"cluster": cluster, **extra})
    return build_plan(spec, "/src/job.py", job_args, run_id="r", run_dir="/runs/r", python="py", cwd="/")


def tf_config(p: LaunchPlan, name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(next(t for t in p.tasks if t.name == name).env["TF_CONFIG"])
    return config


# --- the resize planner ------------------------------------------------------------------
def test_a_lost_worker_host_leaves_the_others_renumbered_with_their_files() -> None:
    full = plan(WIDE, storage=STORAGE)
    resize = resize_plan(full, {"h1"})
    assert [(t.name, t.host, t.port) for t in resize.plan.tasks] == [
        ("chief:0", "h0", 1000), ("worker:0", "h2", 1002), ("worker:1", "h2", 1003), ("evaluator:0", "h3", 1004)]
    assert resize.renamed == (("worker:1", "worker:0"), ("worker:2", "worker:1")) and resize.dropped == ("worker:0",)
    assert resize.training_size == 3
    cluster = {"chief": ["h0:1000"], "worker": ["h2:1002", "h2:1003"]}
    assert tf_config(resize.plan, "worker:1") == {"cluster": cluster, "task": {"type": "worker", "index": 1}}
    assert tf_config(resize.plan, "evaluator:0")["cluster"] == {**cluster, "evaluator": ["h3:1004"]}
    moved = resize.plan.tasks[1]
    assert moved.env["TFL_TASK"] == "worker:0"
    # Its files stay those of the task as launched: one log per slot for the whole run.
    assert moved.log_path == "/runs/r/logs/worker-1.log" and moved.progress_path == "/runs/r/progress/worker-1.json"
    assert moved.env["TFL_PROGRESS_FILE"].endswith("/progress/worker-1.json")
    assert resize.notes == ("worker:1 on h2 is now worker:0", "worker:2 on h2 is now worker:1")


def test_the_first_surviving_worker_becomes_chief_when_the_chiefs_host_is_lost() -> None:
    resize = resize_plan(plan(THREE, storage=STORAGE), {"h0"})
    assert [(t.name, t.host) for t in resize.plan.tasks] == [("chief:0", "h1"), ("worker:0", "h2")]
    assert tf_config(resize.plan, "chief:0") == {"cluster": {"chief": ["h1:1001"], "worker": ["h2:1002"]},
                                                 "task": {"type": "chief", "index": 0}}
    assert resize.plan.tasks[0].env["TFL_TASK"] == "chief:0"
    assert resize.renamed == (("worker:0", "chief:0"), ("worker:1", "worker:0"))


def test_a_cluster_without_chief_keeps_none() -> None:
    resize = resize_plan(plan({"worker": ["h0:1", "h1:2", "h2:3"]}, storage=STORAGE), {"h0"})
    assert [t.name for t in resize.plan.tasks] == ["worker:0", "worker:1"]
    assert tf_config(resize.plan, "worker:0")["cluster"] == {"worker": ["h1:2", "h2:3"]}


def test_the_evaluator_is_left_out_while_its_host_is_lost_and_says_so() -> None:
    resize = resize_plan(plan(WIDE, storage=STORAGE), {"h3"})
    assert [t.name for t in resize.plan.tasks] == ["chief:0", "worker:0", "worker:1", "worker:2"]
    assert resize.renamed == () and resize.dropped == ("evaluator:0",)
    assert resize.notes == ("the evaluator is left out while h3 is lost (training goes on without it)",)


def test_nothing_lost_gives_back_the_full_plan() -> None:
    full = plan(WIDE, storage=STORAGE)
    resize = resize_plan(full, set())
    assert resize.plan == full and resize.renamed == () and resize.dropped == () and resize.notes == ()


@pytest.mark.parametrize("lost", [set(c) for n in range(0, 5) for c in combinations(["h0", "h1", "h2", "h3"], n)])
def test_every_resize_is_a_consistent_cluster(lost: set[str]) -> None:
    """For every set of lost hosts: each task's TF_CONFIG names the same cluster, its own
    address at its own index, a chief first, the task types in order, no lost host."""
    full = plan(WIDE, storage=STORAGE)
    resize = resize_plan(full, lost)
    tasks = resize.plan.tasks
    assert {t.host for t in tasks}.isdisjoint(lost)
    assert resize.training_size == training_size(full, lost) == sum(t.host not in lost for t in full.training_tasks)
    training = [t for t in tasks if t.task.is_training]
    if training:
        assert training[0].name == "chief:0"
        assert [t.name for t in training[1:]] == [f"worker:{i}" for i in range(len(training) - 1)]
    clusters = {json.dumps(tf_config(resize.plan, t.name)["cluster"], sort_keys=True) for t in training}
    assert len(clusters) <= 1  # every training task sees the same cluster
    for t in tasks:
        config = tf_config(resize.plan, t.name)
        assert config["task"] == {"type": t.task.type, "index": t.task.index} and t.env["TFL_TASK"] == t.name
        assert config["cluster"][t.task.type][t.task.index] == f"{t.host}:{t.port}"
        if t.task.is_training:
            assert "evaluator" not in config["cluster"]
    assert sorted(resize.dropped) == sorted(t.name for t in full.tasks if t.host in lost)
    assert len(tasks) + len(resize.dropped) == len(full.tasks)


# --- at launch ---------------------------------------------------------------------------
def test_min_tasks_larger_than_the_cluster_is_refused() -> None:
    with pytest.raises(UsageError, match=r"^--min-tasks 4: the cluster has 3 training tasks \(the chief included\); "
                                         r"give --min-tasks 3 or less$"):
        check_elastic(plan(THREE, storage=STORAGE), min_tasks=4, global_batch=60)


def test_several_hosts_without_shared_storage_are_refused_with_the_fix() -> None:
    with pytest.raises(UsageError) as err:
        check_elastic(plan(THREE), min_tasks=2, global_batch=60)
    assert str(err.value) == (
        "--min-tasks 2 on hosts h0, h1, h2 without shared storage: the tasks that survive a lost host must find its "
        'checkpoint; name storage every host mounts at the same path in the cluster file ("storage": {"path": '
        '"/mnt/shared/tfl"}), or pass the job a shared --model-dir')
    assert check_elastic(plan(THREE, "--model-dir", "/nfs/m"), min_tasks=2, global_batch=60)  # the user's shared dir
    local = plan({"chief": ["localhost:1"], "worker": ["localhost:2"]})
    assert check_elastic(local, min_tasks=1, global_batch=2)  # one machine: nothing to share


def test_the_global_batch_must_be_known_and_divisible_by_every_allowed_size() -> None:
    p = plan(THREE, storage=STORAGE)
    with pytest.raises(UsageError, match=r"tfl must know it: add --global-batch G \(all replicas together; e\.g\. 6\)"):
        check_elastic(p, min_tasks=2)
    with pytest.raises(UsageError) as err:
        check_elastic(p, min_tasks=1, global_batch=64)
    assert str(err.value) == ("--global-batch 64 cannot be split over 3 training tasks (--min-tasks 1 allows 1 to 3); "
                              "sizes that can: 1, 2; use a global batch every size divides (e.g. 6) or raise --min-tasks")
    with pytest.raises(UsageError, match=r"over 2, 3 training tasks x 4 replicas each .* sizes that can: none; .* \(e\.g\. 24\)"):
        check_elastic(p, min_tasks=2, global_batch=4, virtual_devices=4)
    kept = check_elastic(p, min_tasks=2, global_batch=96)
    assert [t.env.get("TFL_GLOBAL_BATCH") for t in kept.tasks] == ["96", "96", "96"]


def test_per_replica_keeps_the_jobs_batch_and_refuses_a_global_one() -> None:
    p = plan(THREE, storage=STORAGE)
    assert check_elastic(p, min_tasks=2, batch="per-replica") == p
    with pytest.raises(UsageError, match="--global-batch with --elastic-batch per-replica"):
        check_elastic(p, min_tasks=2, batch="per-replica", global_batch=8)
    with pytest.raises(UsageError, match="--elastic-batch sideways: choose 'global'"):
        check_elastic(p, min_tasks=2, batch="sideways")


def test_no_min_tasks_changes_nothing_and_a_lone_global_batch_is_refused() -> None:
    p = plan(THREE, storage=STORAGE)
    assert check_elastic(p, min_tasks=None) == p
    with pytest.raises(UsageError, match="--global-batch goes with --min-tasks"):
        check_elastic(p, min_tasks=None, global_batch=8)


def test_an_elastic_batch_without_min_tasks_is_refused_not_ignored(tfl_home: Path) -> None:
    # `--elastic-batch` says what a resize keeps: without --min-tasks there is no resize, and the
    # option was dropped without a word (a bad value too), so the user believed the run elastic.
    p = plan(THREE, storage=STORAGE)
    with pytest.raises(UsageError, match=r"^--elastic-batch per-replica goes with --min-tasks .*add --min-tasks N$"):
        check_elastic(p, min_tasks=None, batch="per-replica")
    with pytest.raises(UsageError, match="--elastic-batch sideways: choose 'global'"):
        check_elastic(p, min_tasks=None, batch="sideways")
    from typer.testing import CliRunner

    from launcher.cli import app

    job = str(Path(__file__).resolve().parent.parent / "jobs" / "mnist.py")
    for value, message in (("per-replica", "--elastic-batch per-replica goes with --min-tasks"),
                           ("sideways", "--elastic-batch sideways: choose 'global'")):
        result = CliRunner().invoke(app, ["launch", job, "--local", "2", "--elastic-batch", value, "--dry-run"])
        assert result.exit_code == 2 and message in result.stderr, result.output
        assert "TF_CONFIG=" not in result.stdout
    assert not tfl_home.exists()


def test_the_cluster_files_elastic_block_unless_the_command_line_says_otherwise() -> None:
    spec = parse_cluster({"cluster": THREE, "storage": STORAGE, "elastic": {"min_tasks": 2, "global_batch": 12}})
    assert elastic_options(spec, None, None, None) == {"min_tasks": 2, "elastic_batch": "global", "global_batch": 12,
                                                       "evaluator_moves_to": ()}
    assert elastic_options(spec, 3, "per-replica", 6) == {"min_tasks": 3, "elastic_batch": "per-replica", "global_batch": 6,
                                                          "evaluator_moves_to": ()}
    assert elastic_options(parse_cluster({"cluster": THREE}), None, None, None)["min_tasks"] is None
    with pytest.raises(Exception, match="min_tasks"):
        parse_cluster({"cluster": THREE, "elastic": {"min_tasks": 0}})


def test_launch_refuses_in_one_line(tmp_path: Path, tfl_home: Path) -> None:
    from typer.testing import CliRunner

    from launcher.cli import app

    job = tmp_path / "job.py"
    job.write_text("print('never runs')\n")
    (tmp_path / "c.json").write_text(json.dumps({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]},
                                                 "elastic": {"min_tasks": 3}}))
    result = CliRunner().invoke(app, ["launch", str(job), "--cluster", str(tmp_path / "c.json"), "--dry-run"])
    assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
        "tfl: error: --min-tasks 3: the cluster has 2 training tasks (the chief included); give --min-tasks 2 or less"]
    result = CliRunner().invoke(app, ["launch", str(job), "--local", "2", "--min-tasks", "1", "--global-batch", "8",
                                      "--dry-run"])
    assert result.exit_code == 0 and result.stdout.count("TFL_GLOBAL_BATCH=8") == 2


def test_the_ssh_watch_lets_a_lost_host_take_tasks_again_once_it_answers() -> None:
    from launcher.engines.ssh.watch import HostWatch

    class Task:
        host, port, heard, heard_wall = "h2", 22, 0.0, 100.0
        declared: list[str] = []

        def running(self) -> bool:
            return True

        def declare_lost(self, cause: str, since: float) -> None:
            self.declared.append(cause)

    watch = HostWatch(lambda: None, probe=lambda host, port: False, wall=lambda: 110.0)
    watch.confirm(Task())
    lost = watch.lost("h2")
    assert lost is not None and Task.declared == [lost.describe()]
    assert watch.forget("h2")  # a probe logged in there again (``SSHBackend.probe``)
    assert watch.lost("h2") is None and not watch.forget("h2")


def test_min_tasks_on_one_host_is_said_to_gain_nothing_but_the_batch(tmp_path: Path, tfl_home: Path) -> None:
    """`--local N --min-tasks M`: every task shares the one host there is to lose. Allowed (the
    kept global batch still counts: a fixed-size control run uses it), but said in one line."""
    import subprocess
    import sys

    from launcher.plan.resize import one_host_warning

    assert one_host_warning(plan(THREE, storage=STORAGE), 2) is None  # several hosts: truly elastic
    assert one_host_warning(plan({"chief": ["localhost:1"], "worker": ["localhost:2"]}), None) is None  # not elastic
    job = tmp_path / "job.py"
    job.write_text("import os; print('batch', os.environ['TFL_GLOBAL_BATCH'])\n")
    done = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--local", "2", "--min-tasks", "1",
                           "--global-batch", "8"], env={**os.environ, "TFL_HOME": str(tfl_home)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.count("batch 8") == 2, done.stderr
    warned = [line for line in done.stderr.splitlines() if "--min-tasks" in line]
    assert warned == ["tfl: warning: --min-tasks 1 gains nothing here: every training task runs on 127.0.0.1, so no "
                      "host can be lost while others go on; it keeps the global batch, and tasks failing "
                      "--blacklist-after 2 attempts in a row lose that host, which ends the run whatever --max-restarts "
                      "allows; spread the tasks over hosts with --cluster FILE for an elastic run"], done.stderr
    local = plan({"chief": ["localhost:1"], "worker": ["localhost:2"]})
    assert "lose that host" not in str(one_host_warning(local, 1, blacklist_after=0))  # 0: never lost for failing
