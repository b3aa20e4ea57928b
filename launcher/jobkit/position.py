"""The input position: a resumed run trains on exactly the batches an uninterrupted one would.

keras restores the step counter from a backup but restarts the input from the beginning
of the data, so after any restart the group trained on other batches than it would have.
The kit makes the input one stream of batches for the whole training, read by a single
iterator, so the position in it is the number of steps trained:

- a finite dataset (of known length, or of unknown length with ``steps_per_epoch``)
  becomes ``dataset.repeat()``: its passes follow one another, reshuffled as a seeded
  ``shuffle`` reshuffles each pass, the same in every process, and an epoch (by default one
  pass; ``steps_per_epoch`` may be shorter or longer) reads on where the last one stopped,
  never running out of data (keras would end the training early, with only a warning);
- an infinite dataset (``.repeat()``) is already read by one iterator across epochs.

On a restart the position comes from the backup keras restores (its epoch and step),
read before ``model.fit`` starts, and the stream starts with ``skip(position)``. Nothing
is added per step: the backup already holds the epoch and step. Skipping costs one pass
of the input pipeline over the skipped batches, at start-up only (`consistency.PositionCheck`
checks that keras restored the state the stream was placed for). A dataset of unknown
length without ``steps_per_epoch`` (or an already distributed one) cannot be placed:
keras then restarts it at the beginning of the epoch, and the kit says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.jobkit.context import JobKitError

NOTHING = (-1, -1)  # keras' "no backup": (epoch, batch)
_EPOCH_KEY = "ckpt_saved_epoch/.ATTRIBUTES/VARIABLE_VALUE"
_BATCH_KEY = "ckpt_saved_batch/.ATTRIBUTES/VARIABLE_VALUE"


@dataclass(frozen=True)
class InputStream:
    """What the kit hands keras: the dataset (skipped to the position), its epoch length."""

    dataset: Any  # tf.data.Dataset, or whatever the job passed when it cannot be placed
    steps_per_epoch: int | None
    start: int  # the global step the input starts at: the steps trained before this attempt
    exact: bool  # False: keras restarts the input at the beginning of each epoch
    replayed: bool = False  # True: the input reaches `start` by reading (and dropping) every batch before it
    differs: str = ""  # why the replayed batches are not the ones trained before (replayable.py); "" when they are


def saved_state(backup_dir: Path) -> tuple[int, int]:
    """(epoch, batch) of the latest backup keras' BackupAndRestore will restore, or NOTHING."""
    import tensorflow as tf  # here: the rest of this module is pure

    latest = tf.train.latest_checkpoint(str(backup_dir / "chief"))
    if latest is None:
        return NOTHING
    reader = tf.train.load_checkpoint(latest)
    return int(reader.get_tensor(_EPOCH_KEY)), int(reader.get_tensor(_BATCH_KEY))


def resume_point(state: tuple[int, int], steps_per_epoch: int) -> tuple[int, int]:
    """(epoch, step) training goes on from after restoring `state`: keras' rule for step backups."""
    epoch, batch = state
    if epoch < 0:
        return 0, 0
    if batch < 0 or batch >= steps_per_epoch - 1:  # an epoch-end backup
        return epoch + 1, 0
    return epoch, batch + 1


def check_backup_fits(state: tuple[int, int], steps_per_epoch: int) -> None:
    """Refuse a step backup saved past the end of an epoch as long as this attempt's.

    keras goes on after step `batch` of the saved epoch; with fewer steps an epoch than when the
    backup was saved (a larger global batch: more workers, another --batch-size; a smaller
    steps_per_epoch) that epoch has no step left, and keras stops with "Unexpected result of
    `train_function` (Empty logs)", which names no cause."""
    epoch, batch = state
    if epoch >= 0 and batch + 1 > steps_per_epoch:
        raise JobKitError(f"the backup was saved at epoch {epoch + 1} step {batch + 1}, past the {steps_per_epoch} steps "
                          "an epoch has now (the global batch or steps_per_epoch changed since it was saved), so keras "
                          "would find that epoch empty; resume with the steps per epoch it was saved with (the same "
                          "--steps-per-epoch, or the same global batch: batch size and number of workers), or start a "
                          "new run (another --model-dir)")


def input_stream(dataset: Any, steps_per_epoch: int | None, state: tuple[int, int], strategy: Any = None,
                 *, replay: bool = True) -> InputStream:
    """The stream keras reads, started at the position `state` (a backup's) leaves off at.

    An `AddressedInput` starts right there (addressed.py); a plain dataset skips to it
    (a replay), or, with `replay=False`, starts at the beginning of its stream."""
    import tensorflow as tf

    from launcher.jobkit.addressed import AddressedInput

    if isinstance(dataset, AddressedInput):
        steps_per_epoch = steps_per_epoch or dataset.steps_per_epoch
        check_backup_fits(state, steps_per_epoch)
        epoch, step = resume_point(state, steps_per_epoch)
        start = epoch * steps_per_epoch + step
        distributed = dataset.distribute(strategy or tf.distribute.get_strategy(), start)
        return InputStream(distributed, steps_per_epoch, start, exact=True)
    if not isinstance(dataset, tf.data.Dataset):
        return InputStream(dataset, steps_per_epoch, 0, exact=False)
    length = int(dataset.cardinality().numpy())
    if length == 0:
        raise JobKitError("the training dataset is empty; check its source and batching")
    if length == tf.data.INFINITE_CARDINALITY and steps_per_epoch is None:
        raise JobKitError("the training dataset repeats for ever and fit got no steps_per_epoch, so the first epoch "
                          "would never end (no checkpoint, no backup, no done marker); pass steps_per_epoch=N")
    if length > 0 or (length == tf.data.UNKNOWN_CARDINALITY and steps_per_epoch is not None):
        # One stream for the whole training: an epoch reads on where the last one stopped, and
        # steps_per_epoch × epochs past the data's end never runs out (keras would end the
        # training there, after a warning, and the kit would call it done).
        dataset, steps_per_epoch = dataset.repeat(), steps_per_epoch or length
    if steps_per_epoch is None:
        return InputStream(dataset, None, 0, exact=False)
    check_backup_fits(state, steps_per_epoch)
    epoch, step = resume_point(state, steps_per_epoch)
    start = epoch * steps_per_epoch + step
    if not start:
        return InputStream(dataset, steps_per_epoch, 0, exact=True)
    if not replay:
        return InputStream(dataset, steps_per_epoch, start, exact=False)
    from launcher.jobkit.replayable import why_a_replay_differs

    differs = why_a_replay_differs(dataset) or ""
    return InputStream(dataset.skip(start), steps_per_epoch, start, exact=not differs, replayed=True, differs=differs)


def say_where_the_input_starts(stream: InputStream, dataset: Any) -> None:
    """One line on the console: where the input starts, and what that costs or gives up."""
    if stream.differs:
        print(f"jobkit: resuming at global step {stream.start}: the input replays the {stream.start} batches trained "
              f"before, but not exactly: {stream.differs} draws other batches in every process; give each shuffle "
              "and random op a seed, or call keras.utils.set_random_seed(S) before building the input, and keep "
              "parallel stages deterministic (or use an AddressedInput: docs/input.md)", flush=True)
    elif stream.replayed:
        print(f"jobkit: resuming at global step {stream.start}: the input replays the {stream.start} batches trained "
              "before (a tf.data pipeline reaches a step only by reading every batch before it; the time it takes "
              "is said at the first step; an AddressedInput starts right there: docs/input.md)", flush=True)
    elif stream.start and stream.exact:
        print(f"jobkit: resuming at global step {stream.start}: the input starts there "
              f"({dataset.how_it_resumes()})", flush=True)
    elif stream.start:
        print(f"jobkit: resuming at global step {stream.start} without a replay (replay=False): the input starts at "
              "the beginning of its stream, so the batches from here on are not the ones an uninterrupted run "
              "trains on (not exact; examples trained before the resume come again first)", flush=True)
    elif not stream.exact:
        print("jobkit: the input cannot be placed (a dataset of unknown length without steps_per_epoch, or an "
              "already distributed one): a restarted attempt reads it from the beginning of the epoch", flush=True)
