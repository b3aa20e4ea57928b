"""Reuters newswire topics (46 classes) as keras ships them, with an offline fallback.

Order, as for MNIST: an explicit `reuters.npz` (keras' file: object arrays `x`, lists of
word indices, and `y`), keras' cache (~/.keras/datasets/reuters.npz), a bounded download,
then synthetic newswire-like sequences with a learnable topic signal. The file is read
exactly as `keras.datasets.reuters.load_data` reads it (same shuffle, same split, same
reserved indices), so the numbers match a notebook that used keras' loader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from launcher.jobkit.datasets import Split, _try_download

NUM_CLASSES = 46
# keras' reserved indices: 0 padding, 1 start of sequence, 2 out of vocabulary; words from 3.
START, OOV, INDEX_FROM = 1, 2, 3
KERAS_SEED, TEST_SPLIT = 113, 0.2
TRAIN_SIZE, TEST_SIZE = 8982, 2246  # Reuters' own split sizes


def load_reuters(path: Path | None = None, num_words: int = 10000,
                 download_timeout_s: float = 20.0) -> tuple[Split, Split]:
    """((x_train, y_train), (x_test, y_test)); x: object arrays of int lists (not padded)."""
    if path is not None:
        return reuters_from_npz(path, num_words)
    cached = Path.home() / ".keras" / "datasets" / "reuters.npz"
    if cached.exists():
        return reuters_from_npz(cached, num_words)

    def download() -> tuple[Split, Split]:
        import tf_keras as keras

        return keras.datasets.reuters.load_data(num_words=num_words)  # type: ignore[no-any-return]

    downloaded = _try_download(download_timeout_s, "Reuters", download)
    if downloaded is not None:
        return downloaded
    print(f"jobkit: Reuters not available (no --data file, no keras cache, download failed); "
          f"falling back to synthetic newswire-like sequences ({NUM_CLASSES} topics, {num_words}-word "
          "vocabulary, seeded); its accuracy says nothing about Reuters", flush=True)
    return synthetic_reuters(num_words)


def reuters_from_npz(path: Path, num_words: int) -> tuple[Split, Split]:
    """keras' `reuters.load_data(num_words=...)` applied to a local copy of its file."""
    # allow_pickle: keras stores the variable-length sequences as object arrays.
    with np.load(path, allow_pickle=True) as data:
        xs, labels = data["x"], data["y"]
    order = np.arange(len(xs))
    np.random.RandomState(KERAS_SEED).shuffle(order)
    xs, labels = xs[order], labels[order]
    sequences = [[START] + [w + INDEX_FROM for w in x] for x in xs]
    sequences = [[w if w < num_words else OOV for w in x] for x in sequences]
    cut = int(len(sequences) * (1 - TEST_SPLIT))
    return ((_object_array(sequences[:cut]), np.asarray(labels[:cut])),
            (_object_array(sequences[cut:]), np.asarray(labels[cut:])))


def synthetic_reuters(num_words: int = 10000, train_size: int = TRAIN_SIZE, test_size: int = TEST_SIZE,
                      seed: int = 46) -> tuple[Split, Split]:
    """Stories of 10-600 words: Zipf-distributed background words plus ~15% keywords of
    the story's topic (30 per topic). Topics are skewed like Reuters' (a few dominate).
    Seeded, so every worker of a run builds the same data (DATA sharding needs that)."""
    rng = np.random.default_rng(seed)
    first_word = START + INDEX_FROM  # keep 0-3 free, as keras does
    words = np.arange(first_word, num_words)
    background = 1.0 / np.arange(1, len(words) + 1)
    background /= background.sum()
    keywords = rng.choice(words, size=(NUM_CLASSES, 30))
    topic_p = 1.0 / np.arange(1, NUM_CLASSES + 1) ** 1.2
    topics = rng.choice(NUM_CLASSES, size=train_size + test_size, p=topic_p / topic_p.sum())
    lengths = np.clip(rng.lognormal(np.log(110), 0.7, size=len(topics)), 10, 600).astype(int)
    # Drawn all at once (one pass over the vocabulary's probabilities), then cut into stories.
    tokens = rng.choice(words, size=int(lengths.sum()), p=background)
    owner = np.repeat(topics, lengths)
    is_keyword = rng.random(len(tokens)) < 0.15
    tokens[is_keyword] = keywords[owner[is_keyword], rng.integers(0, keywords.shape[1], int(is_keyword.sum()))]
    stories = [[START, *story.tolist()] for story in np.split(tokens, np.cumsum(lengths)[:-1])]
    labels = topics.astype(np.int64)
    return ((_object_array(stories[:train_size]), labels[:train_size]),
            (_object_array(stories[train_size:]), labels[train_size:]))


def _object_array(sequences: list[list[int]]) -> np.ndarray:
    # np.array(list of lists) would build a 2-D array when all lengths happen to match.
    array = np.empty(len(sequences), dtype=object)
    array[:] = sequences
    return array
