"""The job's output file that slurmstepd makes in the run dir (``slurm/batch-<id>.out``, the batch script's
stdout and stderr) is 0600 like every other file there: Slurm makes it under the submitter's umask, before
the script's own ``umask 077`` runs, and a user's usual 022 made it 0644."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.slurm_cluster import SlurmCluster
from tests.test_slurm_runs import assert_all_gone, description, job_id_of, only_run, sleeper

pytestmark = pytest.mark.slurm


def test_the_batch_output_is_0600_under_the_users_umask_022(slurm_cluster: SlurmCluster, tfl_home: Path,
                                                           tmp_path: Path) -> None:
    env = {**slurm_cluster.env, "TFL_HOME": str(tfl_home), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "launcher", "launch", sleeper(tmp_path), "--cluster",
                           str(description(tmp_path)), "--", "ok", "0"], env=env, capture_output=True, text=True,
                          timeout=300, cwd=ROOT, preexec_fn=lambda: os.umask(0o022))  # the usual umask, not the test's
    assert done.returncode == 0, done.stderr[-3000:]
    run = only_run(tfl_home)
    job_id = job_id_of(run)
    output = run / "slurm" / f"batch-{job_id}.out"
    assert output.exists(), sorted(p.name for p in (run / "slurm").iterdir())
    assert stat.S_IMODE(output.stat().st_mode) == 0o600
    assert_all_gone(slurm_cluster, job_id)
