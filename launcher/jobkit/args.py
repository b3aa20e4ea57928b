"""The command-line options every job shares, so job scripts list only their own."""

from __future__ import annotations

import argparse
from pathlib import Path

from launcher.jobkit.execution import LR_SCALINGS


def job_arguments(description: str, *, batch_size: int, data_help: str = "the job's data: a file or a directory",
                  backups: bool = True) -> argparse.ArgumentParser:
    """A parser with the common options; a job adds its own and calls ``parse_args()``. Every option's
    help says its default."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=3, help="default: 3")
    parser.add_argument("--batch-size", type=_count, default=batch_size, help=f"per replica (default: {batch_size})")
    parser.add_argument("--steps-per-epoch", type=_count, default=None, help="default: the whole training set once per epoch")
    parser.add_argument("--model-dir", type=Path, default=None, help="default: $TFL_RUN_DIR/model, else a new temp dir")
    parser.add_argument("--data", type=Path, default=None, help=f"{data_help} (default: none: the job finds or makes its data)")
    if backups:
        parser.add_argument("--backup-every-steps", type=_count, default=None,
                            help="back up training state every N steps (default: every epoch)")
    parser.add_argument("--steps-per-execution", type=_count, default=None,
                        help="training steps per call of the train function; progress is recorded once per call "
                             "(default: chosen from the measured step time, about 0.2 s per call)")
    parser.add_argument("--seed", type=int, default=42, help="default: 42")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="for one replica's batch (default: 0.001)")
    parser.add_argument("--lr-scaling", choices=LR_SCALINGS, default="none",
                        help="linear: multiply the learning rate by the number of replicas (the global batch grows with them; "
                             "default: none)")
    parser.add_argument("--warmup-epochs", type=float, default=0.0,
                        help="with --lr-scaling linear: climb from the one-replica rate to the scaled one over N epochs "
                             "(default: 0, no warm-up)")
    parser.add_argument("--eval-idle-timeout", type=float, default=600.0,
                        help="evaluator: give up after this many seconds with no new checkpoint and no sign of "
                             "training (0: never; default: 600)")
    parser.add_argument("--virtual-devices", type=_count, default=None,
                        help="split this machine's GPU (or CPU) into N logical devices (default: tfl's setting)")
    return parser


def _count(text: str) -> int:
    """An option that counts (a batch, steps, devices): a whole number of 1 or more, refused as the
    options are parsed, before TensorFlow starts, rather than as a ZeroDivisionError after it."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (give 1 or more)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value
