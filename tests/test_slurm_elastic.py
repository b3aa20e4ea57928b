"""Elastic runs on Slurm without a cluster: what is refused at launch, the ``lost`` event, the
task driver's ``survivors``, the batch script's resize run by bash against fake Slurm
commands, and how the launcher records a resize. (On the private cluster:
tests/test_slurm_elastic_runs.py.)"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.contract import SLURM_LAYOUT, SLURM_NODES
from launcher.engines.base import GroupResize
from launcher.engines.slurm.node import task as driver
from launcher.engines.slurm.node.batch import LostNodes, StepEvents, parse_events
from launcher.engines.slurm.outcome import below_minimum, preemption_counts, renamed_notes, training_outcome
from launcher.engines.slurm.script import BatchJob, render_batch_script, sbatch_header
from launcher.engines.slurm.settings import parse_slurm_cluster
from launcher.errors import UsageError
from launcher.plan.launch_plan import LaunchPlan
from launcher.records.store import RunRecord
from launcher.supervise.recording import group_went_on, initial_record
from tests.conftest import ROOT
from tests.test_slurm_script import batch, events, fake_slurm

pytestmark = pytest.mark.slurm  # the Slurm suite (these need no cluster)


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env={**os.environ, "TFL_HOME": str(home)},
                          capture_output=True, text=True, timeout=120, cwd=ROOT)


def slurm_file(tmp_path: Path, **extra: object) -> Path:
    path = tmp_path / "slurm.json"
    path.write_text(json.dumps({"slurm": {"nodes": 2, "tasks_per_node": 2}, **extra}))
    return path


# --- at launch --------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "message"), [
    (["--min-tasks", "5", "--global-batch", "60"],
     "tfl: error: --min-tasks 5: the cluster has 4 training tasks (the chief included); give --min-tasks 4 or less\n"),
    (["--min-tasks", "2", "--global-batch", "32"],
     "tfl: error: --global-batch 32 cannot be split over 3 training tasks (--min-tasks 2 allows 2 to 4); sizes that can: "
     "2, 4; use a global batch every size divides (e.g. 12) or raise --min-tasks\n"),
    (["--min-tasks", "2"], None),  # no global batch: the fix names one
])
def test_what_cannot_go_on_is_refused_in_one_line(tfl_home: Path, tmp_path: Path, args: list[str], message: str | None) -> None:
    job = tmp_path / "job.py"
    job.write_text("print('hi')\n")
    done = cli(tfl_home, "launch", str(job), "--cluster", str(slurm_file(tmp_path)), "--dry-run", *args)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    if message is not None:
        assert done.stderr == message
    else:
        assert done.stderr.startswith("tfl: error: --min-tasks 2 keeps the job's global batch") and "e.g. 12" in done.stderr


def test_the_dry_run_shows_the_elastic_script(tfl_home: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text("print('hi')\n")
    path = slurm_file(tmp_path, elastic={"min_tasks": 2, "global_batch": 24})  # the description's block
    done = cli(tfl_home, "launch", str(job), "--cluster", str(path), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --no-kill" in done.stdout and "export TFL_GLOBAL_BATCH=24" in done.stdout
    assert 'srun --nodes="$train_nodes" --ntasks="$train_tasks" --nodelist="$train_nodelist" --exact' in done.stdout
    plain = cli(tfl_home, "launch", str(job), "--cluster", str(slurm_file(tmp_path)), "--dry-run")
    assert "--no-kill" not in plain.stdout and "train_nodes" not in plain.stdout and "GLOBAL_BATCH" not in plain.stdout


def test_with_requeue_it_is_refused(tfl_home: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text("print('hi')\n")
    path = tmp_path / "requeue.json"
    path.write_text(json.dumps({"slurm": {"nodes": 2, "requeue": True}, "elastic": {"min_tasks": 1, "global_batch": 4}}))
    done = cli(tfl_home, "launch", str(job), "--cluster", str(path), "--dry-run")
    assert done.returncode == 2 and done.stderr == ("tfl: error: --min-tasks with the slurm block's \"requeue\": true: a "
                                                    "requeued job starts again on every node, at the full size, behind the "
                                                    "launcher's back; remove one of the two\n"), done.stderr


def test_inside_an_allocation_it_is_refused(tmp_path: Path) -> None:
    from launcher.describe.hosts import RemoteOptions
    from launcher.engines.slurm.plan import build_slurm_plan
    from launcher.engines.slurm.settings import AllocationSpec
    from launcher.plan.run_options import SupervisorConfig

    spec = AllocationSpec.model_validate({"slurm": {"nodes": 2}, "job_id": "42"})
    with pytest.raises(UsageError, match=r"^--min-tasks inside allocation 42: Slurm ends an allocation when one of its "
                                         r"nodes fails unless it was made with --no-kill"):
        build_slurm_plan(spec, "/j.py", (), run_id="r", run_dir=str(tmp_path), python="py", cwd="/", remote=RemoteOptions(),
                         virtual_devices=None, config=SupervisorConfig(min_tasks=1, global_batch=4))


def test_the_header_has_no_kill_only_when_elastic() -> None:
    assert "#SBATCH --no-kill" in sbatch_header(BatchJob(**{**batch().__dict__, "min_tasks": 1}))
    assert "#SBATCH --no-kill" not in sbatch_header(batch())
    assert parse_slurm_cluster({"slurm": {"nodes": 2}, "elastic": {"min_tasks": 1}}).elastic is not None


def test_moving_the_evaluator_is_refused_on_slurm_naming_the_field() -> None:
    from launcher.errors import ClusterFileError

    with pytest.raises(ClusterFileError) as caught:
        parse_slurm_cluster({"slurm": {"nodes": 2, "evaluator": True}, "elastic": {"min_tasks": 1, "evaluator_moves_to": "any"}})
    assert "elastic" in str(caught.value) and "evaluator_moves_to" in str(caught.value) and "\n" not in str(caught.value)


# --- the lost event and the driver's survivors --------------------------------------------

def test_the_lost_event_round_trips() -> None:
    lost = LostNodes(3, 4, 2, ("n1", "n2"), ("n2",))
    assert lost.event() == "lost 3 4 2 n1,n2 n2" and lost.lost == ("n1",)
    parsed = parse_events(f"training 3 start\n{lost.event()}\ntraining 3 exit 137\nlost 4 2 0 n2 -\n")
    assert parsed.lost == {3: lost, 4: LostNodes(4, 2, 0, ("n2",), ())} and parsed.exits == {3: 137}


def test_renamed_tasks_follow_block_order() -> None:
    assert renamed_notes(LostNodes(0, 2, 1, ("n1", "n2"), ("n1",))) == ()
    assert renamed_notes(LostNodes(0, 2, 1, ("n1", "n2"), ("n2",))) == ("worker:0 on n2 is now chief:0",)
    assert renamed_notes(LostNodes(0, 6, 4, ("n1", "n2", "n3"), ("n1", "n3"))) == (
        "worker:3 on n3 is now worker:1", "worker:4 on n3 is now worker:2")


SHOW_NODES = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 State=IDLE ThreadsPerCore=1\n"
              "NodeName=n2 Arch=x86_64 NodeAddr=127.0.0.1 State={n2} ThreadsPerCore=1\n"
              "NodeName=n3 Arch=x86_64 NodeAddr=127.0.0.2 State=MIXED ThreadsPerCore=1\n")


@pytest.mark.parametrize(("job_nodes", "n2_state", "srun_err", "expected"), [
    ("n[1-3]", "MIXED", "", None),  # nothing lost: the usual restart policy
    ("n[1,3]", "DOWN*", "srun: error: Node failure on n2\n", ("lost 5 6 4 n1,n2,n3 n1,n3", "n1=a,n3=c", "2(x2)")),
    ("n[1-3]", "IDLE+NOT_RESPONDING", "", ("lost 5 6 4 n1,n2,n3 n1,n3", "n1=a,n3=c", "2(x2)")),  # not yet taken out
    ("n[1-3]", "MIXED", "srun: error: Node failure on n2\n", ("lost 5 6 4 n1,n2,n3 n1,n3", "n1=a,n3=c", "2(x2)")),
])
def test_survivors(monkeypatch: pytest.MonkeyPatch, job_nodes: str, n2_state: str, srun_err: str,
                   expected: tuple[str, str, str] | None) -> None:
    def scontrol(args: list[str]) -> str:
        if args[:2] == ["show", "job"]:
            return f"JobId=5 JobName=tfl-x ReqNodeList=(null) NodeList={job_nodes} BatchHost=n1\n"
        if args[:2] == ["show", "hostnames"]:
            return {"n[1-3]": "n1\nn2\nn3\n", "n[1,3]": "n1\nn3\n"}[args[2]]
        assert args == ["show", "node", "-o", "n1,n2,n3"]
        return SHOW_NODES.format(n2=n2_state)

    monkeypatch.setattr(driver, "_scontrol", scontrol)
    environ = {SLURM_NODES: "n1=a,n2=b,n3=c", SLURM_LAYOUT: "2(x3)", "SLURM_JOB_ID": "5"}
    found = driver.survivors(srun_err, 5, environ)
    assert (found if found is None else (found[0].event(), found[1], found[2])) == expected


# --- the batch script's resize, run by bash against fake Slurm commands ---------------------

ELASTIC_SRUN = """#!/bin/bash
echo "${TFL_ATTEMPT:-} $TFL_SLURM_NODES $TFL_SLURM_TRAINING_LAYOUT $*" >> "$FAKE/calls"
case "${TFL_ATTEMPT:-}" in
  0) echo "srun: error: Node failure on n2" >&2; echo "srun: error: n1: task 0: Killed" >&2; exit 137 ;;
esac
exit 0
"""
# the nodes step as before; survivors: the real driver, against the fake scontrol
ELASTIC_PYTHON = f"""#!/bin/bash
[ "$3" = nodes ] && echo n1=127.0.0.1,n2=127.0.0.1 && exit 0
[ "$3" = survivors ] && PYTHONPATH={ROOT} exec {sys.executable} "$@"
exit 9
"""
ELASTIC_SCONTROL = """#!/bin/bash
case "$*" in
  "show job -o 7") echo "JobId=7 JobState=RUNNING NodeList=n1 PreemptTime=None" ;;
  "show hostnames n1") echo n1 ;;
  "show node -o n1,n2") echo "NodeName=n1 State=MIXED"; echo "NodeName=n2 State=DOWN*+NOT_RESPONDING" ;;
  *) echo "JobId=7 JobState=RUNNING PreemptTime=None" ;;
esac
"""


def elastic_slurm(tmp_path: Path) -> dict[str, str]:
    env = fake_slurm(tmp_path)
    for name, text in (("srun", ELASTIC_SRUN), ("python", ELASTIC_PYTHON), ("scontrol", ELASTIC_SCONTROL)):
        (tmp_path / "bin" / name).write_text(text)
        (tmp_path / "bin" / name).chmod(stat.S_IRWXU)
    return env


@pytest.mark.parametrize(("min_tasks", "status"), [(1, 0), (2, 137)])
def test_the_script_goes_on_with_the_nodes_left_or_ends_below_the_minimum(tmp_path: Path, min_tasks: int, status: int) -> None:
    b = BatchJob(**{**batch(str(tmp_path), restarts=0).__dict__, "min_tasks": min_tasks,
                    "python": str(tmp_path / "bin" / "python"), "cwd": str(tmp_path)})
    done = subprocess.run(["bash", "-c", render_batch_script(b)], env=elastic_slurm(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == status, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0].startswith("0 n1=127.0.0.1,n2=127.0.0.1 1(x2) --nodes=2 --ntasks=2 --nodelist=n1,n2 --exact")
    if status == 0:  # --max-restarts 0, and still it went on: a resize is not a restart
        assert calls[1].startswith("1 n1=127.0.0.1 1 --nodes=1 --ntasks=1 --nodelist=n1 --exact") and len(calls) == 2
        assert events(tmp_path) == ["training 0 start", "lost 0 2 1 n1,n2 n1", "training 0 exit 137", "training 1 start",
                                    "training 1 exit 0", "end 0"]
        assert "tfl: lost node(s) n2: resize 2 -> 1 training tasks on n1 (not counted as a restart)" in done.stderr
    else:
        assert len(calls) == 1 and events(tmp_path)[-2:] == ["training 0 exit 137", "end 137"]
        assert "tfl: lost node(s) n2: 1 training task(s) left, below --min-tasks 2\n" in done.stderr


# --- the launcher's side ----------------------------------------------------------------

def test_a_lost_node_fails_its_task_and_is_not_counted_as_a_restart() -> None:
    lost = LostNodes(0, 2, 1, ("n1", "n2"), ("n1",))
    events = StepEvents(started=(0,), exits={0: 137}, lost={0: lost})
    err = "srun: error: Node failure on n2\nsrun: error: n1: task 0: Killed\n"
    outcome = training_outcome(1, 0, events, err, None, {0: "n1", 1: "n2"}, job_id="7", elastic=True)
    assert outcome is not None and outcome.failed_node == "n2"
    assert outcome.ended_by == "node n2 failed: Slurm took it out of job 7, which goes on (--no-kill); `sinfo -R` says why"
    assert training_outcome(0, 0, events, err, None, {0: "n1", 1: "n2"}, job_id="7", elastic=True) is None
    assert preemption_counts(events, lambda a: err, 0) == (0, 0)
    assert below_minimum(events, 0, 1) == "" and below_minimum(events, 0, None) == ""
    assert below_minimum(events, 0, 2) == "; 1 training task left, below --min-tasks 2 (lost: n2)"


class Resizing:
    def __init__(self, resize: GroupResize | None) -> None:
        self.resize = resize

    def run_data(self) -> dict[str, str]:
        return {}

    def restarted(self, attempt: int) -> bool | None:
        return True

    def describe(self, record: RunRecord) -> dict[str, str]:
        return {}

    def resized(self, attempt: int) -> GroupResize | None:
        return self.resize


def slurm_plan(tmp_path: Path) -> LaunchPlan:
    from launcher.describe.hosts import RemoteOptions
    from launcher.engines.slurm.plan import build_slurm_plan
    from launcher.plan.run_options import SupervisorConfig

    spec = parse_slurm_cluster({"slurm": {"nodes": 2, "tasks_per_node": 2, "evaluator": True}})
    return build_slurm_plan(spec, "/j.py", (), run_id="r", run_dir=str(tmp_path), python="py", cwd="/",
                            remote=RemoteOptions(), virtual_devices=None, config=SupervisorConfig(min_tasks=2))


def test_a_resize_is_recorded_as_the_ssh_ones_are(tmp_path: Path) -> None:
    plan = slurm_plan(tmp_path)
    record = initial_record(plan, created=1.0, max_restarts=0, backend="slurm")
    evaluator = record.task("evaluator:0")
    restarts: list[int] = []
    resize = GroupResize(attempt=1, from_tasks=4, to_tasks=2, lost={"n1": "node failure: gone"},
                         notes=("worker:1 on n2 is now chief:0", "worker:2 on n2 is now worker:0"))
    said: list[str] = []
    smaller = group_went_on(Resizing(resize), plan, record, 5.0, say=said.append, restart=lambda: restarts.append(1))
    assert [t.name for t in smaller.tasks] == ["chief:0", "worker:0", "evaluator:0"] and restarts == []
    assert [t.task for t in record.tasks] == ["chief:0", "worker:0", "evaluator:0"] and record.task("evaluator:0") is evaluator
    assert record.lost_hosts == {"n1": "node failure: gone"}
    (recorded,) = record.resizes
    assert (recorded.attempt, recorded.from_tasks, recorded.to_tasks, recorded.hosts, recorded.time) == (1, 4, 2, ["n1"], 5.0)
    assert recorded.reason == "lost: n1 (node failure: gone)" and recorded.notes == list(resize.notes)
    assert said == ["tfl: resize: 4 -> 2 training tasks; lost: n1 (node failure: gone); worker:1 on n2 is now chief:0; "
                    "worker:2 on n2 is now worker:0"]
    same = group_went_on(Resizing(None), plan, record, 6.0, say=said.append, restart=lambda: restarts.append(1))  # a restart
    assert same is plan and restarts == [1] and len(record.resizes) == 1 and len(said) == 1


def test_resuming_a_resized_run_starts_a_new_job_at_the_full_size(tmp_path: Path) -> None:
    from launcher.plan.run_options import SupervisorConfig
    from launcher.records.states import RunState
    from launcher.records.store import RunStore
    from launcher.runs.resume import claim

    plan = slurm_plan(tmp_path / "runs" / "r")
    record = initial_record(plan, created=1.0, max_restarts=0, backend="slurm")
    resize = GroupResize(attempt=1, from_tasks=4, to_tasks=2, lost={"n2": "node failure: gone"})
    group_went_on(Resizing(resize), plan, record, 5.0, say=lambda line: None, restart=lambda: None)
    record.state, record.attempt = RunState.FAILED, 1
    store = RunStore(tmp_path)
    store.create(record)
    claimed = claim(store, record.run_id, SupervisorConfig(min_tasks=2))
    assert [t.task for t in claimed.tasks] == [t.name for t in plan.tasks] and claimed.lost_hosts == {}
    assert [r.attempt for r in claimed.resizes] == [1] and claimed.attempt == 2  # the history stays
