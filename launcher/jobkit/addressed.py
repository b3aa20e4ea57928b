"""Input addressed by position: example g of the stream is a pure function of (seed, g).

    train = jobkit.ArrayInput((x_train, y_train), global_batch=global_batch, seed=args.seed, batch_fn=scale)
    jobkit.fit(model, train, ...)           # a resume starts the input at its step: nothing replayed

Pass e over the data is a full permutation of it, drawn from (seed, e) with
`tf.random.experimental.index_shuffle`; per-example randomness (`augment`) gets the seed
``stateless_fold_in((seed, AUGMENT_STREAM), g)``. The kit splits each global batch across
the input pipelines (one per worker) and replicas itself (`addressing.GlobalBatch`), through
``strategy.distribute_datasets_from_function``: no auto-sharding, no rebatching, and the
same global batch k whatever the number of workers. See docs/input.md.
"""

from __future__ import annotations

import abc
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from launcher.jobkit.addressing import AUGMENT_STREAM, PASS_STREAM, GlobalBatch
from launcher.jobkit.context import JobKitError
from launcher.jobkit.stateless import check_stateless

Augment = Callable[[Any, tf.Tensor], Any]  # (one example, its shape-[2] int64 seed) -> example
BatchFn = Callable[..., Any]  # a whole per-replica batch -> the model's inputs (e.g. scale and cast)


class AddressedInput(abc.ABC):
    """A training stream of global batches that starts at any step without reading what came before."""

    def __init__(self, *, examples: int, global_batch: int, seed: int, augment: Augment | None,
                 batch_fn: BatchFn | None, what: str) -> None:
        self.batch = GlobalBatch(global_batch, examples, what)
        self.seed = int(seed)
        self.augment, self.batch_fn = augment, batch_fn

    @property
    def steps_per_epoch(self) -> int:
        return self.batch.steps_per_epoch

    def prepare(self, model_dir: Path, is_chief: bool) -> None:
        """Called by `fit` before the stream is built (a TFRecord input keeps its file list there)."""
        return None

    def how_it_resumes(self) -> str:
        """What a resume reads before its first batch, for the resume line."""
        return "nothing replayed"

    def identity(self) -> dict[str, Any]:
        """What decides the stream besides the global batch: a resume must find it unchanged (input_identity.py)."""
        return {"kind": type(self).__name__, "examples": self.batch.examples, "seed": self.seed}

    def distribute(self, strategy: tf.distribute.Strategy, start_step: int) -> Any:
        """The per-replica batches from global step `start_step` on, split by the kit (see module doc)."""
        def for_pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
            local = context.num_replicas_in_sync // context.num_input_pipelines
            return self.replica_batches(start_step, context.input_pipeline_id, context.num_input_pipelines, local)

        return strategy.distribute_datasets_from_function(for_pipeline)

    def replica_batches(self, start_step: int, pipeline: int, pipelines: int, local_replicas: int) -> tf.data.Dataset:
        """Pipeline `pipeline`'s per-replica batches: step k's for local replica 0, 1, ..., then step k+1's.

        (A distributed dataset hands its elements to the local replicas in turn.)"""
        replicas = pipelines * local_replicas
        share = self.batch.share(replicas)
        mine = share * local_replicas
        first = pipeline * mine
        size = self.batch.size
        stream = self.examples_from(start_step * size).batch(size, drop_remainder=True)
        stream = stream.map(lambda raw, pos: (tf.nest.map_structure(lambda t: t[first:first + mine], raw),
                                              pos[first:first + mine]))
        raw = stream.unbatch()
        if self.augment is not None:
            decoded = raw.map(lambda r, _: self.decode(r)).element_spec
            check_stateless(self.augment, "augment", (decoded, tf.TensorSpec([2], tf.int64)))
        examples = raw.map(self._example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return self._finish(examples.batch(share, drop_remainder=True), share)

    @abc.abstractmethod
    def examples_from(self, position: int) -> tf.data.Dataset:
        """(raw example, its global position) from global position `position` on, for ever."""

    def decode(self, raw: Any) -> Any:
        """One raw example -> one example (a TFRecord input parses the record here)."""
        return raw

    def _example(self, raw: Any, position: tf.Tensor) -> Any:
        example = self.decode(raw)
        if self.augment is None:
            return example
        seed = tf.random.experimental.stateless_fold_in(tf.constant([self.seed, AUGMENT_STREAM], tf.int64), position)
        return self.augment(example, seed)

    def _finish(self, batches: tf.data.Dataset, share: int) -> tf.data.Dataset:
        if self.batch_fn is not None:
            spec = batches.element_spec  # map hands a tuple's parts to the function one by one
            check_stateless(self.batch_fn, "batch_fn", spec if isinstance(spec, tuple) else (spec,))
            batches = batches.map(self.batch_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        wrong = [str(spec.shape) for spec in tf.nest.flatten(batches.element_spec)
                 if spec.shape.rank is not None and (spec.shape.rank == 0 or spec.shape[0] not in (None, share))]
        if wrong:
            raise JobKitError(f"the input's batches have shapes {', '.join(wrong)}; every part of a batch needs "
                              f"{share} examples first (one replica's share): check batch_fn and the fetch")
        return batches.prefetch(tf.data.AUTOTUNE)

    def permute(self, offsets: tf.Tensor, epochs: tf.Tensor, size: int | tf.Tensor, stream: int = PASS_STREAM) -> tf.Tensor:
        """Where each of `offsets` (int64, shape [n] or []) goes in a permutation of range(size) drawn
        from (seed, epoch, stream): the raw op, since the public index_shuffle mangles seeds of shape [n, 2]."""
        epochs = tf.cast(epochs, tf.int64)
        seeds = tf.stack([tf.fill(tf.shape(epochs), tf.constant(self.seed, tf.int64)), epochs,
                          tf.fill(tf.shape(epochs), tf.constant(stream, tf.int64))], axis=-1)
        return tf.raw_ops.RandomIndexShuffle(index=offsets, seed=seeds, max_index=tf.cast(size, tf.int64) - 1, rounds=4)


class ArrayInput(AddressedInput):
    """Arrays in memory (the same first dimension), each pass a full permutation of their rows.

    The arrays live in variables on the CPU, which the input gathers from by index: they
    are not constants of the input's graph (TensorFlow's 2 GB limit on a graph). Create it
    outside `strategy.scope()`: inside, the store would become a mirrored variable.
    """

    def __init__(self, arrays: Sequence[np.ndarray], *, global_batch: int, seed: int,
                 augment: Augment | None = None, batch_fn: BatchFn | None = None) -> None:
        _check_arrays(arrays)
        rows = {len(a) for a in arrays}
        if len(rows) != 1:
            shapes = ", ".join(str(np.shape(a)) for a in arrays)
            raise JobKitError(f"ArrayInput's arrays have different numbers of rows ({shapes}); "
                              "every array needs one row per example")
        if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
            raise JobKitError("ArrayInput was created inside strategy.scope(); create it before the scope, "
                              "or its arrays become mirrored variables")
        super().__init__(examples=rows.pop(), global_batch=global_batch, seed=seed, augment=augment,
                         batch_fn=batch_fn, what="the training arrays")
        self._fingerprint = _fingerprint(arrays)
        with tf.device("/CPU:0"):
            self._store = tuple(tf.Variable(a, trainable=False, name=f"input_store_{i}") for i, a in enumerate(arrays))

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "data": self._fingerprint}

    def fetch(self, positions: tf.Tensor) -> tuple[tf.Tensor, ...]:
        """The examples at global positions `positions` (int64, any shape)."""
        epoch, offset = positions // self.batch.examples, positions % self.batch.examples
        rows = self.permute(offset, epoch, self.batch.examples)
        return tuple(tf.gather(store, rows) for store in self._store)

    def examples_from(self, position: int) -> tf.data.Dataset:
        positions = tf.data.Dataset.range(position, tf.int64.max)
        return positions.map(lambda g: (self.fetch(g), g), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    def replica_batches(self, start_step: int, pipeline: int, pipelines: int, local_replicas: int) -> tf.data.Dataset:
        if self.augment is not None:  # per-example work: the general path, one example at a time
            return super().replica_batches(start_step, pipeline, pipelines, local_replicas)
        share = self.batch.share(pipelines * local_replicas)
        size, offsets = self.batch.size, tf.range(share, dtype=tf.int64)

        def one_share(i: tf.Tensor) -> Any:  # element i: step start + i // local, local replica i % local
            step, replica = start_step + i // local_replicas, pipeline * local_replicas + i % local_replicas
            batch = self.fetch(step * size + replica * share + offsets)
            return batch if len(batch) > 1 else batch[0]

        shares = tf.data.Dataset.range(tf.int64.max).map(one_share, num_parallel_calls=tf.data.AUTOTUNE,
                                                         deterministic=True)
        return self._finish(shares, share)


def _check_arrays(arrays: Any) -> None:
    """Refuse in one line what is not a tuple of arrays (else len() would count the wrong thing)."""
    fix = "pass a tuple of arrays with one row per example: (x_train, y_train), or (x_train,) for one"
    if isinstance(arrays, tf.data.Dataset) or (isinstance(arrays, (tuple, list))
                                               and any(isinstance(a, tf.data.Dataset) for a in arrays)):
        raise JobKitError("ArrayInput takes arrays in memory, not a tf.data.Dataset: give the dataset to jobkit.fit "
                          f"itself (a resume then replays it: docs/input.md), or {fix}")
    if not isinstance(arrays, (tuple, list)):
        shape = f" of shape {tuple(np.shape(arrays))}" if hasattr(arrays, "shape") else ""
        raise JobKitError(f"ArrayInput got a {type(arrays).__name__}{shape}, not a tuple of arrays; {fix}")
    if not arrays:
        raise JobKitError(f"ArrayInput got no array; {fix}")
    flat = [i for i, a in enumerate(arrays) if np.ndim(a) < 1]
    if flat:
        raise JobKitError(f"ArrayInput's array {flat[0]} is a scalar ({arrays[flat[0]]!r:.40}), not rows; {fix}")


def _fingerprint(arrays: Sequence[np.ndarray]) -> str:
    """A CRC-32 of the arrays' dtypes, shapes and bytes (MNIST's 47 MB: tens of ms, once per attempt)."""
    crc = 0
    for array in arrays:
        array = np.ascontiguousarray(array)
        crc = zlib.crc32(array.data, zlib.crc32(f"{array.dtype.str}{array.shape}".encode(), crc))
    return f"crc32:{crc:08x}"
