"""Runs: what a command does to a run, one core call each: ``launch`` (plan, prepare, supervise; detach),
``resume``, ``stop`` (and ``tfl logs``), ``prune`` (``tfl rm``/``prune``)."""
