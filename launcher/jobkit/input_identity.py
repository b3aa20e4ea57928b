"""What the addressed input was when the run began: a resume on another seed or other data is refused.

Example g of an addressed input is a pure function of (seed, data, g) (addressed.py). A resume
whose input has another seed, another number of examples, other arrays (`--dataset`, `--data`,
or the offline digits where the first attempt had MNIST) or, for TFRecord shards, another
window, reads another stream from the restored step on: the run is then neither the one it
began as nor the one it was relaunched as, and nothing said so. The chief keeps the input's
identity beside the run (``<model dir>/input.json``) when training starts afresh; an attempt
that restores a backup compares with it and refuses a change in one line naming the field.
The global batch is not part of it: an elastic run with ``--elastic-batch per-replica``
changes it on purpose (docs/input.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launcher.jobkit.context import JobKitError
from launcher.jobkit.layout import make_private_dirs, write_json_atomically

IDENTITY = "input.json"  # beside the run, in the model dir
_FIX = {
    "kind": "give fit the kind of input the run began with",
    "examples": "give the input the data the run began with",
    "data": "give the input the data the run began with (the same --dataset / --data)",
    "seed": "pass the seed the run began with",
    "window": "pass the window the run began with",
}


def check_same_input(model_dir: Path, identity: dict[str, Any], *, resuming: bool, is_chief: bool) -> None:
    """Refuse a resume whose input differs from the recorded one; record it when training starts afresh."""
    path = model_dir / IDENTITY
    recorded = json.loads(path.read_text()) if resuming and path.exists() else None
    if recorded is None:
        if is_chief:
            make_private_dirs(path.parent)  # before fit's own: the model dir is 0700 as the kit makes it
            write_json_atomically(path, identity)
        return
    changed = [field for field in identity if field in recorded and recorded[field] != identity[field]]
    if changed:
        field = changed[0]
        raise JobKitError(f"the input's {field} is {identity[field]!r} but this run began with {recorded[field]!r}, so "
                          f"the resume would train on other batches than the run's: {_FIX.get(field, 'change it back')}, "
                          f"or start a new run (another --model-dir; {path} records what the run began with)")
