"""Write Fashion-MNIST's training set as PNG-encoded tf.train.Examples in N TFRecord shards.

    python jobs/prepare_fashion_records.py --out /shared/fashion-records --shards 8
    tfl launch jobs/fashion_records.py --local 2 -- --records /shared/fashion-records

Offline: Debian's dataset-fashion-mnist (or --data, as jobs/mnist.py takes it). Each
example holds ``image`` (a 28x28 grey PNG) and ``label`` (int64); example i goes to shard
i mod N, so the shards differ in length by at most one. ``--gzip`` writes
``*.tfrecord.gz`` (a resume then reads its file up to the record: docs/input.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher import jobkit


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the directory to write the shards into (made)")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--limit", type=int, default=None, help="only the first N examples (tests)")
    parser.add_argument("--gzip", action="store_true", help="GZIP-compressed shards (*.tfrecord.gz)")
    parser.add_argument("--data", type=Path, default=None, help="as jobs/mnist.py's --data")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()  # before TensorFlow is imported: --help and a wrong option answer at once

jobkit.select_tf_keras()

import tensorflow as tf


def example(image: tf.Tensor, label: int) -> bytes:
    png = tf.io.encode_png(tf.reshape(image, (28, 28, 1))).numpy()
    features = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))}
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()  # type: ignore[no-any-return]


def main(args: argparse.Namespace) -> None:
    if args.shards < 1:
        raise SystemExit(f"--shards is {args.shards}; expected at least 1")
    (images, labels), _ = jobkit.load_mnist(args.data, dataset="fashion_mnist")
    count = min(len(images), args.limit or len(images))
    if args.shards > count:
        raise SystemExit(f"--shards {args.shards} is more than the {count} examples; every shard needs one")
    args.out.mkdir(parents=True, exist_ok=True)
    suffix, options = (".tfrecord.gz", tf.io.TFRecordOptions(compression_type="GZIP")) if args.gzip else (".tfrecord", None)
    writers = [tf.io.TFRecordWriter(str(args.out / f"train-{i:05d}-of-{args.shards:05d}{suffix}"), options)
               for i in range(args.shards)]
    try:
        for i in range(count):
            writers[i % args.shards].write(example(images[i], int(labels[i])))
    finally:
        for writer in writers:
            writer.close()
    print(f"wrote {count} examples in {args.shards} shards to {args.out}", flush=True)


if __name__ == "__main__":
    main(ARGS)
