"""Where the kit finds (Fashion-)MNIST offline, in which order, and that it says so."""

from __future__ import annotations

import gzip
import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launcher.jobkit import datasets
from launcher.jobkit.context import JobKitError
from launcher.jobkit.datasets import DEBIAN_FASHION_MNIST, IDX_FILES, load_mnist, read_idx_dir
from tests.conftest import ROOT
from tests.jobkit_helpers import require_fashion_mnist


def write_idx_dir(directory: Path, fill: int, *, train: int = 6, test: int = 4, gz: bool = True) -> Path:
    """Four idx files like keras' and Debian's, every pixel = `fill`, labels 0..n-1 mod 10."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", train), ("test", test)):
        images_name, labels_name = IDX_FILES[split]
        images = np.full((n, 28, 28), fill, np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        for name, array, magic in ((images_name, images, 2051), (labels_name, labels, 2049)):
            header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
            data = header + array.tobytes()
            if gz:
                (directory / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (directory / name).write_bytes(data)
    return directory


def write_npz(path: Path, fill: int) -> Path:
    images = np.full((5, 28, 28), fill, np.uint8)
    labels = np.arange(5, dtype=np.uint8)
    np.savez(path, x_train=images, y_train=labels, x_test=images[:2], y_test=labels[:2])
    return path


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """A private keras cache (empty), a download that fails at once, and a fake digits fallback."""
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))
    tried: list[str] = []

    def fail(dataset: str) -> None:
        tried.append(dataset)
        raise OSError("no network here")

    monkeypatch.setattr(datasets, "_load_from_keras", fail)
    digits = (np.full((3, 28, 28), 9, np.uint8), np.zeros(3, np.uint8))
    monkeypatch.setattr(datasets, "load_digits_as_mnist", lambda: (digits, digits))
    return tried


def fill_of(loaded: tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]) -> int:
    (x_train, _), _ = loaded
    return int(x_train[0, 0, 0])


def test_idx_files_read_like_keras(tmp_path: Path) -> None:
    for gz in (True, False):
        (x_train, y_train), (x_test, y_test) = read_idx_dir(write_idx_dir(tmp_path / str(gz), 7, gz=gz))
        assert x_train.shape == (6, 28, 28) and x_test.shape == (4, 28, 28)
        assert x_train.dtype == np.uint8 and y_train.dtype == np.uint8
        assert y_train.tolist() == [0, 1, 2, 3, 4, 5] and int(x_test.max()) == 7


def test_order_keras_cache_then_data_then_debian_then_download(
    tmp_path: Path, no_network: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    debian = write_idx_dir(tmp_path / "debian", 3)
    data_dir = write_idx_dir(tmp_path / "given", 2)
    cache = tmp_path / "keras" / "datasets" / "fashion-mnist"

    def load(data: Path | None) -> int:
        return fill_of(load_mnist(data, dataset="fashion_mnist", debian_dir=debian, download_timeout_s=5))

    assert load(data_dir) == 2 and "fashion_mnist from --data" in capsys.readouterr().out
    assert load(None) == 3 and "from Debian's dataset-fashion-mnist" in capsys.readouterr().out
    write_idx_dir(cache, 1)
    assert load(data_dir) == 1 and f"fashion_mnist from the keras cache ({cache})" in capsys.readouterr().out
    assert no_network == []  # a local copy was found every time: no download tried


def test_mnist_has_no_debian_source_and_falls_back_to_digits(
    tmp_path: Path, no_network: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    debian = write_idx_dir(tmp_path / "debian", 3)  # Fashion-MNIST's files: never taken for MNIST
    assert fill_of(load_mnist(None, dataset="mnist", debian_dir=debian, download_timeout_s=5)) == 9
    out = capsys.readouterr().out
    assert no_network == ["mnist"]
    assert "mnist download failed: no network here" in out
    assert "falling back to scikit-learn's 8x8 digits" in out
    assert fill_of(load_mnist(write_npz(tmp_path / "m.npz", 4), dataset="mnist")) == 4


def test_the_docs_quote_the_offline_fallback_as_the_kit_says_it(
    tmp_path: Path, no_network: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """README.md's tour and docs/jobkit.md quote the line a run without MNIST prints: the very line."""
    load_mnist(None, dataset="mnist", debian_dir=tmp_path / "none", download_timeout_s=5)
    said = next(line for line in capsys.readouterr().out.splitlines() if "falling back" in line)
    assert said.startswith("jobkit: mnist not available (")
    for page in ("README.md", "docs/jobkit.md"):
        assert said.removeprefix("jobkit: ") in " ".join((ROOT / page).read_text(encoding="utf-8").split()), page


def test_without_scikit_learn_the_last_fallback_is_one_clear_error(
    tmp_path: Path, no_network: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interpreter of the user's (hosts.<h>.python) with TensorFlow only, offline: no traceback
    from deep in the kit, but what to do."""
    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn` raises ImportError
    with pytest.raises(JobKitError) as err:
        load_mnist(None, dataset="mnist", debian_dir=tmp_path / "none", download_timeout_s=5)
    assert str(err.value).startswith(f"mnist is not available to {sys.executable} (")
    assert "scikit-learn, the offline fallback, is not installed there; pass --data FILE.npz" in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_inputs_are_one_clear_error(tmp_path: Path, no_network: list[str]) -> None:
    with pytest.raises(JobKitError, match="dataset 'cifar' is not known; expected one of mnist, fashion_mnist"):
        load_mnist(None, dataset="cifar")
    with pytest.raises(JobKitError, match="--data .*missing.npz does not exist"):
        load_mnist(tmp_path / "missing.npz", dataset="mnist")
    (tmp_path / "empty").mkdir()
    with pytest.raises(JobKitError, match="has no train-images-idx3-ubyte.gz"):
        load_mnist(tmp_path / "empty", dataset="fashion_mnist", debian_dir=tmp_path / "none")
    broken = write_idx_dir(tmp_path / "broken", 1)
    (broken / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x0c\x01" + b"\x00" * 8))
    with pytest.raises(JobKitError, match="not an idx file of unsigned bytes"):
        read_idx_dir(broken)


def test_debian_fashion_mnist_is_the_real_data_set() -> None:
    assert require_fashion_mnist() == DEBIAN_FASHION_MNIST
    (x_train, y_train), (x_test, y_test) = read_idx_dir(DEBIAN_FASHION_MNIST)
    assert x_train.shape == (60000, 28, 28) and x_test.shape == (10000, 28, 28)
    assert np.bincount(y_train).tolist() == [6000] * 10 and np.bincount(y_test).tolist() == [1000] * 10


def test_the_digits_are_scikit_learns_read_without_importing_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline fallback reads scikit-learn's digits file itself (importing sklearn.datasets was
    a fifth of a TensorFlow task's start-up): the same numbers as load_digits, and, where the
    file is not where scikit-learn keeps it, load_digits itself."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    expected = np.column_stack([digits.data, digits.target])
    table = datasets._digits_table()
    assert table.shape == (1797, 65) and np.array_equal(table, expected)
    (x_train, y_train), (x_test, y_test) = datasets.load_digits_as_mnist()
    assert x_train.shape == (1500, 28, 28) and x_test.shape == (297, 28, 28) and x_train.dtype == np.uint8
    assert np.array_equal(np.concatenate([y_train, y_test]), digits.target.astype(np.uint8))
    assert int(x_train[:, :2].max()) == 0 and int(x_train.max()) == 255  # the border; 16 -> 255
    assert np.array_equal(x_train[:, 2:26:3, 2:26:3], np.rint(digits.images[:1500] * (255 / 16)).astype(np.uint8))

    fresh = subprocess.run([sys.executable, "-c", "import sys; from launcher.jobkit.datasets import load_digits_as_mnist; "
                            "load_digits_as_mnist(); print(sorted(m for m in sys.modules if m.startswith('sklearn')))"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert fresh.returncode == 0 and fresh.stdout.strip() == "[]", fresh.stderr[-2000:]

    elsewhere = importlib.machinery.ModuleSpec("sklearn", None, is_package=True)
    elsewhere.submodule_search_locations = [str(tmp_path)]  # no datasets/data/digits.csv.gz there
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: elsewhere)
    assert np.array_equal(datasets._digits_table(), expected)
