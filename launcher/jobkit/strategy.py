"""Strategy choice, the local devices it runs on, and the two data rules multi-worker training depends on."""

from __future__ import annotations

import os

import tensorflow as tf

from launcher.contract import GLOBAL_BATCH
from launcher.jobkit.context import JobKitError, TaskContext
from launcher.jobkit.devices import LocalDevices, choose_strategy, gpu_split
from launcher.jobkit.notice import exit_on_notice


def make_strategy(context: TaskContext, virtual_devices: int | None = None) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy for >1 training task, MirroredStrategy over every local
    device for one task with several, else the default strategy (see `devices.choose_strategy`).

    `virtual_devices` overrides the launcher's `--virtual-devices` (TFL_VIRTUAL_DEVICES).
    Call it before creating any tensor: devices can only be split before TensorFlow starts.
    """
    exit_on_notice(context, "before training began")
    local = local_devices(context, virtual_devices)
    choice = choose_strategy(context, local)
    if choice.name == "MultiWorkerMirroredStrategy":
        # Reads TF_CONFIG itself; collectives wait until every training task is up. It
        # takes every local (logical) GPU as a replica, or else the CPU.
        strategy: tf.distribute.Strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=_communication(choice.collective))
        # TensorFlow's coordination agent has just taken SIGTERM over as a notice it only
        # records ("preemption_notifier.cc: SIGTERM caught"); the kit acts on it instead.
        exit_on_notice(context, "before training began")
    elif choice.name == "MirroredStrategy":
        strategy = tf.distribute.MirroredStrategy(devices=list(local.names))
    else:
        strategy = tf.distribute.get_strategy()
    role = "evaluator" if context.is_evaluator else ("chief" if context.is_chief else "worker")
    print(f"jobkit: task={context.label} role={role} strategy={choice.name} "
          f"replicas={strategy.num_replicas_in_sync} devices={local.describe()} "
          f"{f'collectives={choice.collective} ' if choice.collective != 'auto' else ''}"
          f"training_tasks={context.num_training_tasks} attempt={context.attempt}", flush=True)
    if choice.note:
        print(f"jobkit: {choice.note}", flush=True)
    return strategy


def _communication(collective: str) -> tf.distribute.experimental.CommunicationOptions:
    implementation = tf.distribute.experimental.CommunicationImplementation[collective.upper()]
    return tf.distribute.experimental.CommunicationOptions(implementation=implementation)


def local_devices(context: TaskContext, virtual_devices: int | None = None) -> LocalDevices:
    """Split the physical devices as asked, before TensorFlow initialises them, and return
    the logical devices replicas may use: the GPUs if there are any, else the CPUs.

    N virtual devices: each GPU becomes N logical GPUs with a memory limit each (the task's
    TFL_GPU_MEMORY_LIMIT_MB shared out, else 1024 MB); without a GPU the CPU becomes N.
    """
    count = context.virtual_devices if virtual_devices is None else virtual_devices
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        limits = gpu_split(count, context.gpu_memory_limit_mb)
        if limits is not None:
            for gpu in gpus:
                _split(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=mb) for mb in limits])
        return LocalDevices("GPU", len(gpus) * len(limits or [None]), physical=len(gpus))
    if context.gpu_memory_limit_mb is not None:
        print(f"jobkit: no GPU visible; the GPU memory limit ({context.gpu_memory_limit_mb} MB) does not apply",
              flush=True)
    if count is not None and count > 1:
        _split(tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * count)
        return LocalDevices("CPU", count)
    return LocalDevices("CPU", 1)


def _split(device: tf.config.PhysicalDevice, configs: list[tf.config.LogicalDeviceConfiguration]) -> None:
    if tf.config.get_logical_device_configuration(device) == configs:
        return  # already done (make_strategy called twice): TF refuses even an identical change later
    try:
        tf.config.set_logical_device_configuration(device, configs)
    except RuntimeError as err:
        raise JobKitError(
            f"cannot split {device.name} into {len(configs)} logical devices: TensorFlow has already "
            "initialised its devices; call jobkit.make_strategy (or jobkit.local_devices) before creating "
            "any tensor, dataset or model") from err


def global_batch_size(per_replica_batch_size: int, strategy: tf.distribute.Strategy) -> int:
    """Batch the dataset with this: the strategy splits it back into per-replica batches.

    An elastic run that keeps its global batch (``TFL_GLOBAL_BATCH``, set by tfl) gets that
    batch whatever the number of replicas: each replica takes its share of it."""
    replicas = int(strategy.num_replicas_in_sync)
    kept = os.environ.get(GLOBAL_BATCH)
    if not kept:
        return per_replica_batch_size * replicas
    if int(kept) % replicas:
        raise JobKitError(f"{GLOBAL_BATCH}={kept} (tfl launch --global-batch) cannot be split over {replicas} replicas; "
                          "launch with a global batch every allowed size divides")
    return int(kept)


def shard_by_data(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Shard by element, not by file: in-memory datasets have no files to split,
    and DATA sharding makes N workers step exactly like one process with the same
    global batch (every worker must build the same, identically seeded dataset)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)
