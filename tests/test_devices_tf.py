"""The kit's device set-up in a real TensorFlow process: logical CPUs, MirroredStrategy over
them, idempotence, and the message when devices were initialised too early. (No GPU here:
the GPU branch of `strategy.local_devices` is not exercised by CI.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.jobkit_helpers import job_env

pytestmark = pytest.mark.slow

SCRIPT = """
from launcher import jobkit
jobkit.select_tf_keras()
import tensorflow as tf

context = jobkit.task_context()
strategy = jobkit.make_strategy(context)
print("logical", len(tf.config.list_logical_devices("CPU")), "replicas", strategy.num_replicas_in_sync)
print("again", jobkit.make_strategy(context).num_replicas_in_sync)  # same split again: fine
try:
    jobkit.local_devices(context, virtual_devices=2)
except jobkit.JobKitError as err:
    print("refused:", err)
"""


def test_cpu_split_mirrored_strategy_and_late_split(tmp_path: Path) -> None:
    env = {**job_env("chief:0", tmp_path / "job"), "TFL_VIRTUAL_DEVICES": "3", "TFL_GPU_MEMORY_LIMIT_MB": "512",
           "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert "jobkit: no GPU visible; the GPU memory limit (512 MB) does not apply" in lines
    assert ("jobkit: task=chief:0 role=chief strategy=MirroredStrategy replicas=3 devices=3xCPU(logical,on 1) "
            "training_tasks=1 attempt=0") in lines
    assert "logical 3 replicas 3" in lines and "again 3" in lines
    assert ("refused: cannot split /physical_device:CPU:0 into 2 logical devices: TensorFlow has already initialised "
            "its devices; call jobkit.make_strategy (or jobkit.local_devices) before creating any tensor, dataset "
            "or model") in lines
