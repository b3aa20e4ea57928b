"""Records: what a run leaves on disk and reads back from any terminal: the run store and its dataclasses
(``store``), the index of runs (``index``), task and run states (``states``), process identity (``identity``). The
lowest stage: engines, the supervisor and the views all read records."""
