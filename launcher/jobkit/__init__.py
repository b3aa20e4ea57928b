"""The job kit: what every tfl job needs around its model and data.

    from launcher import jobkit            # before tensorflow: selects tf_keras
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context)
    ...
    jobkit.fit(model, dataset, context=context, model_dir=..., epochs=..., global_batch_size=...)
    jobkit.finish(strategy)                # last: all training tasks leave together, at once

TensorFlow-using parts load on first use, so `launcher.jobkit.context` etc. stay cheap.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

# Keras 3 breaks under MultiWorkerMirroredStrategy (keras-team/keras#20585); tf_keras
# is selected by this variable, which must be set before tensorflow is first imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from launcher.jobkit.args import job_arguments  # noqa: E402
from launcher.jobkit.context import JobKitError, TaskContext  # noqa: E402
from launcher.jobkit.context import task_context as _task_context  # noqa: E402
from launcher.jobkit.layout import ModelDirLayout, default_model_dir  # noqa: E402

_LAZY = {
    "make_strategy": "launcher.jobkit.strategy",
    "local_devices": "launcher.jobkit.strategy",
    "global_batch_size": "launcher.jobkit.strategy",
    "shard_by_data": "launcher.jobkit.strategy",
    "finish": "launcher.jobkit.strategy",
    "fit": "launcher.jobkit.training",
    "use_true_per_step_logs": "launcher.jobkit.training",
    "run_evaluator": "launcher.jobkit.evaluator",
    "EvaluatorTimeout": "launcher.jobkit.evaluator",
    "load_mnist": "launcher.jobkit.datasets",
    "load_reuters": "launcher.jobkit.reuters",
}

__all__ = ["JobKitError", "ModelDirLayout", "TaskContext", "default_model_dir", "job_arguments", "task_context", *_LAZY]


def task_context() -> TaskContext:
    """This process's TaskContext, from TF_CONFIG and the TFL_* variables."""
    return _task_context(os.environ)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'launcher.jobkit' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
