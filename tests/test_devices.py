"""Device assignment (cluster file -> CUDA_VISIBLE_DEVICES & co. in each task's env),
`--virtual-devices`, and the kit's pure side: parsing those variables, choosing the strategy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.describe.spec import ClusterSpec, parse_cluster
from launcher.errors import ClusterFileError
from launcher.jobkit.context import JobKitError, TaskContext, task_context
from launcher.jobkit.devices import LocalDevices, choose_strategy, gpu_split
from launcher.plan.build import build_plan, render_plan
from launcher.plan.launch_plan import LaunchPlan
from tests.conftest import ROOT

THREE = {"chief": ["g:1"], "worker": ["g:2"], "evaluator": ["g:3"]}
GPU_VARS = ("CUDA_VISIBLE_DEVICES", "TFL_GPU_MEMORY_LIMIT_MB", "TF_FORCE_GPU_ALLOW_GROWTH", "TFL_COLLECTIVE")


def spec(cluster: dict[str, list[str]], **rest: Any) -> ClusterSpec:
    return parse_cluster({"cluster": cluster, **rest}, "c.json")


def plan_of(s: ClusterSpec, virtual_devices: int | None = None) -> LaunchPlan:
    return build_plan(s, "/abs/job.py", (), run_id="r1", run_dir="/runs/r1", python="/py", cwd="/here",
                      virtual_devices=virtual_devices)


def gpu_env(s: ClusterSpec) -> dict[str, dict[str, str]]:
    """task -> the device variables of its env."""
    return {t.name: {k: v for k, v in t.env.items() if k in GPU_VARS} for t in plan_of(s).tasks}


def error_of(data: dict[str, Any]) -> str:
    with pytest.raises(ClusterFileError) as info:
        parse_cluster(data, "c.json")
    return str(info.value)


# --- placement: what each task's env gets ---------------------------------------------------

def test_a_host_without_gpu_settings_is_left_alone() -> None:
    """GPU-less hosts: nothing is hidden, and a CUDA_VISIBLE_DEVICES of the user's passes through."""
    envs = gpu_env(spec(THREE, env={"CUDA_VISIBLE_DEVICES": "7"}))
    assert envs == {name: {"CUDA_VISIBLE_DEVICES": "7"} for name in ("chief:0", "worker:0", "evaluator:0")}
    assert gpu_env(spec({"chief": ["g:1"], "worker": ["g:2"]})) == {"chief:0": {}, "worker:0": {}}


def test_host_gpus_are_split_evenly_and_the_evaluator_gets_none() -> None:
    envs = gpu_env(spec(THREE, hosts={"g": {"gpus": 4}}))
    assert envs == {"chief:0": {"CUDA_VISIBLE_DEVICES": "0,1"}, "worker:0": {"CUDA_VISIBLE_DEVICES": "2,3"},
                    "evaluator:0": {"CUDA_VISIBLE_DEVICES": ""}}


def test_uneven_split_gives_every_worker_the_same_number() -> None:
    envs = gpu_env(spec({"chief": ["g:1"], "worker": ["g:2"]}, hosts={"g": {"gpus": [4, 5, 7]}}))
    assert envs == {"chief:0": {"CUDA_VISIBLE_DEVICES": "4"}, "worker:0": {"CUDA_VISIBLE_DEVICES": "5"}}


def test_pinned_lists_and_counts_then_the_rest_split() -> None:
    s = spec({"chief": ["g:1"], "worker": ["g:2", "g:3", "h:4"], "evaluator": ["g:5"]},
             hosts={"g": {"gpus": 6}},
             devices={"worker:1": {"gpus": [1, 5]}, "chief:0": {"gpus": 2}, "evaluator:0": {"gpus": 0}})
    envs = gpu_env(s)
    assert envs["worker:1"] == {"CUDA_VISIBLE_DEVICES": "1,5"}  # lists first
    assert envs["chief:0"] == {"CUDA_VISIBLE_DEVICES": "0,2"}  # then counts: the first unused
    assert envs["worker:0"] == {"CUDA_VISIBLE_DEVICES": "3,4"}  # then the even split of what is left
    assert envs["evaluator:0"] == {"CUDA_VISIBLE_DEVICES": ""}  # 0 GPUs: CPU only
    assert envs["worker:2"] == {}  # host h has no GPU settings


def test_a_host_with_zero_gpus_runs_everything_on_cpu() -> None:
    envs = gpu_env(spec(THREE, hosts={"g": {"gpus": 0}}))
    assert envs == {name: {"CUDA_VISIBLE_DEVICES": ""} for name in ("chief:0", "worker:0", "evaluator:0")}


def test_pinned_gpus_without_host_gpus_leave_the_others_on_cpu() -> None:
    envs = gpu_env(spec(THREE, devices={"chief:0": {"gpus": [0]}, "worker:0": {"gpus": [1]}}))
    assert envs == {"chief:0": {"CUDA_VISIBLE_DEVICES": "0"}, "worker:0": {"CUDA_VISIBLE_DEVICES": "1"},
                    "evaluator:0": {"CUDA_VISIBLE_DEVICES": ""}}


def test_memory_limit_per_host_and_per_task() -> None:
    envs = gpu_env(spec({"chief": ["g:1"], "worker": ["g:2"]}, hosts={"g": {"gpus": 2, "gpu_memory_limit_mb": 4000}},
                        devices={"worker:0": {"gpus": [1], "gpu_memory_limit_mb": 1000}}))
    assert envs == {"chief:0": {"CUDA_VISIBLE_DEVICES": "0", "TFL_GPU_MEMORY_LIMIT_MB": "4000"},
                    "worker:0": {"CUDA_VISIBLE_DEVICES": "1", "TFL_GPU_MEMORY_LIMIT_MB": "1000"}}


def test_shared_gpus_take_turns_grow_memory_and_use_ring_collectives() -> None:
    s = spec({"chief": ["g:1"], "worker": ["g:2", "g:3"], "evaluator": ["g:4"]},
             hosts={"g": {"gpus": 2, "share_gpus": True}},
             devices={"evaluator:0": {"gpus": [1], "gpu_memory_limit_mb": 2048}})
    growth = {"TF_FORCE_GPU_ALLOW_GROWTH": "true", "TFL_COLLECTIVE": "ring"}
    assert gpu_env(s) == {
        "chief:0": {"CUDA_VISIBLE_DEVICES": "0", **growth},
        "worker:0": {"CUDA_VISIBLE_DEVICES": "0", **growth},
        "worker:1": {"CUDA_VISIBLE_DEVICES": "1", **growth},
        # Shares GPU 1 too, but has a limit instead of growth; it runs no collectives.
        "evaluator:0": {"CUDA_VISIBLE_DEVICES": "1", "TFL_GPU_MEMORY_LIMIT_MB": "2048"},
    }


def test_sharing_with_the_evaluator_only_keeps_default_collectives() -> None:
    s = spec(THREE, hosts={"g": {"gpus": 2, "share_gpus": True}}, devices={"evaluator:0": {"gpus": [0]}})
    envs = gpu_env(s)
    assert envs["chief:0"] == {"CUDA_VISIBLE_DEVICES": "1"}  # the unused GPU first, alone: no growth needed
    assert envs["worker:0"] == {"CUDA_VISIBLE_DEVICES": "0", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert not any("TFL_COLLECTIVE" in env for env in envs.values())


def test_ring_collectives_reach_training_tasks_on_every_host() -> None:
    s = spec({"chief": ["g:1"], "worker": ["g:2", "h:3"]}, hosts={"g": {"gpus": 1, "share_gpus": True}})
    assert gpu_env(s)["worker:1"] == {"TFL_COLLECTIVE": "ring"}  # all workers must agree on it


# --- validation: one line naming the field and the fix ---------------------------------------

@pytest.mark.parametrize("data, expected", [
    ({"hosts": {"g": {"gpus": True}}}, "c.json: hosts.g.gpus: True is not a GPU count or a list of GPU indices (write e.g. 2 or [0, 1])"),
    ({"hosts": {"g": {"gpus": 1.5}}}, "hosts.g.gpus: 1.5 is not a GPU count"),
    ({"hosts": {"g": {"gpus": "0"}}}, "hosts.g.gpus: '0' is not a GPU count"),
    ({"hosts": {"g": {"gpus": [-1]}}}, "hosts.g.gpus: [-1] is not a GPU count"),
    ({"hosts": {"g": {"gpus": [0, 0]}}}, "hosts.g.gpus: [0, 0] names a GPU twice; list each index once"),
    ({"hosts": {"g": {"gpu_memory_limit_mb": 0}}}, "hosts.g.gpu_memory_limit_mb: "),
    ({"hosts": {"g": {"gpus": 2, "shared": True}}}, "c.json: hosts.g.shared: unknown key"),
    ({"devices": {"worker:0": {"gpus": [0], "gpu": [0]}}}, "c.json: devices.worker:0.gpu: unknown key"),
    ({"devices": {"worker:0": {}}}, "c.json: devices.worker:0.gpus: required key is missing (see `tfl schema`)"),
    ({"devices": {"worker:3": {"gpus": [0]}}},
     "c.json: devices.worker:3 names no task of the cluster (its tasks: chief:0, evaluator:0, worker:0)"),
    ({"devices": {"ps:0": {"gpus": [0]}}}, "devices.ps:0 names no task"),
    ({"devices": {"chief:0": {"gpus": 1}}},
     "c.json: devices.chief:0.gpus: a count needs the host's GPUs in hosts.g.gpus (e.g. \"gpus\": 2), or list the indices instead"),
    ({"hosts": {"g": {"gpus": [0, 1]}}, "devices": {"chief:0": {"gpus": [2]}}},
     "c.json: devices.chief:0.gpus: GPU 2 is not one of hosts.g.gpus [0, 1]; use one of those or add it there"),
    ({"hosts": {"g": {"gpus": 2}}, "devices": {"chief:0": {"gpus": 3}}},
     "devices.chief:0.gpus: asks for 3 GPUs but hosts.g.gpus has 2; lower the count or add GPUs"),
    ({"hosts": {"g": {"gpus": 2}}, "devices": {"chief:0": {"gpus": [1]}, "worker:0": {"gpus": 2}}},
     "devices.worker:0.gpus: asks for 2 GPUs but only 1 of hosts.g.gpus are left; lower the count, add GPUs, "
     "or set hosts.g.share_gpus: true"),
    ({"devices": {"chief:0": {"gpus": [0]}, "worker:0": {"gpus": [0, 1]}}},
     "c.json: devices: GPU 0 on g is given to chief:0 and worker:0; give each task its own GPU, or set "
     "hosts.g.share_gpus: true (each task then gets memory growth, or gpu_memory_limit_mb)"),
    ({"hosts": {"g": {"gpus": 1}}},
     "c.json: hosts.g.gpus: 1 unused GPU(s) for 2 training tasks (chief:0, worker:0); add GPUs, list GPUs per task "
     "in devices, or set hosts.g.share_gpus: true"),
    ({"hosts": {"g": {"gpus": 3}}, "devices": {"chief:0": {"gpus": 2}}},
     "c.json: devices: training tasks would see different numbers of GPUs (chief:0: 2, worker:0: 1); "
     "MultiWorkerMirroredStrategy needs the same number on every worker: give each the same count"),
    ({"devices": {"chief:0": {"gpus": [0]}}}, "different numbers of GPUs (chief:0: 1, worker:0: 0)"),
    ({"hosts": {"g": {"gpus": 1}}, "env": {"CUDA_VISIBLE_DEVICES": "0"}},
     "c.json: env sets CUDA_VISIBLE_DEVICES, but tfl assigns the GPUs of g (hosts.g.gpus / devices); remove it from env"),
    ({"hosts": {"g": {"gpus": 2, "env": {"CUDA_VISIBLE_DEVICES": "0"}}}}, "hosts.g.env sets CUDA_VISIBLE_DEVICES"),
])
def test_device_rule_messages(data: dict[str, Any], expected: str) -> None:
    assert expected in error_of({"cluster": THREE, **data})


def test_sharing_is_allowed_when_asked_for() -> None:
    s = spec(THREE, hosts={"g": {"share_gpus": True}}, devices={"chief:0": {"gpus": [0]}, "worker:0": {"gpus": [0]}})
    assert gpu_env(s)["worker:0"]["CUDA_VISIBLE_DEVICES"] == "0"


def test_schema_documents_the_device_keys() -> None:
    schema = json.dumps(ClusterSpec.model_json_schema())
    for key in ("share_gpus", "gpu_memory_limit_mb", "TaskDevices", "a count (2 = GPUs 0 and 1)"):
        assert key in schema


# --- --virtual-devices and the dry run ---------------------------------------------------------

def test_virtual_devices_go_into_every_task_env_and_only_when_asked() -> None:
    s = spec(THREE)
    assert all(t.env["TFL_VIRTUAL_DEVICES"] == "4" for t in plan_of(s, virtual_devices=4).tasks)
    assert not any("TFL_VIRTUAL_DEVICES" in t.env for t in plan_of(s).tasks)
    p = plan_of(spec(THREE, hosts={"g": {"gpus": 2}}), virtual_devices=2)
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    assert "    TFL_VIRTUAL_DEVICES=2" in render_plan(p) and "    CUDA_VISIBLE_DEVICES=0\n" in render_plan(p)


def test_dry_run_shows_devices(tmp_path: Path, tfl_home: Path) -> None:
    runner = CliRunner()
    mnist = str(ROOT / "jobs" / "mnist.py")
    result = runner.invoke(app, ["launch", mnist, "--local", "1", "--virtual-devices", "4", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "    TFL_VIRTUAL_DEVICES=4" in result.stdout and "CUDA_VISIBLE_DEVICES" not in result.stdout
    cluster = tmp_path / "gpus.json"
    cluster.write_text(json.dumps({"cluster": {"chief": ["localhost:23456"], "worker": ["localhost:23457"]},
                                   "hosts": {"localhost": {"gpus": 2}}}))
    result = runner.invoke(app, ["launch", mnist, "--cluster", str(cluster), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "    CUDA_VISIBLE_DEVICES=0\n" in result.stdout and "    CUDA_VISIBLE_DEVICES=1\n" in result.stdout
    bad = runner.invoke(app, ["launch", mnist, "--local", "1", "--virtual-devices", "0", "--dry-run"])
    assert bad.exit_code == 2 and "--virtual-devices" in bad.output
    assert not (tfl_home / "runs").exists()


# --- the kit's side: reading those variables, choosing the strategy ----------------------------

def test_plan_env_is_what_the_kit_reads() -> None:
    s = spec({"chief": ["g:1"], "worker": ["g:2"]}, hosts={"g": {"gpus": 1, "share_gpus": True, "gpu_memory_limit_mb": 3000}})
    chief = plan_of(s, virtual_devices=2).tasks[0]
    context = task_context(chief.env)
    assert (context.virtual_devices, context.gpu_memory_limit_mb, context.collective) == (2, 3000, "ring")
    assert task_context({}).virtual_devices is None and task_context({}).collective is None


@pytest.mark.parametrize("env, fragment", [
    ({"TFL_VIRTUAL_DEVICES": "0"}, "TFL_VIRTUAL_DEVICES is '0'; expected a positive integer (the number of logical devices"),
    ({"TFL_VIRTUAL_DEVICES": "four"}, "TFL_VIRTUAL_DEVICES is 'four'"),
    ({"TFL_GPU_MEMORY_LIMIT_MB": "-5"}, "TFL_GPU_MEMORY_LIMIT_MB is '-5'; expected a positive integer (a GPU memory limit in MB"),
    ({"TFL_COLLECTIVE": "mpi"}, "TFL_COLLECTIVE is 'mpi'; expected one of auto, ring, nccl"),
])
def test_bad_device_variables(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(JobKitError) as caught:
        task_context(env)
    assert fragment in str(caught.value)


CLUSTER2 = {"chief": ("h:1",), "worker": ("h:2",), "evaluator": ("h:3",)}
ONE_CPU, FOUR_CPUS = LocalDevices("CPU", 1), LocalDevices("CPU", 4)
TWO_GPUS, FOUR_VIRTUAL_GPUS = LocalDevices("GPU", 2, physical=2), LocalDevices("GPU", 4, physical=1)


@pytest.mark.parametrize("context, local, name, collective", [
    (TaskContext("chief", 0), ONE_CPU, "default", "auto"),
    (TaskContext("chief", 0), FOUR_CPUS, "MirroredStrategy", "auto"),
    (TaskContext("chief", 0), TWO_GPUS, "MirroredStrategy", "auto"),
    (TaskContext("chief", 0, CLUSTER2), ONE_CPU, "MultiWorkerMirroredStrategy", "auto"),
    (TaskContext("worker", 0, CLUSTER2), TWO_GPUS, "MultiWorkerMirroredStrategy", "auto"),
    (TaskContext("worker", 0, CLUSTER2), FOUR_VIRTUAL_GPUS, "MultiWorkerMirroredStrategy", "ring"),
    (TaskContext("worker", 0, CLUSTER2, collective="ring"), TWO_GPUS, "MultiWorkerMirroredStrategy", "ring"),
    (TaskContext("evaluator", 0, CLUSTER2), FOUR_CPUS, "default", "auto"),
    (TaskContext("chief", 0, {"chief": ("h:1",), "evaluator": ("h:2",)}), FOUR_CPUS, "MirroredStrategy", "auto"),
])
def test_strategy_choice(context: TaskContext, local: LocalDevices, name: str, collective: str) -> None:
    choice = choose_strategy(context, local)
    assert (choice.name, choice.collective) == (name, collective)


def test_multi_worker_on_logical_cpus_says_they_stay_idle() -> None:
    note = choose_strategy(TaskContext("chief", 0, CLUSTER2), FOUR_CPUS).note
    assert note == ("MultiWorkerMirroredStrategy runs one replica per worker on CPU; 3 of this task's 4 logical CPUs "
                    "stay idle (only GPUs give a worker several replicas)")
    assert choose_strategy(TaskContext("chief", 0, CLUSTER2), TWO_GPUS).note is None


def test_gpu_split_and_device_names() -> None:
    assert gpu_split(None, None) is None and gpu_split(1, None) is None
    assert gpu_split(None, 4000) == [4000] and gpu_split(4, None) == [1024] * 4 and gpu_split(3, 3000) == [1000] * 3
    with pytest.raises(JobKitError, match="cannot be split into 4 virtual GPUs"):
        gpu_split(4, 3)
    assert FOUR_CPUS.names == ("/device:CPU:0", "/device:CPU:1", "/device:CPU:2", "/device:CPU:3")
    assert (FOUR_CPUS.describe(), ONE_CPU.describe(), TWO_GPUS.describe()) == ("4xCPU(logical,on 1)", "1xCPU", "2xGPU")
    assert FOUR_VIRTUAL_GPUS.describe() == "4xGPU(logical,on 1)"


def test_the_docs_example_is_valid() -> None:
    text = (ROOT / "docs" / "devices.md").read_text()
    example = json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])
    envs = gpu_env(spec(example["cluster"], hosts=example["hosts"], devices=example["devices"]))
    assert envs["evaluator:0"] == {"CUDA_VISIBLE_DEVICES": "1", "TFL_GPU_MEMORY_LIMIT_MB": "2000"}
