"""Multi-host runs as a real cluster has them: hosts with networks of their own (``tests.netbed``:
a network namespace, an address on a private bridge and an sshd each), their own disks and a
Python that has TensorFlow but not tfl (``tests.hostenv``).

Each host has its own HOME, so its per-user run dirs are its own; only what a test names as
shared storage is seen by both. The ``tfl_home`` fixture proves at the
end of each test that no task of its runs is left alive, on any host.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.describe.ports import free_port
from tests.conftest import ROOT
from tests.hostenv import host_python
from tests.jobkit_helpers import FASHION_RECORDS_JOB, HELD_JOB, Hold, assert_trained_on_the_shards
from tests.netbed import NetBed
from tests.procs import pid_alive, tfl_processes
from tests.sshd import cluster_file, start_sshd, stop_sshd
from tests.test_ssh import only_run, tfl, write_job

pytestmark = pytest.mark.ssh
MNIST = str(ROOT / "jobs" / "mnist.py")
EPOCH = re.compile(r"^epoch (\d+)/\d+ loss=", re.M)
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2"}


@pytest.fixture(scope="session")
def hostenv() -> Path:
    return host_python("hostenv")


def cluster(tmp_path: Path, bed: NetBed, python: str | Path, workdirs: dict[str, Path | None] | None = None,
            evaluator: str | None = None, **extra: Any) -> Path:
    """The chief on the bed's first host, a worker on its second."""
    CHIEF_HOST, WORKER_HOST = bed.addresses[:2]
    tasks = {"chief": [f"{CHIEF_HOST}:{free_port()}"], "worker": [f"{WORKER_HOST}:{free_port()}"]}
    if evaluator:
        tasks["evaluator"] = [f"{evaluator}:{free_port()}"]
    workdirs = workdirs or {CHIEF_HOST: None, WORKER_HOST: None}  # the default: each host's own private run dir
    return cluster_file(tmp_path / "cluster.json", bed, tasks, workdirs, python=python, **extra)


def run_dir_on(bed: NetBed, host: str, run: str) -> Path:
    return bed.home(host) / ".cache" / "tfl" / "runs" / run / host


def epochs_after_restart(log: str) -> list[int]:
    return [int(e) for e in EPOCH.findall(log.split("--- tfl: attempt 1")[1])]


@pytest.mark.slow
def test_the_main_job_trains_over_two_hosts_with_default_settings(netbed: NetBed, tmp_path: Path, tfl_home: Path,
                                                                 child_env: dict[str, str], hostenv: Path) -> None:
    CHIEF_HOST, WORKER_HOST = netbed.addresses[:2]
    result = tfl(["launch", MNIST, "--cluster", str(cluster(tmp_path, netbed, hostenv, env=QUIET)), "--",
                  "--epochs", "2", "--steps-per-epoch", "5", "--batch-size", "32"], child_env, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tfl_home)
    logs = tfl_home / "runs" / run / "logs"
    chief_dir, worker_dir = run_dir_on(netbed, CHIEF_HOST, run), run_dir_on(netbed, WORKER_HOST, run)
    for log in ("chief-0.log", "worker-0.log"):
        assert [int(e) for e in EPOCH.findall((logs / log).read_text())] == [1, 2]
    assert f"jobkit: model dir {chief_dir / 'model'}" in (logs / "chief-0.log").read_text()
    assert list((chief_dir / "model" / "checkpoints").glob("ckpt-2.index"))  # the chief's, on its own disk
    assert (chief_dir.stat().st_mode & 0o777) == 0o700
    # The code and the kit are gone from both hosts; what stays is the chief's model dir.
    assert sorted(p.name for p in chief_dir.iterdir()) == ["model"] and not worker_dir.parent.exists()
    record = (tfl_home / "runs" / run / "state.json").read_text()
    assert "{tfl-cache}" not in record and str(worker_dir / "progress" / "worker-0.json") in record  # the real paths


@pytest.mark.slow
def test_a_remote_worker_killed_mid_training_and_restarted_resumes_with_the_chief(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str], hostenv: Path) -> None:
    CHIEF_HOST, WORKER_HOST = netbed.addresses[:2]
    shared = tmp_path / "shared"
    shared.mkdir()
    hold = Hold(tmp_path / "hold", 105)  # the moment: both hold in epoch 2 (tests/jobs/held.py), whatever the speed
    path = cluster(tmp_path, netbed, hostenv, env={**QUIET, **hold.env}, storage={"path": str(shared)})
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(HELD_JOB), "--cluster", str(path),
                                 "--max-restarts", "1", "--", MNIST, "--epochs", "4", "--steps-per-epoch", "100",
                                 "--batch-size", "16"], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        hold.wait(["chief:0", "worker:0"], alive=lambda: launcher.poll() is None,
                     why=lambda: launcher.communicate()[1][-4000:])
        (worker,) = [p for p in tfl_processes(run_id=only_run(tfl_home)) if p.environ().get("TFL_TASK") == "worker:0"]
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        hold.release()
        out, err = launcher.communicate(timeout=400)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err[-3000:]
    assert f"restart 1: worker:0 on {WORKER_HOST}: killed by SIGKILL" in err
    run = only_run(tfl_home)
    chief, worker = ((tfl_home / "runs" / run / "logs" / f"{t}-0.log").read_text() for t in ("chief", "worker"))
    restored = [re.search(r"every training task restored the backup of epoch (\d+)", log.split("--- tfl: attempt 1")[1])
                for log in (chief, worker)]
    assert all(restored) and restored[0][1] == restored[1][1], (chief[-2000:], worker[-2000:])  # type: ignore[index]
    resumed = int(restored[0][1]) + 1  # type: ignore[index]
    assert epochs_after_restart(chief) == epochs_after_restart(worker) == list(range(resumed, 5)) and resumed >= 2
    assert list((shared / run / "model" / "checkpoints").glob("ckpt-4.index"))



@pytest.mark.parametrize("needs", ["restarts", "evaluator"])
def test_per_host_disks_are_refused_before_anything_starts_with_the_fix(needs: str, netbed: NetBed, tmp_path: Path,
                                                                         tfl_home: Path, child_env: dict[str, str]) -> None:
    CHIEF_HOST, WORKER_HOST = netbed.addresses[:2]
    path = cluster(tmp_path, netbed, sys.executable, evaluator=WORKER_HOST if needs == "evaluator" else None)
    sessions = netbed.sshd_log().count("Accepted publickey")
    result = tfl(["launch", MNIST, "--cluster", str(path), *(["--max-restarts", "1"] if needs == "restarts" else [])], child_env)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("tfl: error: --max-restarts 1: a restarted group resumes from the chief's backup"
                                    if needs == "restarts" else f"tfl: error: the evaluator on {WORKER_HOST} would never see")
    assert 'name storage every host mounts at the same path in the cluster file ("storage": {"path": ' in result.stderr
    assert netbed.sshd_log().count("Accepted publickey") == sessions and not (tfl_home / "runs").exists()  # no host was reached


@pytest.fixture(scope="session")
def no_tf_keras() -> Path:
    return host_python("hostenv-no-tf-keras", ("tensorflow",))


def test_a_host_without_tf_keras_is_one_line_in_doctor_and_in_launch(netbed: NetBed, tmp_path: Path, tfl_home: Path,
                                                                     child_env: dict[str, str], no_tf_keras: Path) -> None:
    CHIEF_HOST, WORKER_HOST = netbed.addresses[:2]
    path = cluster(tmp_path, netbed, sys.executable, hosts={WORKER_HOST: {"python": str(no_tf_keras)}})
    doctor = tfl(["doctor", "--cluster", str(path)], child_env)
    assert doctor.returncode == 1
    failed = [line for line in doctor.stdout.splitlines() if " FAIL " in line]
    assert len(failed) == 1 and failed[0].startswith(f"{WORKER_HOST}  FAIL  packages: tensorflow 2.21.0, tf_keras -"), doctor.stdout
    assert "no tf_keras, so Keras 3 would be used" in failed[0] and f"fix: {no_tf_keras} -m pip install 'tf_keras~=2.21.0'" in failed[0]
    assert f"{WORKER_HOST}  OK    job kit: imports under {no_tf_keras} from the shipped copy" in doctor.stdout
    launch = tfl(["launch", MNIST, "--cluster", str(path)], child_env)
    assert launch.returncode == 2 and launch.stderr.splitlines() == [f"tfl: error: {WORKER_HOST}: {failed[0].split('packages: ', 1)[1]}"]
    assert not (tfl_home / "runs").exists() or not list((tfl_home / "runs").iterdir())


def test_doctor_proves_the_storage_shared_and_names_the_host_that_does_not_see_it(netbed: NetBed, tmp_path: Path) -> None:
    CHIEF_HOST, WORKER_HOST = netbed.addresses[:2]
    storage, elsewhere = tmp_path / "storage", tmp_path / "host3-local-disk"
    storage.mkdir()
    elsewhere.mkdir()
    shared = cluster(tmp_path, netbed, sys.executable, storage={"path": str(storage)})
    checks = _doctor(shared)
    assert checks[(CHIEF_HOST, "storage")] == ("ok", f"{storage} shared with every other host")
    assert checks[(WORKER_HOST, "storage")] == ("ok", f"{storage} shared with {CHIEF_HOST} (the chief's host)")
    # The worker's host gets a second sshd (port 2222) in a mount namespace of its own, where another dir is mounted
    # at the storage's path.
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("unshare --mount failed; CI must allow mount namespaces (root)")
        pytest.skip("unshare --mount not allowed here; needed to give one host its own view of a path")
    apart = start_sshd(tmp_path / "sshd-apart", hosts=(WORKER_HOST,), keys_from=netbed.hosts[0].sshd,
                       namespace=(elsewhere, storage), netns=netbed.host(WORKER_HOST).netns, port=2222)
    try:
        known = tmp_path / "known_hosts"
        assert netbed.known_hosts is not None
        known.write_text(netbed.known_hosts.read_text() + apart.known_hosts.read_text())
        unshared = cluster(tmp_path, netbed, sys.executable, storage={"path": str(storage)}, ssh={"known_hosts": str(known)},
                           hosts={WORKER_HOST: {"ssh": {"port": apart.port}}})
        checks = _doctor(unshared, expect=1)
    finally:
        stop_sshd(apart)
    assert checks[(WORKER_HOST, "storage")] == ("fail", f"{storage} is not shared: {WORKER_HOST} does not see the file "
                                                        f"{CHIEF_HOST} wrote there; fix: mount the same shared directory at "
                                                        f"{storage} on every host")
    assert checks[(CHIEF_HOST, "storage")][0] == "fail" and f"does not see the file {WORKER_HOST} wrote" in checks[(CHIEF_HOST, "storage")][1]
    assert list(storage.iterdir()) == list(elsewhere.iterdir()) == []  # each host removed its token


def _doctor(path: Path, expect: int = 0) -> dict[tuple[str, str], tuple[str, str]]:
    result = subprocess.run([sys.executable, "-m", "launcher", "doctor", "--cluster", str(path), "--json"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == expect, result.stdout + result.stderr
    return {(c["host"], c["name"]): (c["status"], c["detail"]) for c in json.loads(result.stdout)}


@pytest.mark.parametrize("hostile", ["symlinked workdir", "someone else's workdir", "symlinked run dir"])
def test_a_hostile_working_dir_is_refused_and_nothing_runs(hostile: str, netbed: NetBed, tmp_path: Path, tfl_home: Path,
                                                           child_env: dict[str, str]) -> None:
    CHIEF_HOST, WORKER_HOST = netbed.addresses[:2]
    if hostile == "someone else's workdir" and os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    job = write_job(tmp_path / "src", "print('ran')")
    target = tmp_path / "planted"
    target.mkdir()
    workdir = tmp_path / "work"
    cache = netbed.home(WORKER_HOST) / ".cache" / "tfl"
    if hostile == "symlinked workdir":
        workdir.symlink_to(target)
        expected = (f"{WORKER_HOST}: working dir {workdir} is a symlink (to {target}); whoever can change the link can swap "
                    f"the code tfl ships; fix: set hosts.{WORKER_HOST}.workdir to a directory of your own")
    elif hostile == "someone else's workdir":
        workdir.mkdir()
        os.chown(workdir, 65534, 65534)
        expected = f"{WORKER_HOST}: working dir {workdir} belongs to nobody, not to root who runs the tasks"
    else:
        cache.parent.mkdir(parents=True, exist_ok=True)
        if cache.exists():
            cache.rename(cache.with_name("tfl.aside"))  # earlier tests' runs: put back below
        cache.symlink_to(target)
        expected = f"{WORKER_HOST}: run dir {cache} is a symlink (to {target});"
    try:
        path = cluster(tmp_path, netbed, sys.executable,
                       workdirs={CHIEF_HOST: None, WORKER_HOST: None if hostile == "symlinked run dir" else workdir})
        result = tfl(["launch", str(job), "--cluster", str(path)], child_env)
    finally:
        if cache.is_symlink():
            cache.unlink()
            if cache.with_name("tfl.aside").exists():
                cache.with_name("tfl.aside").rename(cache)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"tfl: error: {expected}"), result.stderr
    assert list(target.iterdir()) == [] and not (workdir.is_dir() and list(workdir.iterdir()))  # nothing shipped there
    assert not (tfl_home / "runs").exists() or not list((tfl_home / "runs").iterdir())


LEAVES_A_CHILD = """
    import subprocess
    from launcher import jobkit
    child = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print("child", child.pid, jobkit.__file__, flush=True)
"""


def test_a_child_left_by_a_remote_job_is_gone_at_the_end_and_a_chatty_bashrc_breaks_nothing(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    CHIEF_HOST, WORKER_HOST = netbed.addresses[:2]
    """This python has an installed tfl: the tasks still import the kit tfl shipped with the run."""
    chatty = netbed.home(WORKER_HOST) / ".bashrc"
    chatty.write_text('echo "Welcome to worker host!"\nprintf "no newline, \\x1b[1mbold"\necho "to stderr" >&2\n')
    try:
        path = cluster(tmp_path, netbed, sys.executable)
        result = tfl(["launch", str(write_job(tmp_path / "src", LEAVES_A_CHILD)), "--cluster", str(path)], child_env)
        doctor = tfl(["doctor", "--cluster", str(path)], child_env)
        run = only_run(tfl_home)
        status = tfl(["status", run, "--json"], child_env)
    finally:
        chatty.unlink()
    assert result.returncode == 0, result.stderr
    children = []
    for host, task in ((CHIEF_HOST, "chief:0"), (WORKER_HOST, "worker:0")):
        line = next(x for x in result.stdout.splitlines() if x.startswith(f"[{task}]") and " child " in x)
        pid, kit = line.split(" child ", 1)[1].split()
        children.append(int(pid))
        assert kit == str(run_dir_on(netbed, host, run) / "kit" / "launcher" / "jobkit" / "__init__.py")
    assert not any(pid_alive(p) for p in children)  # ended with their groups, before the launcher returned
    assert doctor.returncode == 0 and "doctor: all 2 host(s) ready" in doctor.stdout, doctor.stdout
    assert json.loads(status.stdout)["state"] == "succeeded"


@pytest.mark.slow
def test_the_tfrecord_job_trains_from_shards_on_shared_storage_and_an_evaluator_on_the_workers_host_evaluates_it(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str], hostenv: Path, fashion_shards: Path) -> None:
    """jobs/fashion_records.py unchanged on two hosts: the shards and the model dir on the storage both see.
    An evaluator on the worker's host evaluates the chief's checkpoints there (one run proves both: two
    TensorFlow start-ups and a bed fewer than a run of its own)."""
    WORKER_HOST = netbed.addresses[1]
    shared = tmp_path / "shared"
    records = shutil.copytree(fashion_shards, shared / "fashion-records")
    path = cluster(tmp_path, netbed, hostenv, evaluator=WORKER_HOST, env=QUIET, storage={"path": str(shared)})
    result = tfl(["launch", str(FASHION_RECORDS_JOB), "--cluster", str(path), "--", "--records", str(records), "--epochs", "2",
                  "--steps-per-epoch", "5", "--batch-size", "8", "--window", "64"], child_env, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tfl_home)
    chief, worker = ((tfl_home / "runs" / run / "logs" / f"{t}-0.log").read_text() for t in ("chief", "worker"))
    assert_trained_on_the_shards(shared / run / "model", records, chief, worker, epochs=2)
    assert f"jobkit: model dir {shared / run / 'model'}" in chief
    evaluated = (tfl_home / "runs" / run / "logs" / "evaluator-0.log").read_text()
    assert "eval checkpoint=ckpt-2" in evaluated, evaluated[-2000:]
    assert list((shared / run / "model" / "tensorboard" / "eval").rglob("events.out.tfevents*"))
