"""tf_keras' callback timing warning, kept for the callbacks it is about: the user's.

During the first batches of ``fit``, tf_keras times every batch hook and warns
``Callback method `on_train_batch_end` is slow compared to the batch time (…). Check your
callbacks.`` as soon as any callback it does not know of is in the list. The kit's own
callbacks are such, so every kit run takes the check, on a sample of five batches: on a busy
machine a context switch in a hook is enough, and the warning sends the user to look for
callbacks they never wrote. With no callback of the user's in the fit, the kit hides that
warning (a filter on TensorFlow's logger, for the fit only); with one, it stays, since it may
be theirs.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

SLOW_HOOK_WARNING = "is slow compared to the batch time"  # tf_keras.src.callbacks.CallbackList


class _KitHooksNotSlow(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Callback method `") and SLOW_HOOK_WARNING in message)


@contextlib.contextmanager
def kit_hook_timing_quiet(user_callbacks: Sequence[Any]) -> Iterator[None]:
    """Within it, tf_keras' slow-hook warning is hidden unless the user gave callbacks."""
    if user_callbacks:
        yield
        return
    logger, quiet = logging.getLogger("tensorflow"), _KitHooksNotSlow()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
