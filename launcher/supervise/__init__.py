"""Supervise: the run's state machine (``supervisor``) and its policies: restarts and stalls (``supervisor``),
preemption (``preemption``), elastic resizes (``elastic``); what it writes into the record (``recording``); the
wake-up pipe (``waker``). It drives an engine through ``launcher.engines.base`` and never asks which one it holds."""
