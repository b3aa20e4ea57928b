"""Run a job script with every training task held at a chosen global step until the test says go.

    python tests/jobs/held.py JOB [JOB'S ARGUMENTS...]      # HELD_JOB_HOLD="STEP:DIR"

In attempt 0 (``TFL_ATTEMPT``), at the end of the first call of the train function whose
global step is STEP or more, each training task writes ``DIR/held-<task>`` (the step it holds
at, then a newline) and waits until ``DIR/go`` exists; later attempts are not held. The held
group trains no further (the others wait for it in their next collective), so a test that
interrupts it knows the step it interrupts at, whatever the machine's speed: no progress
record, no timer. The job itself runs unchanged: this wrapper only adds one callback to
``jobkit.fit`` (after the kit's own), then runs JOB as ``__main__``.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from launcher import jobkit

HOLD_VARIABLE = "HELD_JOB_HOLD"


def hold_callback(step: int, directory: Path, task: str) -> Any:
    import tf_keras as keras  # the job has selected tf_keras before importing TensorFlow

    from launcher.jobkit import notice, preemption

    class Hold(keras.callbacks.Callback):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self._held = False

        def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
            if self._held:
                return
            reached = int(self.model.optimizer.iterations.numpy())
            if reached < step:
                return
            self._held = True
            marker = directory / f"held-{task.replace(':', '-')}"
            marker.with_suffix(".tmp").write_text(f"{reached}\n")
            marker.with_suffix(".tmp").replace(marker)
            print(f"held: {task} holds at global step {reached} until {directory / 'go'} exists", flush=True)
            while not (directory / "go").exists():
                time.sleep(0.01)
            if notice.received():  # a notice came while held: go on once TensorFlow's handler has taken it in
                _until_the_handler_sees_the_notice(preemption)
            print(f"held: {task} goes on from global step {reached}", flush=True)

    return Hold()


def _until_the_handler_sees_the_notice(preemption: Any) -> None:
    """TensorFlow's PreemptionCheckpointHandler polls the kit's notice flag once a second, in a
    thread of its own that ends once it has seen the notice (and claimed it, or found a peer's
    claim); the step it agrees on is the next one after that. Held until then, the group agrees
    on a step right after the hold, however fast it trains."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        polls = [h._poll_termination_signal_thread for h in preemption._HANDLERS]  # TF 2.16-2.21
        if polls and not any(thread is not None and thread.is_alive() for thread in polls):
            return
        time.sleep(0.01)


def main() -> None:
    job, *arguments = sys.argv[1:]
    setting = os.environ.get(HOLD_VARIABLE, "")
    if setting and os.environ.get("TFL_ATTEMPT", "0") == "0":
        step, directory = setting.split(":", 1)
        task = os.environ.get("TFL_TASK", "single")
        fit = jobkit.fit

        def held_fit(*args: Any, callbacks: Any = (), **kwargs: Any) -> Any:
            return fit(*args, callbacks=[*callbacks, hold_callback(int(step), Path(directory), task)], **kwargs)

        jobkit.fit = held_fit  # type: ignore[attr-defined]  # jobs look it up at the call
    sys.argv = [job, *arguments]
    sys.path.insert(0, str(Path(job).resolve().parent))
    runpy.run_path(job, run_name="__main__")


if __name__ == "__main__":
    main()
