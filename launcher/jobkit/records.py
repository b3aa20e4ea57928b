"""TFRecord shards addressed by position: a resume seeks to (file, record) and reads from there.

    train = jobkit.TFRecordInput(directory, model_dir=model_dir, parse=parse, global_batch=..., seed=...)

- The record count of each file is learnt once (a header scan of uncompressed files, a read
  of GZIP ones) and kept beside the run, in ``<model dir>/input_records.json``; a later
  attempt compares names and sizes with it (a stat per file) and refuses changed shards.
- Pass e reads the files in an order drawn from (seed, e), and shuffles the records within
  windows of `window` consecutive records, each drawn from (seed, e, window). No shuffle
  buffer: record q of pass e is a pure function of them.
- A resume at position g starts pass e at the window holding g: the file it falls in is
  skipped to its record by the reader (headers only, a seek per record), at most
  `window` records are read before g. GZIP files cannot seek: their resume reads the file
  up to the record (said in one line).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import tensorflow as tf

from launcher.jobkit.addressed import AddressedInput, Augment, BatchFn
from launcher.jobkit.addressing import PASS_STREAM, WINDOW_STREAM, Shard, check_same_shards, locate
from launcher.jobkit.context import JobKitError
from launcher.jobkit.layout import make_private_dirs, write_json_atomically

MANIFEST = "input_records.json"  # beside the run, in the model dir
_HEADER = 12  # uint64 length + uint32 masked crc of it; the data is followed by a uint32 crc
_GZIP_MAGIC = b"\x1f\x8b"
Parse = Any  # one serialized record (a scalar string tensor) -> one example


def count_records(path: Path, compression: str) -> int:
    """Records in one TFRecord file: its headers only when uncompressed."""
    if compression:
        try:
            return int(tf.data.TFRecordDataset(str(path), compression).reduce(0, lambda n, _: n + 1).numpy())
        except tf.errors.DataLossError as err:
            raise JobKitError(f"{path}: not a whole {compression} TFRecord file ({_reason(err)}); "
                              "write the file again") from err
    count, size = 0, path.stat().st_size
    with path.open("rb") as handle:
        offset = 0
        while offset < size:
            header = handle.read(_HEADER)
            if len(header) < _HEADER:
                raise JobKitError(f"{path}: cut short at byte {offset} (record {count} has no whole header); "
                                  f"{_rewrite(path, header, offset)}")
            (length,) = struct.unpack("<Q", header[:8])
            offset += _HEADER + length + 4
            if offset > size:
                raise JobKitError(f"{path}: cut short in record {count} (it says {length} bytes); "
                                  f"{_rewrite(path, header, offset - _HEADER - length - 4)}")
            handle.seek(offset)
            count += 1
    return count


class TFRecordInput(AddressedInput):
    """Every ``*.tfrecord`` (or ``*.tfrecord.gz``, GZIP) file of one directory, one pass per epoch."""

    def __init__(self, directory: Path, *, model_dir: Path, parse: Parse, global_batch: int, seed: int,
                 augment: Augment | None = None, batch_fn: BatchFn | None = None, window: int = 1024) -> None:
        self.directory, self.parse_record, self.window = Path(directory), parse, int(window)
        files = sorted(p for p in self.directory.glob("*.tfrecord*") if p.suffix in (".tfrecord", ".gz"))
        if not files:
            raise JobKitError(_no_shards(self.directory))
        gzipped = {p.suffix == ".gz" for p in files}
        if len(gzipped) > 1:
            raise JobKitError(f"{self.directory} mixes GZIP (.gz) and plain TFRecord files; keep one kind")
        self.compression = "GZIP" if gzipped.pop() else ""
        self.manifest = Path(model_dir) / MANIFEST
        self.shards = self._shards(files)
        if self.window < 1:
            raise JobKitError(f"window is {window}; expected at least 1 record")
        super().__init__(examples=sum(s.records for s in self.shards), global_batch=global_batch, seed=seed,
                         augment=augment, batch_fn=batch_fn, what=f"{self.directory} ({len(files)} files)")
        self._names = tf.constant([str(self.directory / s.name) for s in self.shards])
        self._counts = tf.constant([s.records for s in self.shards], tf.int64)

    def _shards(self, files: list[Path]) -> list[Shard]:
        found = [(p.name, p.stat().st_size) for p in files]
        if self.manifest.exists():  # learnt by an earlier attempt: the files must be the same
            recorded = [Shard(**s) for s in json.loads(self.manifest.read_text())["shards"]]
            check_same_shards(recorded, found, str(self.directory), str(self.manifest))
            return recorded
        shards = [Shard(p.name, p.stat().st_size, count_records(p, self.compression)) for p in files]
        empty = [s.name for s in shards if s.records == 0]
        if empty:
            raise JobKitError(f"{self.directory}: {', '.join(empty)} holds no record; remove the empty file(s) "
                              "or write them again")
        return shards

    def prepare(self, model_dir: Path, is_chief: bool) -> None:
        if is_chief and not self.manifest.exists():
            make_private_dirs(self.manifest.parent)  # before fit's own: 0700 as the kit makes model dirs
            write_json_atomically(self.manifest, {"directory": str(self.directory), "compression": self.compression,
                                                  "shards": [vars(s) for s in self.shards]})

    def how_it_resumes(self) -> str:
        if self.compression:
            # the file is read from its start to its window's first record, then the window up to the record
            most = max(s.records for s in self.shards) - 1 + self.window - 1
            return ("GZIP files cannot seek: the resume reads the file it falls in from its start up to its record; "
                    f"at most {most} records before it are read (the largest file's, and a window's)")
        return f"a seek to its file and record (headers only); at most {self.window} records before it are read"

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "window": self.window}

    def decode(self, raw: Any) -> Any:
        record, _, _ = raw  # the file and record number ride along for `find_unparsable`
        return self.parse_record(record)

    def find_unparsable(self, position: int, limit: int) -> JobKitError | None:
        """The first of `limit` records from global position `position` on that `parse` fails on, named
        by file and record (called after training failed with an input error); None if all parse."""
        examples = iter(self.examples_from(position).take(limit))
        while True:
            try:
                (record, file, number), _ = next(examples)
            except StopIteration:
                return None
            except tf.errors.DataLossError:  # the reader's, not parse's: a record that fails its checksum
                return self._find_corrupt(position)
            try:
                self.parse_record(record)
            except (tf.errors.InvalidArgumentError, tf.errors.DataLossError, ValueError) as err:
                return JobKitError(f"{self.directory / self.shards[int(file)].name}: record {int(number)} (0-based) "
                                   f"does not parse ({_reason(err)}); fix or remove that record, or the file")

    def _find_corrupt(self, position: int) -> JobKitError | None:
        """The first record the reader rejects (a bad checksum, a broken GZIP stream), read file by file
        in pass order from the file holding `position`'s window: named by file and record."""
        epoch, offset = self.batch.pass_and_offset(position)
        files = len(self.shards)
        order = [int(i) for i in self.permute(tf.range(files, dtype=tf.int64), tf.fill([files], epoch), files,
                                              PASS_STREAM).numpy()]
        first, _ = locate([self.shards[i].records for i in order], offset - offset % self.window)
        for index in order[first:]:
            path, count = self.directory / self.shards[index].name, 0
            try:
                for _ in tf.data.TFRecordDataset(str(path), self.compression):
                    count += 1
            except tf.errors.DataLossError as err:
                return JobKitError(f"{path}: record {count} (0-based) is corrupt ({_reason(err)}); "
                                   "write the file again, or remove it")
        return None

    def examples_from(self, position: int) -> tf.data.Dataset:
        epoch, offset = self.batch.pass_and_offset(position)
        window_start = offset - offset % self.window
        first = self._pass(tf.constant(epoch, tf.int64), tf.constant(window_start, tf.int64))
        first = first.skip(offset - window_start)  # records already in memory: at most a window
        later = tf.data.Dataset.range(epoch + 1, tf.int64.max).flat_map(
            lambda e: self._pass(e, tf.constant(0, tf.int64)))
        positions = tf.data.Dataset.range(position, tf.int64.max)
        return tf.data.Dataset.zip((first.concatenate(later), positions))

    def _pass(self, epoch: tf.Tensor, start: tf.Tensor) -> tf.data.Dataset:
        """Pass `epoch`'s records from offset `start` (a window's first) to its end."""
        files = tf.shape(self._counts, out_type=tf.int64)[0]
        order = self.permute(tf.range(files), tf.fill([files], epoch), files, PASS_STREAM)
        names, counts = tf.gather(self._names, order), tf.gather(self._counts, order)
        ends = tf.cumsum(counts)
        index = tf.searchsorted(ends, tf.reshape(start, [1]), side="right", out_type=tf.int64)[0]
        record = start - (ends[index] - counts[index])
        stream = self._file(names[index], order[index], record).concatenate(
            tf.data.Dataset.range(index + 1, files).flat_map(lambda i: self._file(names[i], order[i], 0)))
        windows = tf.data.Dataset.zip((stream.batch(self.window), tf.data.Dataset.range(start // self.window,
                                                                                          tf.int64.max)))

        def shuffled(records: tuple[tf.Tensor, ...], window: tf.Tensor) -> tuple[tf.Tensor, ...]:
            size = tf.shape(records[0], out_type=tf.int64)[0]
            seed = tf.stack([tf.constant(self.seed, tf.int64), epoch, WINDOW_STREAM + window])  # one draw per window
            where = tf.raw_ops.RandomIndexShuffle(index=tf.range(size), seed=seed, max_index=size - 1, rounds=4)
            return tuple(tf.gather(part, where) for part in records)

        return windows.map(shuffled).unbatch()

    def _file(self, name: tf.Tensor, file: tf.Tensor, first: tf.Tensor | int) -> tf.data.Dataset:
        """(record, file index, record number) of one file from record `first` on: the reader skips by headers."""
        records = tf.data.TFRecordDataset(tf.reshape(name, [1]), self.compression).skip(first)
        numbers = tf.data.Dataset.range(tf.cast(first, tf.int64), tf.int64.max)
        return tf.data.Dataset.zip((records, numbers)).map(lambda r, n: (r, file, n))


def _no_shards(directory: Path) -> str:
    """Why `directory` gave no shard, and the fix: it is missing, or its files are named otherwise."""
    if not directory.is_dir():
        return (f"{directory} has no *.tfrecord (or *.tfrecord.gz) file: it is not a directory; give the directory "
                "that holds the shards")
    others = sorted(p.name for p in directory.iterdir() if "tfrec" in p.name.lower())
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        return (f"{directory} has no *.tfrecord (or *.tfrecord.gz) file but {shown}; name the shards *.tfrecord "
                "(or *.tfrecord.gz when compressed)")
    return (f"{directory} has no *.tfrecord (or *.tfrecord.gz) file; write the shards there first "
            "(jobs/prepare_fashion_records.py)")


def _rewrite(path: Path, header: bytes, offset: int) -> str:
    """The fix for a file that is not whole: a GZIP file named as a plain one needs the name, not a rewrite."""
    if offset == 0 and header[:2] == _GZIP_MAGIC:
        return f"it starts as GZIP does: a compressed file is named {path.name}.gz (every file, or none)"
    return "write the file again"


def _reason(err: Exception) -> str:
    """TensorFlow's message without its function-node prefix and op suffix: the first line, at most 200 characters."""
    text = (getattr(err, "message", None) or str(err)).strip().splitlines()[0].split("}} ", 1)[-1]
    return re.sub(r"\s*\[Op:\w+\]( name:.*)?$", "", text)[:200].strip()
