"""A Ray cluster stopped under a running launch (`ray stop`, the head's machine rebooted).

The run's failure was recorded at once, but the launcher's clean-up then asked the GCS, gone with
the cluster, to remove the placement group: Ray's call blocked for 60 s and then ended the process
with its own C++ error ("Failed to connect to GCS within 60 seconds ... The program will terminate"),
so the user never saw the run's summary. Its resume then said to "fix ray.address in the description",
which a resume does not read. The test has a cluster of its own (three nodes): it stops
it whole, which the module cluster of tests/test_ray.py must outlive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ray_cluster import ENV, TEST_SYSTEM_CONFIG, start_ray_cluster, stop_ray_cluster
from tests.test_ray import description, tiny_job
from tests.test_ssh import only_run, wait_for

pytestmark = pytest.mark.ray


def test_a_cluster_stopped_under_a_run_ends_it_with_its_summary(tmp_path: Path, tfl_home: Path,
                                                                  child_env: dict[str, str]) -> None:
    saved = dict(os.environ)
    os.environ.update(ENV)  # before Ray is imported, as the ray_cluster fixture does
    try:
        if os.environ.get("CI") != "true":
            pytest.importorskip("ray")
        found = start_ray_cluster(nodes=3, system_config=TEST_SYSTEM_CONFIG)
    except BaseException:
        os.environ.clear()
        os.environ.update(saved)
        raise
    left: list[int] | None = None
    launch = None
    address = ""
    try:
        address = found.address  # None once the cluster is shut down
        path = description(tmp_path, address, workers=1)
        launch = subprocess.Popen([sys.executable, "-m", "launcher", "launch", tiny_job(tmp_path), "--cluster", str(path),
                                   "--", "600"], env={**child_env, **ENV}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        logs = tfl_home / "runs"
        wait_for(lambda: logs.exists() and len(list(logs.glob("*/logs/*.log"))) == 2
                 and all("TF_CONFIG" in log.read_text() for log in logs.glob("*/logs/*.log")), timeout=240)
        left = stop_ray_cluster(found)
        out, err = launch.communicate(timeout=300)  # a hang guard: Ray's own end of the process came at 60 s
    finally:
        if launch is not None and launch.poll() is None:
            launch.kill()
            launch.communicate()
        if left is None:
            left = stop_ray_cluster(found)
        os.environ.clear()
        os.environ.update(saved)
    assert left == [], f"Ray processes left after the cluster's shutdown (killed now): {left}"
    run = only_run(tfl_home)
    assert "Failed to connect to GCS" not in err, err[-3000:]
    assert launch.returncode == 1 and f"tfl: run {run} failed after" in err and "its Ray actor died" in err, err[-3000:]
    assert json.loads((tfl_home / "runs" / run / "state.json").read_text())["state"] == "failed"
    # A resume reaches the cluster at the address the run recorded (fixing the description would change nothing),
    # or at the one --address gives.
    resumed = subprocess.run([sys.executable, "-m", "launcher", "resume", run], env={**child_env, **ENV}, capture_output=True,
                             text=True, timeout=120)
    assert resumed.returncode == 2 and resumed.stderr.strip() == (
        f"tfl: error: ray.address {address}: nothing answers at {address} (Connection refused); start the run's "
        f"cluster there again (`ray start --head`), or give its new address: `tfl resume {run} --address HOST:PORT`"), \
        resumed.stderr[-3000:]
