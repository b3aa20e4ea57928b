"""The tiny task: reads TF_CONFIG, says when it started, sleeps, exits 0.

    python bench/jobs/tiny.py [--sleep SECONDS]

Its first line, ``tiny started=<unix time> task=<type:index>``, is how the benchmarks
tell when a task began running its own code. Only the standard library, so starting
it costs what starting Python costs.
"""

import json
import os
import sys
import time

started = time.time()
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
print(f"tiny started={started:.6f} task={task['type']}:{task['index']}", flush=True)
seconds = float(sys.argv[sys.argv.index("--sleep") + 1]) if "--sleep" in sys.argv else 0.5
time.sleep(seconds)
