"""jobs/model_parallel.py: seed 001's layer-per-device model, launched by tfl on logical CPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.jobkit_helpers import free_ports, job_env, run_to_end, start_job, tf_config

pytestmark = pytest.mark.slow
JOB = ROOT / "jobs" / "model_parallel.py"

# The ops of each layer, not just its weights, must run on the layer's device.
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
graph = tf.function(model).get_concrete_function(tf.TensorSpec((None, 784))).graph
for op in graph.get_operations():
    if op.type == "MatMul":
        print(op.name.split("/")[1], op.device)
"""


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


def test_each_layer_runs_on_its_device(tmp_path: Path) -> None:
    env = {**job_env("chief:0", tmp_path / "job", launcher_env=False), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", OPS.format(jobs=ROOT / "jobs")], env=env, capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[:4] == [
        "hidden_0 /device:CPU:0", "hidden_1 /device:CPU:1", "hidden_2 /device:CPU:2", "logits /device:CPU:0"]


def test_refuses_a_multi_worker_cluster(tmp_path: Path) -> None:
    ports = free_ports(2)
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    job = start_job("worker:0", tmp_path, ["--epochs", "1"], job=JOB, tf_config_json=tf_config(cluster, "worker", 0))
    code = run_to_end(job, timeout_s=120)
    assert code == 1
    assert "model_parallel: 2 training tasks; this job splits one model over one task's devices" in job.output()
