"""Pure job-kit parts: chief-only writes, atomic files, progress throttling, line formats."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from launcher.jobkit.context import TaskContext
from launcher.jobkit.datasets import load_digits_as_mnist
from launcher.jobkit.layout import (
    ModelDirLayout,
    chief_only_writes,
    read_done_marker,
    write_json_atomically,
)
from launcher.jobkit.progress import (
    ProgressWriter,
    format_epoch_line,
    format_eval_line,
    progress_record,
)

CLUSTER = {"chief": ("h:1",), "worker": ("h:2",)}


def test_chief_writes_to_the_real_model_dir(tmp_path: Path) -> None:
    with chief_only_writes(tmp_path / "model", TaskContext("chief", 0, CLUSTER)) as layout:
        assert layout == ModelDirLayout(tmp_path / "model")
        assert layout.root.is_dir()
    assert layout.root.is_dir()  # kept


@pytest.mark.parametrize("under_launcher", [True, False])
def test_worker_writes_to_scratch_that_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, under_launcher: bool
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    run_dir = tmp_path / "run" if under_launcher else None
    stale = tmp_path / "run" / "scratch" / "worker-0" / "left-by-a-killed-attempt"
    stale.mkdir(parents=True)
    context = TaskContext("worker", 0, CLUSTER, run_dir=run_dir)
    with pytest.raises(RuntimeError):
        with chief_only_writes(tmp_path / "run" / "model", context) as layout:
            expected_parent = (run_dir / "scratch") if run_dir else (tmp_path / "tmp")
            assert layout.root.parent == expected_parent
            assert not (layout.root / stale.name).exists()
            layout.checkpoints.mkdir()
            (layout.checkpoints / "ckpt-1.index").write_text("x")
            raise RuntimeError("training failed")
    assert not layout.root.exists()  # removed even though training failed
    assert not (tmp_path / "run" / "model").exists()  # the worker never touches the real dir


def test_the_dirs_the_kit_makes_are_private_whatever_the_umask(tmp_path: Path) -> None:
    """A model dir on shared storage, ``<storage>/<run id>/model``, was 0755 (0777 under umask 000):
    every user of every host that mounts the storage could read, or replace, the user's checkpoints."""
    storage = tmp_path / "shared"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.chmod(tmp_path, 0o755)  # an existing parent stays as it is
    modes = {}
    old = os.umask(0)
    try:
        with chief_only_writes(storage / "run-1" / "model", TaskContext("chief", 0, CLUSTER)):
            pass
        with chief_only_writes(storage / "run-1" / "model", TaskContext("worker", 0, CLUSTER, run_dir=run_dir)) as worker:
            for d in (worker.root.parent, worker.root):  # run/scratch and run/scratch/worker-0, removed at the end
                modes[d.name] = stat.S_IMODE(d.stat().st_mode)
    finally:
        os.umask(old)
    for d in (storage, storage / "run-1", storage / "run-1" / "model"):
        modes[d.name] = stat.S_IMODE(d.stat().st_mode)
    assert modes == dict.fromkeys(["scratch", "worker-0", "shared", "run-1", "model"], 0o700)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755


def test_layout_names() -> None:
    layout = ModelDirLayout(Path("/m"))
    assert [layout.checkpoints, layout.tensorboard, layout.backup, layout.eval, layout.done_file,
            layout.training_progress] == [
        Path("/m/checkpoints"), Path("/m/tensorboard"), Path("/m/backup"), Path("/m/tensorboard/eval"),
        Path("/m/training_done.json"), Path("/m/training_progress.json")]


def test_atomic_json_and_done_marker(tmp_path: Path) -> None:
    layout = ModelDirLayout(tmp_path)
    assert read_done_marker(layout) is None
    write_json_atomically(layout.done_file, {"final_checkpoint": "ckpt-3"})
    write_json_atomically(layout.done_file, {"final_checkpoint": "ckpt-4"})
    assert read_done_marker(layout) == {"final_checkpoint": "ckpt-4"}
    assert [p.name for p in tmp_path.iterdir()] == ["training_done.json"]  # no temp files left


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_file_is_throttled_unless_forced(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "progress.json"
    writer = ProgressWriter(path, min_interval_s=0.5, clock=clock)
    assert writer.due() and writer.write({"step": 1})
    clock.now += 0.2
    assert not writer.due() and not writer.write({"step": 2})
    assert json.loads(path.read_text()) == {"step": 1}
    assert writer.write({"step": 3}, force=True)
    clock.now += 0.5
    assert writer.due() and writer.write({"step": 4})
    assert json.loads(path.read_text()) == {"step": 4}


def test_progress_log_gets_every_record(tmp_path: Path) -> None:
    clock = FakeClock()
    writer = ProgressWriter(tmp_path / "p.json", log_path=tmp_path / "log.jsonl", clock=clock)
    for step in range(1, 4):
        assert writer.due()
        writer.write({"step": step})
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3]
    assert json.loads((tmp_path / "p.json").read_text()) == {"step": 1}


def test_no_progress_file_no_writes(tmp_path: Path) -> None:
    writer = ProgressWriter(None)
    assert not writer.due()
    assert not writer.write({"step": 1}, force=True)


def test_epoch_line_format() -> None:
    logs = {"loss": np.float32(0.25), "zeta": 2.0, "accuracy": 0.5, "auc": 1.0 / 3.0}
    assert format_epoch_line(2, 3, logs) == (
        "epoch 2/3 loss=0.250000 accuracy=0.500000 auc=0.333333 zeta=2.000000")


def test_eval_line_format() -> None:
    line = format_eval_line("ckpt-2", 2, {"loss": 0.5, "accuracy": 0.75})
    assert line == "eval checkpoint=ckpt-2 epoch=2 loss=0.500000 accuracy=0.750000"


def test_progress_record_schema() -> None:
    record = progress_record(
        task="worker:0", attempt=1, phase="train", epoch=2, epochs=3, step=5, steps_per_epoch=10,
        global_step=15, logs={"loss": 0.5, "accuracy": 0.75}, examples_per_sec=100.0, now=1.0)
    assert record == {
        "task": "worker:0", "attempt": 1, "phase": "train", "epoch": 2, "epochs": 3, "step": 5,
        "steps_per_epoch": 10, "global_step": 15, "loss": 0.5, "metrics": {"accuracy": 0.75},
        "examples_per_sec": 100.0, "time": 1.0}
    numpy_scalars = progress_record(
        task="worker:0", attempt=0, phase="train", epoch=np.int64(1), epochs=3, step=np.int64(5),
        steps_per_epoch=np.int64(10), global_step=np.int64(15), logs={"loss": np.float32(0.5)},
        examples_per_sec=np.float64(1.0))
    json.dumps(numpy_scalars)  # keras hands out numpy scalars after a mid-epoch restore


@pytest.mark.slow  # importing scikit-learn takes seconds
def test_digits_fallback_looks_like_mnist() -> None:
    (x_train, y_train), (x_test, y_test) = load_digits_as_mnist()
    assert x_train.shape == (1500, 28, 28) and x_test.shape == (297, 28, 28)
    assert x_train.dtype == np.uint8 and y_train.dtype == np.uint8
    assert x_train.max() == 255 and x_train[:, :2, :].max() == 0  # full range, MNIST-like border
    assert set(np.unique(y_train)) == set(range(10)) and len(y_test) == 297


def test_importing_the_kit_does_not_load_tensorflow() -> None:
    # Importing has no hidden effect (issue 9): the environment is written only by select_tf_keras().
    code = ("import sys, os; import launcher.jobkit as k; k.task_context(); "
            "assert 'tensorflow' not in sys.modules; print(os.environ.get('TF_USE_LEGACY_KERAS')); "
            "k.select_tf_keras(); print(os.environ['TF_USE_LEGACY_KERAS'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["None", "1"]


TF_FREE = ("addressing", "args", "context", "datasets", "devices", "execution", "finish", "layout", "notice", "position", "progress",
           "reuters")


def test_the_kits_tensorflow_free_modules_import_without_effects() -> None:
    """Each of them: no TensorFlow (nor tf_keras) loaded, no environment variable written, no output."""
    code = ("import importlib, os, sys; before = dict(os.environ); "
            f"[importlib.import_module('launcher.jobkit.' + m) for m in {TF_FREE!r}]; "
            "loaded = sorted(m for m in ('tensorflow', 'tf_keras', 'keras') if m in sys.modules); "
            "changed = sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k)); "
            "print(loaded, changed)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.stdout == "[] []\n" and out.stderr == ""


@pytest.mark.parametrize("tensorflow", ["a stand-in", pytest.param("real", marks=pytest.mark.slow)])
def test_select_tf_keras_after_tensorflow_is_refused(tensorflow: str, tmp_path: Path) -> None:
    """The kit reads only whether ``tensorflow`` was imported: a stand-in module proves that in a
    second; the real one (its import takes 3-25 s here, minutes under load) in the full suite."""
    env = {"PATH": "/usr/bin:/bin"}
    if tensorflow != "real":
        (tmp_path / "tensorflow.py").write_text("")
        env["PYTHONPATH"] = str(tmp_path)
    code = "import tensorflow, launcher.jobkit as k; print(tensorflow.__file__, flush=True); k.select_tf_keras()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 1 and "select_tf_keras() came after `import tensorflow`" in out.stderr, out.stderr
    assert out.stdout.strip().endswith("tensorflow/__init__.py" if tensorflow == "real" else str(tmp_path / "tensorflow.py"))
