"""Several training steps per call of the train function, and metrics reduced once per call.

Two costs dominate small models, most of all under MultiWorkerMirroredStrategy:
- every call of the train function costs fixed host time (see `execution.py`), so the
  kit runs several steps per call (`steps_per_execution`), chosen from the measured
  step time unless the job sets it;
- keras' stock train step returns `metric.result()` after every step; under a
  distribution strategy reading a metric all-reduces its variables across every
  replica (four extra all-reduces per step for loss and accuracy). The kit's train
  function updates the metrics on every step but reads them once, after the last step
  of the call: the same values keras would log there, at a fraction of the all-reduces.
  It is used only where keras' own step would run unchanged (stock `train_step` and
  `compute_metrics`, not eager, not XLA); otherwise keras' function runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import tensorflow as tf
import tf_keras as keras

from launcher.jobkit.callbacks import StepClock
from launcher.jobkit.execution import choose_steps_per_execution

WARMUP_CALLS = 5  # the first calls trace the function and warm the input pipeline
MEASURED_CALLS = 30


def uses_stock_step(model: keras.Model) -> bool:
    """Whether `model` trains with keras' own train step (its per-step logs can be trusted)."""
    cls = type(model)
    return cls.train_step is keras.Model.train_step and cls.compute_metrics is keras.Model.compute_metrics


def install_train_function(model: keras.Model) -> str:
    """Give `model` a train function that honours a changing steps_per_execution; say which."""
    if (uses_stock_step(model) and not model.run_eagerly and not model.jit_compile
            and getattr(model, "_cluster_coordinator", None) is None):
        model.train_function = model.train_tf_function = _metrics_once_per_call(model)
        return "metrics read once per call"
    # keras builds a one-step function when the value is 1 at build time and would then
    # ignore a later change; built while it is 2, the function reads it on every call.
    spe = model.steps_per_execution
    current = int(spe.numpy())
    spe.assign(max(2, current))
    model.make_train_function(force=True)
    spe.assign(current)
    return "keras' train function"


def _metrics_once_per_call(model: keras.Model) -> Callable[[Any], Any]:
    strategy = model.distribute_strategy

    def update_step(data: Any) -> None:
        # keras.Model.train_step without reading the metrics (which all-reduces them).
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            loss = model.compute_loss(x, y, y_pred, sample_weight)
        model._validate_target_and_loss(y, loss)
        model.optimizer.minimize(loss, model.trainable_variables, tape=tape)
        model.compiled_metrics.update_state(y, y_pred, sample_weight)
        with tf.control_dependencies([loss]):
            model._train_counter.assign_add(1)

    def last_step(data: Any) -> Any:
        outputs = model.train_step(data)
        with tf.control_dependencies(tf.nest.flatten(outputs)[:1]):
            model._train_counter.assign_add(1)
        return outputs

    def first_replica(value: Any) -> Any:
        # Metric results are already global (keras reduces them across replicas), so
        # every replica holds the same value: take one, as keras' "first" reduction does.
        return strategy.experimental_local_results(value)[0]

    @tf.function(reduce_retracing=True)  # type: ignore[untyped-decorator]  # tensorflow is untyped
    def train_function(iterator: Any) -> Any:
        for _ in tf.range(model.steps_per_execution - 1):
            strategy.run(update_step, args=(next(iterator),))
        outputs = strategy.run(last_step, args=(next(iterator),))
        return tf.nest.map_structure(first_replica, outputs)

    return train_function  # type: ignore[no-any-return]


class AutoStepsPerExecution(keras.callbacks.Callback):  # type: ignore[misc]  # tf_keras is untyped
    """Measures the step time over a few calls (one step each), then sets steps_per_execution.

    The median call: on a shared machine other work stretches some calls, never shortens
    them. It decides after a fixed number of calls, so every worker of a group decides at
    the same point; `agree` makes them take the same value (the chief's). The value takes
    effect after a step of the epoch that is a multiple of it, so that calls start on
    multiples of it (backups every N steps fall at the end of a call; see `execution`).
    """

    def __init__(self, clock: StepClock, *, backup_every_steps: int | None, agree: Callable[[int], int]) -> None:
        super().__init__()
        self._supports_tf_logs = True
        self._clock = clock
        self._backup_every_steps = backup_every_steps
        self._agree = agree
        self._samples: list[float] = []  # seconds per step of each measured call
        self.chosen: int | None = None
        self._applied = False

    def _implements_train_batch_hooks(self) -> bool:
        return not self._applied

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.chosen is not None:
            if not self._applied and (int(batch) + 1) % self.chosen == 0:
                self.model.steps_per_execution.assign(self.chosen)
                self._applied = True
            return
        if self._clock.calls <= WARMUP_CALLS:
            return
        seconds, steps = self._clock.last_call
        self._samples.append(seconds / max(1, steps))
        if len(self._samples) < MEASURED_CALLS:
            return
        step_s = statistics.median(self._samples)
        mine = choose_steps_per_execution(step_s, steps_per_epoch=self.params.get("steps"),
                                          backup_every_steps=self._backup_every_steps)
        self.chosen = self._agree(mine)
        print(f"jobkit: {step_s * 1000:.2f} ms per step (median of {len(self._samples)} steps); "
              f"{self.chosen} steps per call of the train function from the next step that is a multiple of it "
              "(progress is recorded once per call)", flush=True)
        self.on_train_batch_end(batch, logs)


def chief_decides(strategy: tf.distribute.Strategy, is_chief: bool) -> Callable[[int], int]:
    """Under MultiWorkerMirroredStrategy every task takes the chief's value (one all-reduce)."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return lambda value: value

    def agree(value: int) -> int:
        vote = [float(value), 1.0] if is_chief else [0.0, 0.0]
        per_replica = strategy.experimental_distribute_values_from_function(lambda _ctx: tf.constant(vote))
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None).numpy()
        return int(round(total[0] / total[1]))

    return agree
