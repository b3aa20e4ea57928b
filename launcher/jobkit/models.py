"""The kit trains tf_keras models only: a Keras 3 model is refused in one line, before training.

`import keras` gives Keras 3 even with TF_USE_LEGACY_KERAS=1 (that variable only decides
what `tf.keras` is). A Keras 3 model breaks under MultiWorkerMirroredStrategy
(keras-team/keras#20585), and handed to the kit it fails on a tf_keras attribute with a
traceback that names neither cause nor fix; so `fit` and `run_evaluator` check first.
"""

from __future__ import annotations

from typing import Any

import tf_keras as keras

from launcher.contract import KERAS3_REFUSED
from launcher.jobkit.context import JobKitError


def require_tf_keras(model: Any, where: str) -> None:
    """Raise a JobKitError naming the fix unless `model` is a tf_keras model."""
    if isinstance(model, keras.Model):
        return
    kind = f"{type(model).__module__}.{type(model).__qualname__}"
    if kind.startswith("keras."):
        raise JobKitError(f"{where} {KERAS3_REFUSED} ({kind}): Keras 3 (`import keras`) breaks under "
                          "MultiWorkerMirroredStrategy (keras-team/keras#20585); build it with "
                          "`import tf_keras as keras` (or `tf.keras`) after jobkit.select_tf_keras()")
    raise JobKitError(f"{where} got {kind}, not a model; pass the compiled tf_keras model (`import tf_keras as keras`)")
