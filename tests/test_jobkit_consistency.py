"""Training tasks that restored different states stop at once, with one error naming them
(real TensorFlow, two local tasks under MultiWorkerMirroredStrategy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

JOB = """
from launcher import jobkit

jobkit.select_tf_keras()
from launcher.jobkit.consistency import check_restored

context = jobkit.task_context()
strategy = jobkit.make_strategy(context)
# As if the chief had found the backup of epoch 4 (step 10) and the worker none.
check_restored(strategy, context, (3, 9) if context.is_chief else (-1, -1), "/nfs/model/backup")
print("went on training", flush=True)
"""


def test_tasks_that_restored_different_states_stop_with_one_clear_error(tmp_path: Path, child_env: dict[str, str],
                                                                         tfl_home: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    result = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--local", "2"], env=child_env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    (run,) = (tfl_home / "runs").iterdir()
    expected = ("jobkit: training tasks restored different states: chief:0 on 127.0.0.1 the backup of epoch 4 step 10, "
                "worker:0 on 127.0.0.1 nothing (it would start afresh); they must all read one backup in /nfs/model/backup")
    for log in ("chief-0.log", "worker-0.log"):  # both, not a collective-op crash on one
        text = (run / "logs" / log).read_text()
        assert expected in text and "went on training" not in text, text[-2000:]
        assert text.rstrip().splitlines()[-1].startswith("launcher.jobkit.context.JobKitError: training tasks restored")
