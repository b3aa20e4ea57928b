"""MNIST and Fashion-MNIST as keras ships them, found offline where possible.

Order (the notice line says which one was used; every task of a run must end up with
the same source):

1. keras' cache: ``~/.keras/datasets/mnist.npz``, ``~/.keras/datasets/fashion-mnist/``;
2. ``--data``: an ``.npz`` with ``x_train, y_train, x_test, y_test`` or a directory of
   the four idx files (``.gz`` or not);
3. Debian's ``dataset-fashion-mnist`` package, ``/usr/share/datasets/fashion-mnist/``
   (Fashion-MNIST only: Debian packages no MNIST);
4. a bounded download through keras;
5. scikit-learn's 8x8 digits blown up to 28x28 (same shapes and dtype, so the job's
   model and pipeline do not change; its numbers say nothing about either data set).

Images come back as uint8 (n, 28, 28), labels uint8: cast in the input pipeline, not
before, so a tf.data pipeline holds a quarter of the bytes.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np

from launcher.jobkit.context import JobKitError

Split = tuple[np.ndarray, np.ndarray]
T = TypeVar("T")
DIGITS_TRAIN_SIZE = 1500  # of 1797; the rest is the test split
DATASETS: Final = ("mnist", "fashion_mnist")
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES: Final = {  # (images, labels) per split, as keras and Debian name them
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC = 2051, 2049


def load_mnist(path: Path | None = None, download_timeout_s: float = 20.0, *,
               dataset: str = "mnist", debian_dir: Path = DEBIAN_FASHION_MNIST) -> tuple[Split, Split]:
    """((x_train, y_train), (x_test, y_test)) of `dataset` ("mnist" or "fashion_mnist")."""
    if dataset not in DATASETS:
        raise JobKitError(f"dataset {dataset!r} is not known; expected one of {', '.join(DATASETS)}")
    for source, where, load in _local_sources(dataset, path, debian_dir):
        if where.exists():
            print(f"jobkit: {dataset} from {source} ({where})", flush=True)
            return load(where)
    downloaded = _try_download(download_timeout_s, dataset, lambda: _load_from_keras(dataset))
    if downloaded is not None:
        print(f"jobkit: {dataset} from a download through keras", flush=True)
        return downloaded
    if importlib.util.find_spec("sklearn") is None:  # the last fallback; an interpreter of the user's may lack it
        raise JobKitError(
            f"{dataset} is not available to {sys.executable} (no keras cache, no --data, no Debian package, the download "
            "failed) and scikit-learn, the offline fallback, is not installed there; pass --data FILE.npz, or use "
            "--dataset fashion_mnist with Debian's dataset-fashion-mnist, or install scikit-learn in that "
            "interpreter")
    print(f"jobkit: {dataset} not available (no keras cache, no --data, no Debian package, download failed); "
          "falling back to scikit-learn's 8x8 digits upscaled to 28x28", flush=True)
    return load_digits_as_mnist()


def _local_sources(dataset: str, path: Path | None,
                   debian_dir: Path) -> list[tuple[str, Path, Callable[[Path], tuple[Split, Split]]]]:
    cache = keras_cache_dir()
    sources: list[tuple[str, Path, Callable[[Path], tuple[Split, Split]]]] = [
        ("the keras cache", cache / "mnist.npz", read_npz) if dataset == "mnist"
        else ("the keras cache", cache / "fashion-mnist", read_idx_dir)]
    if path is not None:
        if not path.exists():
            raise JobKitError(f"--data {path} does not exist; give an .npz file or a directory of idx files")
        sources.append(("--data", path, read_idx_dir if path.is_dir() else read_npz))
    if dataset == "fashion_mnist":
        sources.append(("Debian's dataset-fashion-mnist", debian_dir, read_idx_dir))
    return sources


def keras_cache_dir() -> Path:
    """Where keras keeps downloaded data sets (``$KERAS_HOME/datasets``, default ``~/.keras``)."""
    return Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras") / "datasets"


def read_npz(path: Path) -> tuple[Split, Split]:
    with np.load(path, allow_pickle=False) as data:
        return (data["x_train"], data["y_train"]), (data["x_test"], data["y_test"])


def read_idx_dir(directory: Path) -> tuple[Split, Split]:
    """The four idx files of (Fashion-)MNIST in `directory`, gzipped or not."""
    splits = []
    for split in ("train", "test"):
        images, labels = (_read_idx(_idx_file(directory, name)) for name in IDX_FILES[split])
        if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
            raise JobKitError(f"{directory}: {split} images {images.shape} and labels {labels.shape} do not match")
        splits.append((images, labels))
    return splits[0], splits[1]


def _idx_file(directory: Path, name: str) -> Path:
    for candidate in (directory / f"{name}.gz", directory / name):
        if candidate.exists():
            return candidate
    raise JobKitError(f"{directory} has no {name}.gz (nor {name}); expected the four idx files of (Fashion-)MNIST")


def _read_idx(path: Path) -> np.ndarray:
    """An idx file of unsigned bytes: magic, one big-endian size per dimension, then the data."""
    opener: Callable[[Path], Any] = gzip.open if path.suffix == ".gz" else (lambda p: open(p, "rb"))
    with opener(path) as handle:
        data: bytes = handle.read()
    magic = int.from_bytes(data[:4], "big")
    if magic not in (_IDX_IMAGES_MAGIC, _IDX_LABELS_MAGIC):
        raise JobKitError(f"{path} is not an idx file of unsigned bytes (magic {magic:#x})")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(magic & 0xFF)]
    offset = 4 + 4 * len(dims)
    if len(data) - offset != int(np.prod(dims)):
        raise JobKitError(f"{path} holds {len(data) - offset} bytes of data; its header says {dims}: the file is cut short")
    return np.frombuffer(data, np.uint8, offset=offset).reshape(dims)


def _load_from_keras(dataset: str) -> tuple[Split, Split]:
    import tf_keras as keras

    module = keras.datasets.fashion_mnist if dataset == "fashion_mnist" else keras.datasets.mnist
    return module.load_data()  # type: ignore[no-any-return]


def _try_download(timeout_s: float, name: str, load: Callable[[], T]) -> T | None:
    # In a thread because a black-holed network or a slow DNS can hang urllib far
    # beyond any socket timeout; the daemon thread is simply abandoned then.
    result: list[T] = []
    abandoned = threading.Event()

    def download() -> None:
        try:
            result.append(load())
        except Exception as err:  # noqa: BLE001 - any failure means "use the fallback"
            if not abandoned.is_set():
                print(f"jobkit: {name} download failed: {str(err).splitlines()[0][:200]}", flush=True)

    thread = threading.Thread(target=download, name=f"{name.lower()}-download", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        abandoned.set()
        print(f"jobkit: {name} download still running after {timeout_s:.0f} s; giving up", flush=True)
        return None
    return result[0] if result else None


def load_digits_as_mnist() -> tuple[Split, Split]:
    """sklearn's digits (0..16 intensities, 8x8) as MNIST-like uint8 28x28 images."""
    table = _digits_table()
    digit_images, digit_labels = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
    images = np.rint(digit_images * (255.0 / 16.0)).astype(np.uint8)
    # Each pixel becomes a 3x3 block (24x24), centred with a 2-pixel border like MNIST's.
    upscaled = images.repeat(3, axis=1).repeat(3, axis=2)
    padded = np.pad(upscaled, ((0, 0), (2, 2), (2, 2)))
    labels = digit_labels.astype(np.uint8)
    n = DIGITS_TRAIN_SIZE
    return (padded[:n], labels[:n]), (padded[n:], labels[n:])


def _digits_table() -> np.ndarray:
    """The 1797 rows of scikit-learn's digits: 64 pixels (0..16), then the label, as ``load_digits``
    reads them: its ``datasets/data/digits.csv.gz``, read here without importing scikit-learn
    (``sklearn.datasets`` and ``load_digits`` cost 1.2 s of CPU in a task that has imported
    TensorFlow, 4.6 s; the file, 0.03 s). Where that file is not where scikit-learn keeps it,
    ``load_digits`` itself."""
    spec = importlib.util.find_spec("sklearn")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        csv = Path(location) / "datasets" / "data" / "digits.csv.gz"
        if csv.is_file():
            return np.loadtxt(csv, delimiter=",")
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.column_stack([digits.data, digits.target])
