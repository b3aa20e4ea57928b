"""The known-noise list and the console follower: what is hidden, what never is.

The lines here were printed by TensorFlow 2.21 on this project's CPU machine; the list is
also checked against live TensorFlow output in tests/test_noise_tf.py.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from launcher.views.logs import LogFollower
from launcher.views.noise import NoiseFilter

START_UP = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795345087.532342    2334 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795345087.532718    2334 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
I0000 00:00:1795345087.940599    2334 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
E0000 00:00:1795345143.458253    2334 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
I0000 00:00:1795345143.524358    2334 coordination_service.cc:221] Initializing CoordinationService
I0000 00:00:1795345143.525988    2334 grpc_server_lib.cc:467] Started server with target: grpc://localhost:40371
I0000 00:00:1795345143.580707    3541 coordination_service.h:529] /job:worker/replica:0/task:0 has connected to coordination service. Incarnation: 11546189559988074935
I0000 00:00:1795345143.580831    3541 coordination_service.cc:502] Waiting for 1/2 tasks to connect.
I0000 00:00:1795345143.580842    3541 coordination_service.cc:505] Example stragglers:
/job:worker/replica:0/task:1
I0000 00:00:1795345143.581492    2334 coordination_service_agent.cc:245] Coordination agent has successfully connected.
I0000 00:00:1795345144.009353    3541 coordination_service.cc:1472] Barrier(WaitForAllTasks::15698683370950861352::0) has passed with status: OK
W0000 00:00:1795345244.436785    5099 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.
2024-01-02 03:04:05.678901: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
""".splitlines()

NEVER_HIDDEN = """\
epoch 1/2 loss=0.983634 accuracy=0.795703
W0000 00:00:1795345244.436785    5099 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations. And more.
W0000 00:00:1795345244.436785    5099 dataset.cc:997] Input of MapDatasetOp::Dataset will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.
E0000 00:00:1795345087.532342    2334 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795345144.009353    3541 coordination_service.cc:1472] Barrier(tfl-jobkit-finish::0) has passed with status: DEADLINE_EXCEEDED
E0000 00:00:1795345150.000000    3541 coordination_service.cc:800] /job:worker/replica:0/task:1 has been lost: heartbeat timeout
/job:worker/replica:0/task:1
To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
Traceback (most recent call last):
  File "job.py", line 3, in <module>
ValueError: oneDNN custom operations are on.
job: Could not find cuda drivers on your machine, GPU will not be used.
I0000 00:00:1795345087.532718    2334 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used. And more.
""".splitlines()


def test_the_known_start_up_lines_are_hidden_and_counted() -> None:
    noise = NoiseFilter()
    assert [line for line in START_UP if not noise.is_noise(line)] == []
    assert noise.count == len(START_UP)
    assert noise.hidden["coordination service"] == 7 and noise.hidden["CPU features"] == 2
    assert noise.hidden["tf.data: input not optimized"] == 1  # the job kit's input causes it, on every task (issue 26)


def test_nothing_else_is_hidden_not_even_after_noise() -> None:
    noise = NoiseFilter()
    for line in START_UP:
        noise.is_noise(line)
    assert [line for line in NEVER_HIDDEN if noise.is_noise(line)] == []  # continuations only right after their head


def test_cuinit_is_noise_only_where_the_cuda_stub_found_no_driver() -> None:
    cuinit = START_UP[5]
    assert not NoiseFilter().is_noise(cuinit)  # a GPU machine whose driver fails: shown
    noise = NoiseFilter()
    assert noise.is_noise(START_UP[2]) and noise.is_noise(cuinit)


def follow(tmp_path: Path, text: str, **options: Any) -> list[str]:
    log = tmp_path / "chief-0.log"
    log.write_text(text)
    out = io.StringIO()
    follower = LogFollower([("chief:0", str(log))], out, **options)
    follower.poll_once()
    follower.stop()
    follower.stop()  # idempotent: the count is said once
    return out.getvalue().splitlines()


@pytest.mark.parametrize("verbose", [False, True])
def test_follower_hides_noise_unless_verbose(tmp_path: Path, verbose: bool) -> None:
    lines = follow(tmp_path, "\n".join(START_UP[:3] + NEVER_HIDDEN + START_UP[3:]) + "\n", hide_noise=not verbose)
    shown = [line.removeprefix("[chief:0] ") for line in lines]
    if verbose:
        assert shown == START_UP[:3] + NEVER_HIDDEN + START_UP[3:]
    else:
        assert shown == NEVER_HIDDEN + [f"tfl: {len(START_UP)} line(s) of TensorFlow start-up noise hidden "
                                        "(the task's log keeps them; --verbose shows them)"]
    assert (tmp_path / "chief-0.log").read_text().count("\n") == len(START_UP) + len(NEVER_HIDDEN)  # the log keeps all


@pytest.mark.parametrize("tail", [0, 2, 3])
def test_a_tail_counts_only_the_noise_among_the_lines_it_keeps(tmp_path: Path, tail: int) -> None:
    """`tfl logs -n N`: the noise before the kept lines was cut by N, not hidden (with ``-n 0``, no
    count at all); the noise among them is hidden and counted."""
    job = ["epoch 1/2 loss=0.9", "epoch 2/2 loss=0.5", "done"]
    text = "\n".join(START_UP + job[:2] + START_UP[:1] + job[2:]) + "\n"
    lines = [line.removeprefix("[chief:0] ") for line in follow(tmp_path, text, hide_noise=True, tail=tail)]
    # 2: the noise line between "epoch 2/2" and "done"; 3: nothing cut, the whole log's noise.
    counted = {0: 0, 2: 1, 3: len(START_UP) + 1}[tail]
    said = [f"tfl: {counted} line(s) of TensorFlow start-up noise hidden (the task's log keeps them; --verbose shows them)"]
    assert lines == job[len(job) - tail:] + (said if counted else [])
