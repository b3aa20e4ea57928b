"""A local task whose host names another python (``hosts.localhost.python``) that has no tfl:
its tasks get the job kit on PYTHONPATH as an SSH host's do, and ``tfl doctor`` checks that
python (issue 26). The python here is a bare venv: no tfl, no TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.describe.spec import parse_cluster
from launcher.plan.build import build_plan
from tests.procs import tfl_processes

JOB = """\
import os
import launcher
from launcher import contract, jobkit
print("kit from", launcher.__file__, "task", jobkit.task_context().label, flush=True)
"""


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = str(venv / "bin" / "python")
    cannot = subprocess.run([python, "-c", "import launcher"], capture_output=True, text=True, cwd="/", timeout=60)
    assert cannot.returncode == 1 and "No module named 'launcher'" in cannot.stderr  # the premise: it lacks tfl
    return python


def cluster_file(tmp_path: Path, python: str) -> Path:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"cluster": {"chief": ["localhost:23470"], "worker": ["localhost:23471"]},
                                "hosts": {"localhost": {"python": python}}}))
    return path


def test_the_plan_puts_the_kit_first_on_the_path_only_for_another_python() -> None:
    spec = {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]}}
    own = build_plan(parse_cluster(spec), "/j.py", (), run_id="r", run_dir="/runs/r", python="/tfl/python", cwd="/c")
    assert all(t.kit is None and "PYTHONPATH" not in t.env for t in own.tasks)
    other = build_plan(parse_cluster({**spec, "hosts": {"localhost": {"python": "/venv/bin/python"}}}), "/j.py", (),
                       run_id="r", run_dir="/runs/r", python="/tfl/python", cwd="/c")
    assert [(t.kit, t.env["PYTHONPATH"], t.argv[0]) for t in other.tasks] == [("/runs/r/kit", "/runs/r/kit", "/venv/bin/python")] * 2
    assert type(other).from_dict(other.to_dict()) == other  # recorded: a resume copies the kit again


def test_tasks_under_a_python_without_tfl_import_the_kit(bare_python: str, tmp_path: Path, child_env: dict[str, str],
                                                        tfl_home: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    done = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--cluster",
                           str(cluster_file(tmp_path, bare_python))], env=child_env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    (run,) = (tfl_home / "runs").iterdir()
    for task in ("chief-0", "worker-0"):
        log = (run / "logs" / f"{task}.log").read_text()
        assert f"kit from {run}/kit/launcher/__init__.py task {task.replace('-', ':')}" in log, log
    assert oct((run / "kit").stat().st_mode & 0o777) == "0o700"
    assert tfl_processes(home=str(tfl_home)) == []


def test_doctor_checks_that_python_kit_and_packages(bare_python: str, tmp_path: Path, child_env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "launcher", "doctor", "--cluster", str(cluster_file(tmp_path, bare_python)),
                           "--json"], env=child_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert checks["job kit"]["status"] == "ok", checks["job kit"]  # the kit imports there from the copy
    assert checks["packages"]["status"] == "fail" and f"tensorflow is not installed for {bare_python}" in checks["packages"]["detail"]
