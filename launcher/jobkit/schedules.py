"""Learning rate for a batch that grows with the replicas: linear scaling with warm-up."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

from launcher.jobkit.context import JobKitError
from launcher.jobkit.execution import scaled_learning_rate


class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc]  # tf_keras is untyped
    """`base` at step 0, rising in a straight line to `peak` at `warmup_steps`, then `peak`.

    Driven by the optimizer's step counter, which backups and checkpoints hold, so a
    restarted group resumes at the right rate.
    """

    def __init__(self, base: float, peak: float, warmup_steps: int) -> None:
        super().__init__()
        self.base, self.peak, self.warmup_steps = float(base), float(peak), int(warmup_steps)

    def __call__(self, step: Any) -> Any:
        if self.warmup_steps <= 0:
            return tf.constant(self.peak, tf.float32)
        fraction = tf.minimum(tf.cast(step, tf.float32) / float(self.warmup_steps), 1.0)
        return self.base + (self.peak - self.base) * fraction

    def get_config(self) -> dict[str, Any]:
        return {"base": self.base, "peak": self.peak, "warmup_steps": self.warmup_steps}


def learning_rate(base: float, strategy: tf.distribute.Strategy, *, scaling: str = "none", warmup_epochs: float = 0.0,
                  steps_per_epoch: int = 1) -> float | LinearWarmup:
    """What to give the optimizer: `base` as it is, or scaled with the replicas (`--lr-scaling linear`).

    `base` is the rate for one replica's batch (`--batch-size` is per replica). With
    `warmup_epochs`, the rate climbs from `base` to the scaled rate over that many epochs.
    """
    if warmup_epochs < 0:
        raise JobKitError(f"warm-up is {warmup_epochs} epochs; expected 0 or more")
    replicas = int(strategy.num_replicas_in_sync)
    peak = scaled_learning_rate(base, replicas, scaling)
    warmup_steps = round(warmup_epochs * steps_per_epoch)
    print(f"jobkit: learning rate {base:g} per replica, {scaling} scaling over {replicas} replica(s): {peak:g}"
          + (f", reached after a {warmup_steps}-step warm-up" if warmup_steps and peak != base else ""), flush=True)
    if warmup_steps <= 0 or peak == base:
        return peak
    return LinearWarmup(base, peak, warmup_steps)
