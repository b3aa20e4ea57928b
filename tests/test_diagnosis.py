"""Known causes told from a failed task's log: Keras 3 under MultiWorkerMirroredStrategy (issue 26).

The fast tests use the end of a real log (TensorFlow 2.21, Keras 3.x); ``test_keras3_job_*``
runs such a job under `tfl launch` (real TensorFlow, slow)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.views.diagnosis import KERAS3_FIX, failure_tail, known_fix
from tests.procs import tfl_processes

HEAD = """\
Traceback (most recent call last):
  File "/tmp/job.py", line 12, in <module>
    model.fit(dataset, epochs=2)
  File "/venv/lib/python3.11/site-packages/tensorflow/python/framework/constant_op.py", line 108, in convert_to_eager_tensor
    return ops.EagerTensor(value, ctx.device_name, dtype)
ValueError: Attempt to convert a value (PerReplica:{
  0: <tf.Tensor: shape=(16, 8), dtype=float32, numpy=
""".splitlines()
ROW = "       [5.89223206e-01, 2.79775977e-01, 1.14383899e-01, 2.62565941e-01,"
END = "}) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor."


def test_the_tensor_dump_is_folded_and_the_fix_named(tmp_path: Path) -> None:
    log = tmp_path / "worker-0.log"
    log.write_text("\n".join(["job: starting", *HEAD, *[ROW] * 60, "       dtype=float32)>", END]) + "\n")
    tail = failure_tail(str(log), 20)
    assert tail == ["job: starting", *HEAD[:-1], "… 62 lines of the value's tensors folded (the task's log keeps them)", END]
    assert known_fix(tail) == KERAS3_FIX and "import tf_keras as keras" in KERAS3_FIX and "TF_USE_LEGACY_KERAS=1" in KERAS3_FIX
    assert len(failure_tail(str(log), 3)) == 3 and failure_tail(str(log), 3)[-1] == END


def test_other_failures_keep_their_plain_tail_and_no_fix(tmp_path: Path) -> None:
    log = tmp_path / "chief-0.log"
    lines = [f"line {i}" for i in range(50)] + ["ValueError: Attempt to convert a value (5) with an unsupported type "
                                                "(<class 'object'>) to a Tensor."]
    log.write_text("\n".join(lines) + "\n")
    assert failure_tail(str(log), 20) == lines[-20:] and known_fix(lines[-20:]) is None
    assert failure_tail(str(tmp_path / "none.log"), 20) == [] and known_fix([]) is None


# The first lines of a real worker's log (TensorFlow 2.21 on a machine without CUDA), then the job's own.
STARTUP = """\
I0000 00:00:1795732022.364349    5879 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX_VNNI FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795732023.675635    5879 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795732023.676344    5879 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
E0000 00:00:1795732024.116313    5879 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
I0000 00:00:1795732024.122650    5879 grpc_server_lib.cc:467] Started server with target: grpc://127.0.0.1:56841
I0000 00:00:1795732024.167856    5879 coordination_service_agent.cc:245] Coordination agent has successfully connected.
jobkit: task=worker:0 role=worker strategy=MultiWorkerMirroredStrategy replicas=2 devices=1xCPU training_tasks=2 attempt=0
I0000 00:00:1795732024.683813    5879 generator_dataset_op.cc:213] Memory patch applied: M_TRIM_THRESHOLD=128 kb was set.
W0000 00:00:1795732024.687653    5879 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.
E0000 00:00:1795732024.700000    5879 some_op.cc:12] a TensorFlow error of another kind
epoch 1/50 loss=0.567297 accuracy=0.879492""".splitlines()
NOISE = [line for line in STARTUP if not line.startswith(("jobkit:", "epoch", "E0000 00:00:1795732024.700000"))]


def test_tensorflow_start_up_noise_is_left_out_of_the_tail_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "worker-0.log"
    log.write_text("\n".join(STARTUP) + "\n")
    own = [line for line in STARTUP if line not in NOISE]
    assert len(NOISE) == 10 and len(own) == 3
    assert failure_tail(str(log), 20) == ["… 10 line(s) of TensorFlow start-up noise left out (the task's log keeps them)",
                                          *own]
    # Only the noise among the lines the tail spans is counted: from the kit's line on, the two tf.data lines.
    assert failure_tail(str(log), 3) == ["… 2 line(s) of TensorFlow start-up noise left out (the task's log keeps them)",
                                         *own]
    assert failure_tail(str(log), 2) == own[-2:]
    # A cuInit error is noise only after the CUDA stub's line (noise.py's rule): alone, it is kept.
    alone = tmp_path / "chief-0.log"
    alone.write_text(STARTUP[5] + "\n")
    assert failure_tail(str(alone), 20) == [STARTUP[5]]


KERAS3_JOB = '''\
import numpy as np
import tensorflow as tf
import keras

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
x = np.random.rand(256, 8).astype("float32")
y = np.random.rand(256, 1).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
model.fit(dataset, epochs=2)
'''


@pytest.mark.slow
def test_keras3_job_under_tfl_ends_with_the_fix_not_a_screen_of_numbers(tmp_path: Path, child_env: dict[str, str],
                                                                         tfl_home: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(KERAS3_JOB))
    done = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--local", "2"], env=child_env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    summary = done.stderr[done.stderr.index("root cause:"):]
    assert f"  fix: {KERAS3_FIX}\n" in summary, summary
    assert "lines of the value's tensors folded (the task's log keeps them)" in summary
    assert summary.count("e-0") + summary.count("e+0") < 5, summary  # the dumped floats are not on the screen
    assert tfl_processes(home=str(tfl_home)) == []
