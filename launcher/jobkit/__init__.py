"""The job kit: what every tfl job needs around its model and data.

    from launcher import jobkit
    jobkit.select_tf_keras()               # before tensorflow is imported
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context)
    ...
    jobkit.fit(model, dataset, context=context, model_dir=..., epochs=..., global_batch_size=...)
    jobkit.finish(strategy)                # last: all training tasks leave together, the chief last

TensorFlow-using parts load on first use, so `launcher.jobkit.context` etc. stay cheap.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from launcher.contract import LEGACY_KERAS, ModelDirLayout
from launcher.jobkit.args import job_arguments
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.context import task_context as _task_context
from launcher.jobkit.layout import default_model_dir

_LAZY = {
    "make_strategy": "launcher.jobkit.strategy",
    "local_devices": "launcher.jobkit.strategy",
    "global_batch_size": "launcher.jobkit.strategy",
    "shard_by_data": "launcher.jobkit.strategy",
    "finish": "launcher.jobkit.finish",
    "fit": "launcher.jobkit.training",
    "preemption_handler": "launcher.jobkit.preemption",
    "use_true_per_step_logs": "launcher.jobkit.training",
    "learning_rate": "launcher.jobkit.schedules",
    "run_evaluator": "launcher.jobkit.evaluator",
    "EvaluatorTimeout": "launcher.jobkit.evaluator",
    "load_mnist": "launcher.jobkit.datasets",
    "AddressedInput": "launcher.jobkit.addressed",
    "ArrayInput": "launcher.jobkit.addressed",
    "TFRecordInput": "launcher.jobkit.records",
    "load_reuters": "launcher.jobkit.reuters",
}

__all__ = ["JobKitError", "ModelDirLayout", "TaskContext", "default_model_dir", "job_arguments", "select_tf_keras", "task_context",
           *_LAZY]


def select_tf_keras() -> None:
    """Make TensorFlow use tf_keras (Keras 2) instead of Keras 3; call it before importing tensorflow.

    Keras 3 breaks under MultiWorkerMirroredStrategy (keras-team/keras#20585). TensorFlow
    reads ``TF_USE_LEGACY_KERAS`` once, when it is first imported, so this is the one place
    the kit writes the process environment, and only when a job asks. The launcher sets the
    variable in every task's environment anyway; this covers a job run by hand.
    """
    if "tensorflow" in sys.modules and os.environ.get(LEGACY_KERAS) != "1":
        raise JobKitError("select_tf_keras() came after `import tensorflow`; call it first in the job script")
    os.environ.setdefault(LEGACY_KERAS, "1")


def task_context() -> TaskContext:
    """This process's TaskContext, from TF_CONFIG and the TFL_* variables."""
    return _task_context(os.environ)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'launcher.jobkit' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
