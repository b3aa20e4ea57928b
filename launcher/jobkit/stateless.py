"""An input function with a stateful random op is refused before training, in one line.

`augment` (and `batch_fn`) must be pure functions of the example and the seed the kit passes:
a stateful op (`tf.random.uniform`, `tf.image.random_flip_left_right`, a `tf.random.Generator`)
draws from a state that a restart does not restore, so the batches after a resume differ
from an uninterrupted run's without a word. The function is traced once (as tf.data will) and
its graph, nested functions included, searched for such ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from launcher.jobkit.context import JobKitError

STATEFUL_RANDOM = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal", "ParameterizedTruncatedNormal",
    "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2", "Multinomial", "RandomCrop",
    "RandomGammaGrad", "RngSkip", "RngReadAndSkip", "StatefulRandomBinomial", "StatefulStandardNormal",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulUniform", "StatefulUniformFullInt",
    "StatefulUniformInt",
})


def stateful_random_ops(function: Callable[..., Any], specs: Sequence[Any]) -> list[str]:
    """The stateful random op types in `function`'s graph, traced for arguments of `specs`."""
    graph = tf.function(function).get_concrete_function(*specs).graph.as_graph_def()
    ops = {node.op for node in graph.node} | {node.op for f in graph.library.function for node in f.node_def}
    return sorted(ops & STATEFUL_RANDOM)


def check_stateless(function: Callable[..., Any], name: str, specs: Sequence[Any]) -> None:
    found = stateful_random_ops(function, specs)
    if found:
        raise JobKitError(f"{name} uses stateful random ops ({', '.join(found)}), so its examples would differ after a "
                          "restart; use the stateless ones with the seed the kit passes (tf.random.stateless_*, "
                          "tf.image.stateless_random_*: docs/input.md)")
