"""The dirs a run has on an SSH host are 0700, as docs/ssh.md says, whatever the login's umask:
the progress dir was made by the agent with the umask's mode (0755 under sshd's usual 022)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.describe.ports import free_port
from tests.sshd import Sshd, cluster_file
from tests.test_ssh import tfl, write_job

pytestmark = pytest.mark.ssh

MODES_JOB = """
    import json, os, stat
    run_dir, progress = os.environ["TFL_RUN_DIR"], os.path.dirname(os.environ["TFL_PROGRESS_FILE"])
    dirs = {"run dir": run_dir, "kit": os.path.join(run_dir, "kit"), "code": os.getcwd(), "progress": progress}
    print("modes", json.dumps({k: oct(stat.S_IMODE(os.stat(p).st_mode)) for k, p in dirs.items()}), flush=True)
"""


def test_the_run_s_dirs_on_a_host_are_private(sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    job = write_job(tmp_path / "src", MODES_JOB)
    cluster = cluster_file(tmp_path / "cluster.json", sshd, {"chief": [f"127.0.0.2:{free_port()}"]}, {"127.0.0.2": None})
    result = tfl(["launch", str(job), "--cluster", str(cluster)], child_env)
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if " modes " in x)
    modes = json.loads(line.split(" modes ", 1)[1])
    assert modes == {"run dir": "0o700", "kit": "0o700", "code": "0o700", "progress": "0o700"}, modes
