"""Views: how a run is shown: ``status`` (record + engine inspect), ``report`` (text), ``logs`` (following
task logs), ``noise`` and ``fold`` (what the console hides or folds), ``tensorboard``."""
