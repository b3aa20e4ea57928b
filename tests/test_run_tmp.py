"""Each run's tasks get a private temp dir of the run's own (``launcher/engines/ssh/node/agent_tmp.py``), as
Slurm's job_container/tmpfs gives each job: ``TMPDIR`` (and ``TEMP``, ``TMP``) is a 0700 dir with a random name
inside the host's temp dir, and it goes with the run. Before, every task wrote to the shared /tmp, and what a
task killed with SIGKILL wrote there (autograph's generated modules, ``__pycache__``, the job's own files) stayed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.engines.ray.node import runner
from launcher.engines.ssh.node import agent_tmp
from tests.procs import pid_alive
from tests.ray_cluster import RayCluster, task_runners
from tests.sshd import Sshd
from tests.test_ray import description
from tests.test_ssh import only_run, tfl, two_hosts, wait_for, write_job

# Each task says where its temp dir is and its mode, writes a file there (and a __pycache__ dir, as
# autograph's modules get); then, once the worker has, the chief is killed with SIGKILL, or (argv[2] "wait") both wait to be stopped.
JOB = """
    import json, os, signal, sys, tempfile, time
    where = tempfile.gettempdir()
    os.makedirs(os.path.join(where, "__pycache__"), exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=where, prefix="__autograph_generated_file", suffix=".py", delete=False) as f:
        f.write("x = 1\\n")
    report = {"task": os.environ["TFL_TASK"], "attempt": os.environ["TFL_ATTEMPT"], "tmp": where,
              "mode": oct(os.stat(where).st_mode & 0o777), "vars": [os.environ.get(v) for v in ("TEMP", "TMP")]}
    with open(os.path.join(sys.argv[1], os.environ["TFL_TASK"] + "-" + os.environ["TFL_ATTEMPT"]), "w") as out:
        json.dump(report, out)
    if os.environ["TFL_ATTEMPT"] == "0" and sys.argv[2] == "wait":
        time.sleep(600)
    elif os.environ["TFL_ATTEMPT"] == "0" and os.environ["TFL_TASK"] == "chief:0":
        while not os.path.exists(os.path.join(sys.argv[1], "worker:0-0")):  # the worker has written its file
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        time.sleep(600 if os.environ["TFL_ATTEMPT"] == "0" else 0)
"""


def reports(directory: Path, count: int) -> list[dict[str, Any]]:
    wait_for(lambda: len(list(directory.iterdir())) >= count, timeout=120)
    found = []
    for path in sorted(directory.iterdir()):
        wait_for(lambda p=path: p.stat().st_size > 0)
        found.append(json.loads(path.read_text()))
    return found


def assert_private(found: list[dict[str, Any]], parent: Path) -> str:
    """Every task had the same 0700 dir of the run's own inside ``parent`` as every temp dir variable."""
    dirs = {r["tmp"] for r in found}
    assert len(dirs) == 1, found
    (where,) = dirs
    assert Path(where).parent == parent and Path(where).name.startswith(agent_tmp.PREFIX), found
    assert {r["mode"] for r in found} == {"0o700"}, found
    assert all(r["vars"] == [where, where] for r in found), found
    return str(where)


@pytest.fixture
def host_tmp(tmp_path: Path) -> Path:
    """The test's own host temp dir, so that what is left in it can be listed."""
    parent = tmp_path / "host-tmp"
    parent.mkdir(mode=0o700)
    return parent


def test_a_local_task_killed_with_sigkill_leaves_nothing_in_the_hosts_temp_dir(host_tmp: Path, tmp_path: Path,
                                                                             child_env: dict[str, str]) -> None:
    out = tmp_path / "reports"
    out.mkdir()
    job = write_job(tmp_path / "src", JOB)
    result = tfl(["launch", str(job), "--local", "2", "--", str(out), "kill"], {**child_env, "TMPDIR": str(host_tmp)},
                 timeout=180)
    assert result.returncode != 0 and "chief:0" in result.stderr, result.stderr[-3000:]
    assert_private(reports(out, 2), host_tmp)
    assert sorted(p.name for p in host_tmp.iterdir()) == []  # the file, __pycache__ and the dir itself: gone


def test_a_stop_after_the_launcher_was_killed_removes_it_and_a_resume_makes_a_new_one_there(
        host_tmp: Path, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    out = tmp_path / "reports"
    out.mkdir()
    job = write_job(tmp_path / "src", JOB)
    env = {**child_env, "TMPDIR": str(host_tmp)}
    result = tfl(["launch", str(job), "--local", "2", "--detach", "--", str(out), "wait"], env, timeout=120)
    assert result.returncode == 0, result.stderr
    run = only_run(tfl_home)
    where = assert_private(reports(out, 2), host_tmp)
    launcher = int(json.loads((tfl_home / "runs" / run / "state.json").read_text())["launcher_pid"])
    os.kill(launcher, signal.SIGKILL)
    wait_for(lambda: not pid_alive(launcher))
    assert Path(where).is_dir()  # nothing removed it yet: the launcher that would have is gone
    stopped = tfl(["stop", run], env)
    assert stopped.returncode == 0 and "left by a launcher that was gone" in stopped.stdout, stopped.stdout + stopped.stderr
    assert sorted(p.name for p in host_tmp.iterdir()) == []
    # resumed from a terminal with another TMPDIR: the run's dir is made where its tasks had it, and goes again
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    resumed = tfl(["resume", run], {**env, "TMPDIR": str(elsewhere)}, timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_private([r for r in reports(out, 4) if r["attempt"] != "0"], host_tmp)
    assert sorted(p.name for p in host_tmp.iterdir()) == [] and sorted(p.name for p in elsewhere.iterdir()) == []


def launch_on_hosts(sshd: Sshd, host_tmp: Path, tmp_path: Path, tfl_home: Path, child_env: dict[str, str], mode: str,
                    *options: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``JOB`` in ``mode`` on the two test hosts, with ``host_tmp`` as the TMPDIR the cluster file gives; the
    launch's result and the dir the tasks report into."""
    out = tmp_path / "reports"
    out.mkdir(mode=0o777)
    job = write_job(tmp_path / "src", JOB)
    cluster = two_hosts(tmp_path, sshd, tfl_home, env={"TMPDIR": str(host_tmp)})
    return tfl(["launch", str(job), "--cluster", str(cluster), *options, "--", str(out), mode], child_env, timeout=180), out


@pytest.mark.ssh
def test_on_ssh_hosts_a_task_killed_with_sigkill_leaves_nothing_in_their_temp_dir(
        sshd: Sshd, host_tmp: Path, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """The cluster file's TMPDIR is the parent on the hosts (the hosts' login TMPDIR is not this test's to set)."""
    result, out = launch_on_hosts(sshd, host_tmp, tmp_path, tfl_home, child_env, "kill")
    assert result.returncode != 0 and "chief:0" in result.stderr, result.stderr[-3000:]
    found = reports(out, 2)
    assert {r["mode"] for r in found} == {"0o700"}, found
    for report in found:  # one dir per host, each the run's own, in the given parent
        assert Path(report["tmp"]).parent == host_tmp and report["vars"] == [report["tmp"]] * 2, found
    assert Path(found[0]["tmp"]).name.startswith(f"{agent_tmp.PREFIX}{only_run(tfl_home)}-"), found
    wait_for(lambda: sorted(p.name for p in host_tmp.iterdir()) == [], timeout=30)  # the agents' sessions end
    # what an agent killed with -9 there would have left: `tfl rm` has the host's agent remove it
    left = Path(agent_tmp.make(only_run(tfl_home), str(host_tmp)))
    (left / "mine.txt").write_text("x")
    removed = tfl(["rm", only_run(tfl_home)], child_env)
    assert removed.returncode == 0 and f":{left} " in removed.stdout, removed.stdout + removed.stderr
    assert sorted(p.name for p in host_tmp.iterdir()) == []


@pytest.mark.ssh
def test_on_ssh_hosts_the_agents_remove_it_when_the_launcher_is_killed(
        sshd: Sshd, host_tmp: Path, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    result, out = launch_on_hosts(sshd, host_tmp, tmp_path, tfl_home, child_env, "wait", "--detach")
    assert result.returncode == 0, result.stderr
    run = only_run(tfl_home)
    found = reports(out, 2)
    assert len(list(host_tmp.iterdir())) == 2 and {r["mode"] for r in found} == {"0o700"}, found
    launcher = int(json.loads((tfl_home / "runs" / run / "state.json").read_text())["launcher_pid"])
    os.kill(launcher, signal.SIGKILL)
    wait_for(lambda: sorted(p.name for p in host_tmp.iterdir()) == [], timeout=60)  # each agent lost the launcher
    stopped = tfl(["stop", run], child_env)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.mark.ray
def test_on_ray_a_task_killed_with_sigkill_leaves_nothing_in_its_nodes_temp_dir(
        ray_cluster: RayCluster, host_tmp: Path, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """A task's runner (its actor) outlives the task and removes the dir at the run's end; all nodes are this machine."""
    out = tmp_path / "reports"
    out.mkdir()
    job = write_job(tmp_path / "src", JOB)
    path = description(tmp_path, ray_cluster.address, env={"TMPDIR": str(host_tmp)}, workers=1)
    result = tfl(["launch", str(job), "--cluster", str(path), "--", str(out), "kill"], child_env, timeout=300)
    assert result.returncode != 0 and "chief:0" in result.stderr, result.stderr[-3000:]
    found = reports(out, 2)
    assert {r["mode"] for r in found} == {"0o700"} and len({r["tmp"] for r in found}) == 2, found  # one per task
    for report in found:
        assert Path(report["tmp"]).parent == host_tmp and report["vars"] == [report["tmp"]] * 2, found
        assert Path(report["tmp"]).name.startswith(f"{agent_tmp.PREFIX}{only_run(tfl_home)}-"), found
    wait_for(lambda: sorted(p.name for p in host_tmp.iterdir()) == [], timeout=60)
    deadline = time.monotonic() + 60  # a hang guard: a killed actor's process exits within a second or two
    while task_runners(ray_cluster) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not task_runners(ray_cluster)


def test_the_ray_runner_spells_the_prefix_as_the_agent_does() -> None:
    assert runner.TMP_PREFIX == agent_tmp.PREFIX and runner.TMP_VARS == agent_tmp.VARS


def test_removal_takes_only_the_runs_own_dirs_and_never_follows_a_link(tmp_path: Path) -> None:
    parent, target = tmp_path / "tmp", tmp_path / "target"
    parent.mkdir()
    target.mkdir()
    (target / "keep").write_text("not the run's")
    ours = Path(agent_tmp.make("job-1", str(parent)))
    (ours / "sub").mkdir()
    (ours / "sub" / "file").write_text("x")
    others = [Path(agent_tmp.make("job-1-b", str(parent))), Path(agent_tmp.make("job-2", str(parent)))]
    link = parent / f"{agent_tmp.PREFIX}job-1-abcdefgh"
    link.symlink_to(target)
    assert oct(ours.stat().st_mode & 0o777) == "0o700"
    removed = agent_tmp.remove("job-1", str(parent))
    assert list(removed) == [str(ours)] and removed[str(ours)] > 0
    assert not ours.exists() and all(p.is_dir() for p in others) and (target / "keep").exists() and link.is_symlink()
    assert agent_tmp.remove("job-1", str(parent)) == {}  # twice is fine
    # a resumed run's recorded TMPDIR is one of its own: its parent is where the next one goes
    assert agent_tmp.parent_of({"TMPDIR": str(others[1])}, "job-2") == str(parent)
    assert agent_tmp.parent_of({"TMPDIR": "/scratch/me"}, "job-2") == "/scratch/me"
    assert agent_tmp.parent_of({}, "job-2") is None


def test_a_session_removes_only_the_dir_it_made(host_tmp: Path) -> None:
    """After a resize the launcher ends the hosts' sessions and starts new ones: an old session that
    ended after the new one had made its dir removed every dir of the run there, the new one's
    too, and the next attempt's autograph then found no temp dir (tests/test_elastic_tf.py failed in CI)."""
    request = {"env": {"TFL_RUN_ID": "r1", "TMPDIR": str(host_tmp)}}
    old, new = agent_tmp.RunTmp(), agent_tmp.RunTmp()
    old_dir = old.task(request)["env"]["TMPDIR"]
    new_dir = new.task(request)["env"]["TMPDIR"]
    assert old_dir != new_dir and Path(old_dir).parent == Path(new_dir).parent == host_tmp
    old.remove()
    assert not Path(old_dir).exists() and Path(new_dir).is_dir()
    new.remove()
    assert sorted(host_tmp.iterdir()) == []
