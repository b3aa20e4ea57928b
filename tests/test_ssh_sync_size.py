"""A large `--sync` never sits in memory, on the launcher or on a host: the code's tarball is built
into a temp file once per launch and streamed to each host's agent, which spools it to disk before
unpacking. A 300 MB job dir took the launcher to 1.6 GB of RSS (the tarball, its base64, the JSON
request around it, its encoding), and each host's agent about as much; 63 MB now."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.describe.ports import free_port
from launcher.engines.ssh.node import agent_files
from tests.sshd import Sshd, cluster_file

BIG = 64 << 20  # random bytes: gzip cannot shrink them
JOB = """\
import hashlib, os
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "big.bin"), "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
peak = next(l for l in open("/proc/%d/status" % os.getppid()) if l.startswith("VmHWM:")).split()[1]
print("shipped", digest, "agent-peak-kb", peak, flush=True)
"""
# The launcher, with its own peak RSS said on stderr as it exits.
LAUNCHER = ("import resource, runpy, sys\ntry:\n    runpy.run_module('launcher', run_name='__main__')\nfinally:\n"
            "    print('launcher-peak-kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n")


def _launch(job_dir: Path, cluster: Path, env: dict[str, str]) -> tuple[int, list[tuple[str, int]]]:
    done = subprocess.run([sys.executable, "-c", LAUNCHER, "launch", str(job_dir / "job.py"), "--sync", str(job_dir),
                           "--cluster", str(cluster)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    launcher = int(done.stderr.rsplit("launcher-peak-kb ", 1)[1].split()[0])
    shipped = [(line.split()[-3], int(line.split()[-1])) for line in done.stdout.splitlines() if " shipped " in line]
    assert len(shipped) == 2, done.stdout
    return launcher, shipped


@pytest.mark.ssh
def test_a_large_sync_is_streamed_not_held_in_memory(sshd: Sshd, tmp_path: Path, tfl_home: Path,
                                                     child_env: dict[str, str]) -> None:
    small, large = tmp_path / "small", tmp_path / "large"
    for job_dir, content in ((small, b"tiny"), (large, None)):
        job_dir.mkdir()
        (job_dir / "job.py").write_text(JOB)
        with open(job_dir / "big.bin", "wb") as f:
            f.write(content if content is not None else os.urandom(BIG))
    tasks = {"chief": [f"127.0.0.2:{free_port()}"], "worker": [f"127.0.0.3:{free_port()}"]}
    cluster = cluster_file(tmp_path / "cluster.json", sshd, tasks, {"127.0.0.2": None, "127.0.0.3": None})
    base_launcher, base_hosts = _launch(small, cluster, child_env)
    launcher, hosts = _launch(large, cluster, child_env)
    digest = hashlib.sha256((large / "big.bin").read_bytes()).hexdigest()
    assert all(d == digest for d, _ in hosts)  # every host got the file whole
    # The file's size is 64 MiB (65536 KB): neither side may grow by half of it.
    assert launcher - base_launcher < BIG // 2048, (launcher, base_launcher)
    assert max(p for _, p in hosts) - max(p for _, p in base_hosts) < BIG // 2048, (hosts, base_hosts)


def test_the_agent_reads_exactly_a_streamed_archive_and_refuses_a_short_one(tmp_path: Path) -> None:
    import base64
    import io

    lines = [base64.b64encode(b"abc" * 10).decode() + "\n", base64.b64encode(b"xyz").decode() + "\n"]
    stream = io.StringIO("".join(lines) + '{"mode": "tasks"}\n')
    (item,) = agent_files.spool([{"dest": "/d", "lines": 2}], stream)
    with item["file"] as spooled:
        assert item["dest"] == "/d" and spooled.read() == b"abc" * 10 + b"xyz"
    assert stream.readline() == '{"mode": "tasks"}\n'  # the next request is left for the agent
    inline = {"dest": "/k", "data": "eA=="}
    assert agent_files.spool([inline], io.StringIO("")) == [inline]
    with pytest.raises(EOFError, match="ended early, after 33 bytes"):
        agent_files.spool([{"dest": "/d", "lines": 3}], io.StringIO("".join(lines)))
    bad = io.StringIO("QUJDR\n" + lines[1] + '{"mode": "tasks"}\n')
    with pytest.raises(ValueError):
        agent_files.spool([{"dest": "/d", "lines": 2}], bad)
    assert bad.readline() == '{"mode": "tasks"}\n'  # a bad line's archive is read to its end all the same
