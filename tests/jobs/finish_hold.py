"""A two-task MultiWorkerMirroredStrategy job that holds before `jobkit.finish` until the test says go.

    python tests/jobs/finish_hold.py DIR     # TF_CONFIG set; each training task writes DIR/ready-<task>,
                                             # then waits for DIR/go-<task> before jobkit.finish(strategy)

One all-reduce proves the group formed; the hold lets a test do something to the tasks
(stop one with SIGSTOP, as a loaded machine can) between the end of the work and the exit.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from launcher import jobkit

jobkit.select_tf_keras()

import tensorflow as tf  # noqa: E402 - after select_tf_keras


def main() -> None:
    directory = Path(sys.argv[1])
    context = jobkit.task_context()
    strategy = jobkit.make_strategy(context)
    total = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", tf.constant(1.0)))
    print(f"all-reduce: {float(strategy.experimental_local_results(total)[0])}", flush=True)
    task = f"{context.task_type}-{context.task_index}"
    (directory / f"ready-{task}").touch()
    while not (directory / f"go-{task}").exists():
        time.sleep(0.05)
    jobkit.finish(strategy)
    print("jobkit.finish returned: the slow way", flush=True)


if __name__ == "__main__":
    main()
