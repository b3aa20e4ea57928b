"""Strategy choice and the two data rules multi-worker training depends on."""

from __future__ import annotations

import tensorflow as tf

from launcher.jobkit.context import TaskContext


def make_strategy(context: TaskContext) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy for >1 training task, else the default strategy.

    The evaluator never joins the collective group: it trains nothing, and a
    strategy would make it wait for the workers' collectives.
    """
    if context.is_multi_worker:
        # Reads TF_CONFIG itself; collectives wait until every training task is up.
        strategy: tf.distribute.Strategy = tf.distribute.MultiWorkerMirroredStrategy()
        name = "MultiWorkerMirroredStrategy"
    else:
        strategy = tf.distribute.get_strategy()
        name = "default"
    role = "evaluator" if context.is_evaluator else ("chief" if context.is_chief else "worker")
    print(f"jobkit: task={context.label} role={role} strategy={name} "
          f"replicas={strategy.num_replicas_in_sync} training_tasks={context.num_training_tasks} "
          f"attempt={context.attempt}", flush=True)
    return strategy


def global_batch_size(per_replica_batch_size: int, strategy: tf.distribute.Strategy) -> int:
    """Batch the dataset with this: the strategy splits it back into per-replica batches."""
    return per_replica_batch_size * int(strategy.num_replicas_in_sync)


def shard_by_data(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Shard by element, not by file: in-memory datasets have no files to split,
    and DATA sharding makes N workers step exactly like one process with the same
    global batch (every worker must build the same, identically seeded dataset)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)
