"""A task that says it is up (``up TASK PID``), then idles until it is stopped: the large bed's job.

Only the standard library and no TensorFlow, so a task costs a Python interpreter and
nothing more; the default SIGTERM handling ends it at once when tfl stops the run.
"""

import os
import time

print("up", os.environ["TFL_TASK"], os.getpid(), flush=True)
while True:
    time.sleep(1)
