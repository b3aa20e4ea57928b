"""`tfl rm` of an SSH run against a real sshd: the run's dirs on its hosts go; an unreachable
host is named, and the run's record stays (exit 1) until a `tfl rm` once the host is back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.describe.ports import free_port
from tests.sshd import NOWHERE, Sshd, cluster_file

pytestmark = pytest.mark.ssh

JOB = """\
import os
with open(os.path.join(os.environ["TFL_RUN_DIR"], "result.txt"), "w") as f:
    f.write("x" * 50000)
print("wrote", os.environ["TFL_TASK"], os.environ["TFL_RUN_DIR"], flush=True)
"""


def tfl(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True, timeout=120)


def test_rm_removes_the_runs_dirs_on_its_hosts(sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    workdirs = {"127.0.0.2": tmp_path / "w2", "127.0.0.3": tmp_path / "w3"}
    for w in workdirs.values():
        w.mkdir()
    tasks = {"chief": [f"127.0.0.2:{free_port()}"], "worker": [f"127.0.0.3:{free_port()}"]}
    cluster = cluster_file(tmp_path / "cluster.json", sshd, tasks, workdirs)
    # --keep-remote: the run's private dirs on the hosts outlive it, for `tfl rm` to remove.
    launched = tfl(["launch", str(job), "--cluster", str(cluster), "--keep-remote"], child_env)
    assert launched.returncode == 0, launched.stderr
    (run,) = [p.name for p in (tfl_home / "runs").iterdir()]
    wrote = dict(line.split()[-2:] for line in launched.stdout.splitlines() if " wrote " in line)
    there = {"127.0.0.2": Path(wrote["chief:0"]), "127.0.0.3": Path(wrote["worker:0"])}
    assert all((d / "result.txt").exists() for d in there.values())
    # The worker's host goes away before the run is removed.
    state = tfl_home / "runs" / run / "state.json"
    saved = state.read_text()
    record = json.loads(saved)
    record["plan"]["tasks"][1]["ssh"]["host"] = NOWHERE
    state.write_text(json.dumps(record))

    held = tfl(["rm", run], child_env)
    assert held.returncode == 1, held.stdout + held.stderr
    lines = held.stdout.splitlines()
    own = {host: next(p for p in (d, *d.parents) if p.name == run) for host, d in there.items()}  # the run's dir there
    assert lines[0].startswith(f"kept {run}: ") and f"`tfl rm {run}` again" in lines[0] and f"`tfl rm --force {run}`" in lines[0]
    assert lines[1].startswith("  left: 127.0.0.3: ") and lines[1].endswith(f"left {own['127.0.0.3']} there")
    assert lines[2].startswith(f"  removed: 127.0.0.2:{own['127.0.0.2']} (") and "KB)" in lines[2]
    assert lines[3].startswith("tfl: no run removed; 1 run(s) kept while their hosts still hold part of them")
    assert not there["127.0.0.2"].exists() and (there["127.0.0.3"] / "result.txt").exists()
    assert workdirs["127.0.0.2"].exists() and (workdirs["127.0.0.2"] / "job.py").exists()  # the user's workdir stays
    assert state.exists()  # the record stays: it is what finds the run's dir on the host once it is back
    assert tfl(["prune", "--keep", "0"], child_env).returncode == 1 and state.exists()  # prune keeps it as well

    state.write_text(saved)  # the host is back
    removed = tfl(["rm", run], child_env)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    lines = removed.stdout.splitlines()
    assert lines[0].startswith(f"removed {run} (") and f"and 127.0.0.3:{own['127.0.0.3']} (" in lines[0], lines
    assert lines[1].startswith("tfl: removed 1 run(s), ") and "KB on SSH hosts" in lines[1]
    assert not own["127.0.0.3"].exists() and not own["127.0.0.2"].exists()
    assert not (tfl_home / "runs" / run).exists()
