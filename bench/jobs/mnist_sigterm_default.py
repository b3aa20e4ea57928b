"""jobs/mnist.py, except that SIGTERM gets its default action back once the strategy exists.

TensorFlow's preemption notifier takes over SIGTERM when MultiWorkerMirroredStrategy is
set up, so a TensorFlow task no longer dies of it. This wrapper measures what a job kit
that restores the default would give (§3 of docs/benchmarks.md); it changes nothing else.
"""

import runpy
import signal
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from launcher import jobkit  # noqa: E402
from launcher.jobkit import strategy  # noqa: E402


def make_strategy(*args: Any, **kwargs: Any) -> Any:
    made = strategy.make_strategy(*args, **kwargs)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return made


jobkit.make_strategy = make_strategy
sys.argv[0] = str(ROOT / "jobs" / "mnist.py")
runpy.run_path(sys.argv[0], run_name="__main__")
