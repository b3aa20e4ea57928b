"""`tfl export k8s` of a large cluster: a pod's TF_CONFIG must fit in one environment variable.

Linux gives a process at most ``MAX_ARG_STRLEN`` (131072) bytes for one ``NAME=value`` of its
environment; a longer one makes ``execve`` fail with E2BIG. A pod's TF_CONFIG names every
task's DNS name, which is longer than a local run's address, so a cluster that `tfl launch`
runs could once be exported into pods whose job could never start (the shim's exec failed, exit
127, and JobSet restarted the group to no end of its restarts). These tests run the shim for real
on both sides of the limit.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.describe.fields import MAX_ENV_STRING
from launcher.describe.spec import parse_cluster
from launcher.engines.k8s import jobset
from launcher.engines.k8s.export import export_k8s
from launcher.engines.k8s.node import entry
from launcher.engines.k8s.pods import ExportOptions, Role, check_tf_config_size
from launcher.errors import ExportError

NAME = "mnist-1"
# The shim's job: exits 0 only if it started with the (long) TF_CONFIG the shim gave it.
PROBE = [sys.executable, "-c", "import os, sys; sys.exit(0 if len(os.environ['TF_CONFIG']) > 100_000 else 3)"]


def options(fmt: str = "jobset") -> ExportOptions:
    return ExportOptions(job="jobs/mnist.py", image="img:1", name=NAME, format=fmt)


def workers_cluster(workers: int) -> dict[str, Any]:
    return {"cluster": {"chief": ["c.example:2222"], "worker": [f"w{i}.example:2222" for i in range(workers)]}}


def roles(workers: int) -> list[Role]:
    return [Role("chief", 1, None), Role("worker", workers, None)]


def most_workers_that_fit() -> int:
    """The largest worker count the export takes under NAME (bisected on the check alone)."""
    low, high = 1, 10_000
    while low + 1 < high:
        mid = (low + high) // 2
        try:
            check_tf_config_size(jobset.pod_tf_configs(NAME, roles(mid)), "JobSet")
            low = mid
        except ExportError:
            high = mid
    return low


def run_shim(tmp_path: Path, config_map: dict[str, Any], role: str, index: int) -> subprocess.CompletedProcess[str]:
    """One pod's container command, as its ConfigMap volume and JobSet give it."""
    mount = tmp_path / f"etc-tfl-{index}"
    mount.mkdir()
    for key, text in config_map["data"].items():
        (mount / key).write_text(text)
    env = {"PATH": "/usr/bin:/bin", entry.ROLE_ENV: role, entry.INDEX_ENV: str(index)}
    return subprocess.run([sys.executable, str(mount / "entry.py"), "--", *PROBE], env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_limit_is_linuxs_one_environment_string() -> None:
    fits = "x" * (MAX_ENV_STRING - len("TF_CONFIG=") - 1)  # NAME=value and its NUL: MAX_ENV_STRING bytes
    assert subprocess.run(["true"], env={"TF_CONFIG": fits}).returncode == 0
    with pytest.raises(OSError) as info:
        subprocess.run(["true"], env={"TF_CONFIG": fits + "x"})
    assert info.value.errno == errno.E2BIG


def test_the_largest_exported_jobset_starts_and_one_worker_more_is_refused(tmp_path: Path) -> None:
    most = most_workers_that_fit()
    assert 2_000 < most < 5_000, most  # ~37 bytes a worker under this name: far fewer than a local run holds
    documents = export_k8s(parse_cluster(workers_cluster(most)), options()).documents
    started = run_shim(tmp_path, documents[0], "worker", most - 1)  # the longest TF_CONFIG: the last index
    assert started.returncode == 0, started.stderr[-500:]

    # One worker more: the ConfigMap it would have shipped gives a pod whose job cannot start...
    too_big = jobset.entry_config_map(options(), roles(most + 1))
    failed = run_shim(tmp_path, too_big, "worker", most)
    assert failed.returncode == 127 and "Argument list too long" in failed.stderr, failed.stderr[-500:]
    # ... so the export refuses it, naming the pod, the size and the fix.
    with pytest.raises(ExportError, match=r"^cluster: the JobSet pod of (chief:0|worker:\d+) would get a TF_CONFIG of "
                                          r"13\d{4} bytes, .* run fewer tasks, or give a shorter --name$"):
        export_k8s(parse_cluster(workers_cluster(most + 1)), options())


def test_tfjob_counts_the_operators_longer_tf_config() -> None:
    """The operator names each task ``<pod>.<namespace>.svc:2222`` and lists the evaluator in every
    task's cluster, so a TFJob fits fewer workers than a JobSet under the same name."""
    most = most_workers_that_fit()
    with pytest.raises(ExportError, match=r"^cluster: the TFJob pod of .* would get a TF_CONFIG of \d+ bytes"):
        export_k8s(parse_cluster(workers_cluster(most)), options("tfjob"))


def test_cli_refuses_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_text(json.dumps(workers_cluster(5_000)))
    out = tmp_path / "out.yaml"
    result = CliRunner().invoke(app, ["export", "k8s", "jobs/mnist.py", "-c", str(path), "--image", "img:1",
                                      "--name", NAME, "-o", str(out)])
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1 and "would get a TF_CONFIG of" in result.stderr
    assert result.stdout == "" and not out.exists()
