"""tfl's benchmark suite: `uv run python -m bench` regenerates docs/benchmarks.md.

Each measure lives in its own module and returns a ``Section`` (a table, a verdict
against the issue's target, notes); ``report`` renders them. Every figure is the median
of several repetitions with min and max; every comparison is a ratio taken within one
repetition, so a slow moment of the machine hits both sides alike.
"""
