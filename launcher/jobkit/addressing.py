"""Where an example sits in the training stream: pure arithmetic, no TensorFlow.

The stream is every pass over the data, one after the other; its examples are numbered by
their *global position* g = 0, 1, 2, ... Pass (data epoch) e holds positions
[e·N, (e+1)·N) for N examples; global batch k holds positions [k·B, (k+1)·B). A batch may
straddle two passes, so no example is dropped and no pass is short. The kit splits global
batch k into contiguous shares, one per replica, in replica order: whatever the number
of workers and replicas, batch k holds the same examples (only the order of the sums
differs). The shuffle and per-example randomness are pure functions of (seed, g), so a
resume at step k starts at position k·B and reads nothing before it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.jobkit.context import JobKitError

PASS_STREAM = 0  # seed (seed, epoch, PASS_STREAM): the permutation of examples (or of files) in pass `epoch`
AUGMENT_STREAM = 1  # seed (seed, AUGMENT_STREAM) folded with g: the per-example randomness
WINDOW_STREAM = 2  # the within-window shuffle of records, window w of pass e: seed (seed, e, WINDOW_STREAM + w)


@dataclass(frozen=True)
class GlobalBatch:
    """B examples per training step drawn from a data set of N examples."""

    size: int
    examples: int
    what: str = "the data"

    def __post_init__(self) -> None:
        if self.size < 1:
            raise JobKitError(f"the global batch is {self.size} examples; expected at least 1")
        if self.examples < 1:
            raise JobKitError(f"{self.what} holds no example; check its source")
        if self.size > self.examples:
            raise JobKitError(f"the global batch ({self.size} examples) is larger than {self.what} ({self.examples} "
                              "examples); lower --batch-size or give more data")

    @property
    def steps_per_epoch(self) -> int:
        """Whole batches in one pass: keras' epoch (a report's length, not a boundary of the data)."""
        return self.examples // self.size

    def share(self, replicas: int) -> int:
        """Examples per replica of one global batch."""
        if replicas < 1 or self.size % replicas:
            raise JobKitError(f"a global batch of {self.size} examples cannot be split over {replicas} replicas; "
                              "choose a global batch every replica count divides (tfl launch --global-batch)")
        return self.size // replicas

    def first_position(self, step: int, replica: int, replicas: int) -> int:
        """The global position of replica `replica`'s first example in global batch `step`."""
        return step * self.size + replica * self.share(replicas)

    def pass_and_offset(self, position: int) -> tuple[int, int]:
        """(data epoch, position within it) of global position `position`."""
        return divmod(position, self.examples)


@dataclass(frozen=True)
class Shard:
    """One TFRecord file of the input: its name (relative to the input directory), bytes, records."""

    name: str
    size: int
    records: int


def locate(records_per_file: Sequence[int], offset: int) -> tuple[int, int]:
    """(file index, record in it) of the `offset`-th record of the files read one after the other."""
    ends: list[int] = []
    total = 0
    for count in records_per_file:
        total += count
        ends.append(total)
    if not 0 <= offset < total:
        raise JobKitError(f"record {offset} is past the {total} records of the input")
    index = bisect.bisect_right(ends, offset)
    return index, offset - (ends[index - 1] if index else 0)


def check_same_shards(recorded: Sequence[Shard], found: Sequence[tuple[str, int]], directory: str, manifest: str) -> None:
    """Refuse in one line when the files differ from the ones the run began with (names or sizes)."""
    before = {s.name: s.size for s in recorded}
    now = dict(found)
    if before == now:
        return
    gone = sorted(set(before) - set(now))
    new = sorted(set(now) - set(before))
    resized = sorted(n for n in set(before) & set(now) if before[n] != now[n])
    said = "; ".join(part for part in (
        f"gone: {', '.join(gone)}" if gone else "", f"new: {', '.join(new)}" if new else "",
        f"changed size: {', '.join(resized)}" if resized else "") if part)
    raise JobKitError(f"{directory}: the TFRecord files changed since this run began ({said}); a resume would read "
                      f"another stream: restore the files, or start a new run (another --model-dir; {manifest} "
                      "records what the run began with)")
