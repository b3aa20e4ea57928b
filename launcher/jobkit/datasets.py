"""MNIST as keras ships it, with an offline fallback so jobs and tests run anywhere.

Order: an explicit `.npz` file, keras' cache (~/.keras/datasets/mnist.npz), a bounded
download attempt, then scikit-learn's bundled 8x8 digits blown up to 28x28 (same
shapes and dtype as MNIST, so the job's model and pipeline do not change).
Every task of a run must end up with the same source; the notice line shows which.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

Split = tuple[np.ndarray, np.ndarray]
T = TypeVar("T")
DIGITS_TRAIN_SIZE = 1500  # of 1797; the rest is the test split


def load_mnist(path: Path | None = None, download_timeout_s: float = 20.0) -> tuple[Split, Split]:
    """((x_train, y_train), (x_test, y_test)); images uint8 (n, 28, 28), labels uint8."""
    if path is not None:
        return _read_npz(path)
    cached = Path.home() / ".keras" / "datasets" / "mnist.npz"
    if cached.exists():
        return _read_npz(cached)
    downloaded = _try_download(download_timeout_s)
    if downloaded is not None:
        return downloaded
    print("jobkit: MNIST not available (no --data file, no keras cache, download failed); "
          "falling back to scikit-learn's 8x8 digits upscaled to 28x28", flush=True)
    return load_digits_as_mnist()


def _read_npz(path: Path) -> tuple[Split, Split]:
    with np.load(path, allow_pickle=False) as data:
        return (data["x_train"], data["y_train"]), (data["x_test"], data["y_test"])


def _load_mnist_from_keras() -> tuple[Split, Split]:
    import tf_keras as keras

    return keras.datasets.mnist.load_data()  # type: ignore[no-any-return]


def _try_download(timeout_s: float, name: str = "MNIST",
                  load: Callable[[], T] = _load_mnist_from_keras) -> T | None:  # type: ignore[assignment]  # T = MNIST by default
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
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8)
    # Each pixel becomes a 3x3 block (24x24), centred with a 2-pixel border like MNIST's.
    upscaled = images.repeat(3, axis=1).repeat(3, axis=2)
    padded = np.pad(upscaled, ((0, 0), (2, 2), (2, 2)))
    labels = digits.target.astype(np.uint8)
    n = DIGITS_TRAIN_SIZE
    return (padded[:n], labels[:n]), (padded[n:], labels[n:])
