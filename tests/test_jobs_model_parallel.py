"""jobs/model_parallel.py: seed 001's layer-per-device model, launched by tfl on logical CPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.describe.ports import free_ports
from tests.conftest import ROOT
from tests.jobkit_helpers import job_env, run_to_end, start_job, tf_config

pytestmark = pytest.mark.slow
JOB = ROOT / "jobs" / "model_parallel.py"

# Where each layer's ops run in the training graph (keras' train function, which runs the
# job's train_step): forward, gradients, and the optimizer's state for the layer's weights.
OPS = """
import sys
sys.argv = ["model_parallel"]
sys.path.insert(0, "{jobs}")
from launcher import jobkit
jobkit.select_tf_keras()
import model_parallel
import tensorflow as tf

devices = jobkit.local_devices(jobkit.task_context(), virtual_devices=3)
model = model_parallel.build_model(devices.names, 3, 1e-3)
batches = tf.data.Dataset.from_tensors((tf.zeros((8, 784)), tf.zeros((8,), tf.int64))).repeat()
graph = model.make_train_function().get_concrete_function(iter(batches)).graph
for op in graph.get_operations():
    if op.type in ("MatMul", "BiasAdd", "Relu", "BiasAddGrad", "ReluGrad"):
        print("op", op.type, op.name, op.device or "(none)")
model.optimizer.build(model.trainable_variables)
for variable in model.optimizer.variables:  # iterations, then m and v of each weight
    print("slot", variable.name, variable.device)
"""


def short(device: str) -> str:
    return device.replace("/job:localhost/replica:0/task:0", "").replace("/device:", "")


LAYERS = ("hidden_0", "hidden_1", "hidden_2", "logits")


def layer_of(name: str) -> str:
    """`hidden_1` from `hidden_1/MatMul`, `gradient_tape/hidden_1/ReluGrad`, `Adam/m/layer_per_device/hidden_1/bias:0`."""
    return next(part for part in name.split("/") if part in LAYERS)


def test_tfl_launch_places_one_layer_per_logical_device(tmp_path: Path, tfl_home: Path) -> None:
    env = {**job_env("launcher", tmp_path / "tfl", launcher_env=False), "TFL_HOME": str(tfl_home)}
    result = subprocess.run(
        [sys.executable, "-m", "launcher", "launch", str(JOB), "--local", "1", "--virtual-devices", "3", "--",
         "--epochs", "1", "--steps-per-epoch", "5"], env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tfl_home / "runs").iterdir()
    log = (run / "logs" / "chief-0.log").read_text()
    assert ("model_parallel: 4 layers on 3xCPU(logical,on 1): hidden_0->CPU:0, hidden_1->CPU:1, hidden_2->CPU:2, "
            "logits->CPU:0") in log
    assert "epoch 1/1 loss=" in log
    assert json.loads((run / "model" / "training_done.json").read_text())["global_step"] == 5


def test_each_layer_trains_on_its_device(tmp_path: Path) -> None:
    env = {**job_env("chief:0", tmp_path / "job", launcher_env=False), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", OPS.format(jobs=ROOT / "jobs")], env=env, capture_output=True,
                            text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = {"hidden_0": "CPU:0", "hidden_1": "CPU:1", "hidden_2": "CPU:2", "logits": "CPU:0"}
    ops: dict[str, list[tuple[str, str, str]]] = {name: [] for name in expected}
    slots: dict[str, set[str]] = {name: set() for name in expected}
    for line in result.stdout.splitlines():
        kind, *fields = line.split()
        if kind == "op":
            op_type, name, device = fields
            ops[layer_of(name)].append((op_type, name.startswith("gradient_tape/") and "backward" or "forward", short(device)))
        elif kind == "slot" and fields[0].startswith("Adam/"):  # Adam/m/layer_per_device/hidden_0/kernel:0
            slots[layer_of(fields[0])].add(short(fields[1]))
    for layer, device in expected.items():
        types = sorted((op_type, direction) for op_type, direction, _ in ops[layer])
        assert types.count(("MatMul", "backward")) == 2, f"{layer}: {types}"  # d/dkernel and d/dinput
        assert ("BiasAddGrad", "backward") in types and ("MatMul", "forward") in types, f"{layer}: {types}"
        if layer != "logits":
            assert ("ReluGrad", "backward") in types, f"{layer}: {types}"
        # One GradientTape over the model would leave the backward ops without a device (the default one).
        assert {d for _, _, d in ops[layer]} == {device}, f"{layer}: {ops[layer]}"
        assert slots[layer] == {device}, f"{layer}: Adam's slots on {slots[layer]}"


def test_refuses_a_multi_worker_cluster(tmp_path: Path) -> None:
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    job = start_job("worker:0", tmp_path, ["--epochs", "1"], job=JOB, tf_config_json=tf_config(cluster, "worker", 0))
    code = run_to_end(job, timeout_s=120)
    assert code == 1
    assert "model_parallel: 2 training tasks; this job splits one model over one task's devices" in job.output()
