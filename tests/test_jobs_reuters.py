"""jobs/reuters.py and its data: keras' file format read as keras reads it, the synthetic
fallback, seed 000's model, and a run on a given --data file."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from launcher.jobkit.reuters import NUM_CLASSES, reuters_from_npz, synthetic_reuters
from tests.conftest import ROOT
from tests.jobkit_helpers import run_to_end, start_job

REUTERS = ROOT / "jobs" / "reuters.py"


def keras_style_npz(path: Path, stories: list[list[int]], labels: list[int]) -> Path:
    x = np.empty(len(stories), dtype=object)
    x[:] = stories
    np.savez(path, x=x, y=np.asarray(labels, dtype=np.int64))
    return path


def test_npz_is_read_like_keras_load_data(tmp_path: Path) -> None:
    """Shuffled with seed 113, start mark 1, words shifted by 3, out-of-vocabulary 2, 80/20 split."""
    stories = [[i, 100 + i] for i in range(10)]
    (x_train, y_train), (x_test, y_test) = reuters_from_npz(keras_style_npz(tmp_path / "r.npz", stories, list(range(10))), 50)
    order = np.arange(10)
    np.random.RandomState(113).shuffle(order)
    assert list(y_train) + list(y_test) == list(order)
    assert len(x_train) == 8 and len(x_test) == 2 and x_train.dtype == object
    assert x_train[0] == [1, int(order[0]) + 3, 2]  # 100+i+3 >= 50 words: out of vocabulary


def test_synthetic_fallback_is_seeded_and_reuters_shaped() -> None:
    (x_train, y_train), (x_test, y_test) = synthetic_reuters(num_words=1000, train_size=900, test_size=100)
    (x_again, y_again), _ = synthetic_reuters(num_words=1000, train_size=900, test_size=100)
    assert list(y_train) == list(y_again) and x_train[5] == x_again[5]  # every worker builds the same data
    assert (len(x_train), len(x_test)) == (900, 100)
    assert set(y_train) <= set(range(NUM_CLASSES)) and len(set(y_train)) > 30
    words = np.concatenate([np.asarray(s) for s in x_train])
    assert words.min() >= 1 and words.max() < 1000 and all(s[0] == 1 for s in x_train)
    assert np.bincount(y_train).max() / len(y_train) < 0.4  # skewed, not one-class


def load_job(path: Path) -> ModuleType:
    from launcher import jobkit

    jobkit.select_tf_keras()

    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_model_is_seed_000s_cnn() -> None:
    model = load_job(REUTERS).build_model(10000, 300, 1e-3)
    shapes = [(type(layer).__name__, layer.output_shape[1:]) for layer in model.layers]
    assert shapes == [("Embedding", (300, 7)), ("Conv1D", (296, 64)), ("MaxPooling1D", (148, 64)),
                      ("Conv1D", (146, 32)), ("MaxPooling1D", (73, 32)), ("Flatten", (2336,)), ("Dense", (46,))]
    assert model.count_params() == 70000 + 2304 + 6176 + 107502
    assert [layer.activation.__name__ for layer in model.layers if hasattr(layer, "activation")] == ["relu", "relu", "softmax"]
    assert type(model.optimizer).__name__ == "Nadam"
    assert model.loss == "sparse_categorical_crossentropy"


@pytest.mark.slow
def test_trains_on_a_given_data_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    stories = [rng.integers(0, 500, size=rng.integers(5, 400)).tolist() for _ in range(120)]
    data = keras_style_npz(tmp_path / "reuters.npz", stories, [i % NUM_CLASSES for i in range(120)])
    job = start_job("by-hand", tmp_path / "job", ["--data", str(data), "--epochs", "1", "--steps-per-epoch", "2",
                                                  "--batch-size", "8", "--model-dir", str(tmp_path / "model")],
                    job=REUTERS, launcher_env=False)
    code = run_to_end(job, timeout_s=180)
    assert code == 0, job.output()[-3000:]
    assert "falling back" not in job.output() and "download" not in job.output()
    (line,) = job.epoch_lines()
    assert line.startswith("epoch 1/1 loss=") and " accuracy=" in line and " top5_accuracy=" in line
    assert (tmp_path / "model" / "training_done.json").exists()
