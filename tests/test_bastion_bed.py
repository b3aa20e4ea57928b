"""Hosts reachable only through a bastion (``tests.jumpbed``): tfl launches on them through one
connection to the bastion (whose sshd keeps its default MaxStartups), names a cut host lost and
no other, refuses an unknown bastion key in one line, follows a ProxyJump of an ssh config, and
``tfl status`` / ``stop`` / ``rm`` reach a recorded run there. Every test ends with the bed and
every process of its runs gone (the fixtures prove it)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.jumpbed import BASTION_ADDRESS, LAUNCHER_ADDRESS, JumpBed, jumpbed_fixture
from tests.procs import pid_alive, tfl_processes
from tests.test_lost_hosts import LOOPS, LOST, tasks_up
from tests.test_ssh import only_run, wait_for, write_job

pytestmark = pytest.mark.ssh
FENCE = 6.0
PORT = 2222  # each host has a network of its own: one port for all
QUICK = """
    import os
    print("done", os.environ["TFL_TASK"], flush=True)
"""


def tasks_for(bed: JumpBed) -> dict[str, list[str]]:
    first, *rest = bed.addresses
    return {"chief": [f"{first}:{PORT}"], "worker": [f"{h}:{PORT}" for h in rest]}


def tfl(bed: JumpBed, env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(bed.launcher_argv(*args), env=env, capture_output=True, text=True, timeout=timeout)


def bastion_logins(bed: JumpBed) -> int:
    assert bed.bastion is not None
    return bed.bastion.log().count(f"Accepted publickey for root from {LAUNCHER_ADDRESS}")


def launch_quick(bed: JumpBed, tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    cluster = bed.cluster_file(tmp_path / "cluster.json", tasks_for(bed), sys.executable,
                               ssh={"jump": f"root@{BASTION_ADDRESS}"})
    started = time.monotonic()
    done = tfl(bed, env, "launch", str(write_job(tmp_path / "src", QUICK)), "--cluster", str(cluster))
    return done, time.monotonic() - started


def test_a_launch_on_hosts_behind_a_bastion_goes_through_one_connection_to_it(
        jumpbed: JumpBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    done, took = launch_quick(jumpbed, tmp_path, child_env)
    assert done.returncode == 0, done.stderr[-3000:]
    logs = tfl_home / "runs" / only_run(tfl_home) / "logs"
    said = sorted(line.split()[-1] for log in logs.glob("*.log") for line in log.read_text().splitlines() if "done " in line)
    assert said == ["chief:0", *(f"worker:{i}" for i in range(len(jumpbed.hosts) - 1))]
    # one bastion connection per phase of the launch (checks, tasks, clean-up) at most, never one per host
    assert 1 <= bastion_logins(jumpbed) <= 3, jumpbed.bastion.log() if jumpbed.bastion else ""
    print(f"launch through the bastion, {len(jumpbed.hosts)} hosts: {took:.1f} s, {bastion_logins(jumpbed)} bastion logins")


@pytest.mark.slow  # ~55 s: the run's teardown waits out the frozen agent; the inner loop keeps the other bastion tests
def test_a_cut_host_behind_the_bastion_is_named_lost_and_no_other(
        jumpbed: JumpBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """Another host falls silent at the same time (its agent frozen): the probe asks it through the
    bastion and hears it, so it is not called lost; dialled straight (unreachable) it would be."""
    silent, cut = jumpbed.addresses[1], jumpbed.addresses[2]
    cluster = jumpbed.cluster_file(tmp_path / "cluster.json", tasks_for(jumpbed), sys.executable,
                                   ssh={"jump": BASTION_ADDRESS, "fence_after": FENCE})
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as err_file:
        launcher = subprocess.Popen(jumpbed.launcher_argv("launch", str(write_job(tmp_path / "src", LOOPS)), "--cluster",
                                                          str(cluster)),
                                    env=child_env, stdout=subprocess.DEVNULL, stderr=err_file, text=True)
    frozen: list[int] = []
    try:
        pids = tasks_up(tfl_home, len(jumpbed.hosts), launcher)
        frozen = _agents(jumpbed, silent)
        assert frozen
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        jumpbed.cut(cut)  # the frozen host went silent first: it is asked first
        wait_for(lambda: launcher.poll() is not None or f"host {cut} unreachable" in errors.read_text(), timeout=120)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)  # the run is ending: its agent hears the end of its session
        try:
            launcher.wait(120)
        finally:
            launcher.kill()
    err = errors.read_text()
    assert launcher.returncode == 1, err[-3000:]
    named = {m[0] for m in LOST.findall(err)}
    assert named == {cut}, err[-3000:]  # the silent host answered through the bastion
    summary = err[err.index(" failed after "):]
    assert f"root cause: worker:1 on {cut}" in summary, summary
    # its agent's dead-man timer stops the cut host's task, with no word from tfl
    wait_for(lambda: not pid_alive(pids["worker:1"]), timeout=FENCE + 30)
    jumpbed.join(cut)
    wait_for(lambda: tfl_processes(run_id=only_run(tfl_home)) == [], timeout=FENCE + 30)


def _agents(bed: JumpBed, address: str) -> list[int]:
    def cmdline(pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""
    return [p for p in bed.pids(bed.host(address).netns) if "tfl-agent" in cmdline(p)]


def test_an_unknown_bastion_key_is_refused_in_one_line_naming_the_bastion_and_the_fix(
        jumpbed: JumpBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    assert jumpbed.known_hosts is not None
    known = jumpbed.known_hosts.read_text().splitlines()
    jumpbed.known_hosts.write_text("".join(f"{line}\n" for line in known if not line.startswith(f"{BASTION_ADDRESS} ")))
    done, _ = launch_quick(jumpbed, tmp_path, child_env)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"bastion {BASTION_ADDRESS} (ssh.jump): host key of {BASTION_ADDRESS} is not in" in done.stderr
    assert f"ssh-keyscan {BASTION_ADDRESS} >> {jumpbed.known_hosts}" in done.stderr
    assert bastion_logins(jumpbed) == 0
    assert not (tfl_home / "runs").exists() or not any((tfl_home / "runs").glob("*/logs/*.log"))


def test_a_bastion_this_machine_has_no_route_to_is_one_line_naming_the_jump(
        jumpbed: JumpBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """The launcher's namespace routes only its /30 to the bastion: 198.51.100.9 is ENETUNREACH, said as
    no route and the jump's field, never as a refusal or a raw OSError."""
    cluster = jumpbed.cluster_file(tmp_path / "cluster.json", tasks_for(jumpbed), sys.executable,
                                   ssh={"jump": "root@198.51.100.9"})
    done = tfl(jumpbed, child_env, "launch", str(write_job(tmp_path / "src", QUICK)), "--cluster", str(cluster))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert ("bastion 198.51.100.9 (ssh.jump): no route to 198.51.100.9 (Network is unreachable): the host is down, or "
            "on a network this machine does not reach; check the bastion's address in ssh.jump") in done.stderr, done.stderr
    assert bastion_logins(jumpbed) == 0


def test_hosts_named_by_ssh_config_aliases_are_refused_before_any_task_naming_the_name(
        jumpbed: JumpBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """``Host gpuN`` / ``HostName 198.18.0.x`` reaches each host through the bastion, but TF_CONFIG holds
    gpuN and no host resolves it: the tasks would wait for each other forever. doctor and launch
    say so, in one line naming the host, the name and the fix, and the launch leaves nothing there."""
    aliases = {f"gpu{i}": a for i, a in enumerate(jumpbed.addresses, 1)}
    config = tmp_path / "ssh_config"
    config.write_text("".join(f"Host {n}\n    HostName {a}\n" for n, a in aliases.items())
                      + f"Host gpu*\n    ProxyJump root@{BASTION_ADDRESS}\n")
    names = list(aliases)
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({
        "cluster": {"chief": [f"{names[0]}:{PORT}"], "worker": [f"{n}:{PORT}" for n in names[1:]]},
        "ssh": {"user": "root", "identity_file": str(jumpbed.client_key), "known_hosts": str(jumpbed.known_hosts),
                "config": str(config)},
        "hosts": {n: {"python": sys.executable} for n in names}}))
    doctor = tfl(jumpbed, child_env, "doctor", "--cluster", str(cluster))
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert all(f"{n}  OK    ssh: reached" in doctor.stdout for n in names), doctor.stdout  # through the bastion
    said = [line for line in doctor.stdout.splitlines() if " FAIL  names: " in line]
    assert len(said) == len(names) and "gpu2 cannot resolve gpu1 (" in doctor.stdout, doctor.stdout
    assert said[0].endswith("write those hosts' addresses in cluster, or make gpu1's DNS or /etc/hosts know them")
    done = tfl(jumpbed, child_env, "launch", str(write_job(tmp_path / "src", QUICK)), "--cluster", str(cluster))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "tfl: error: gpu1: gpu1 cannot resolve gpu2 (" in done.stderr, done.stderr
    left = [p for h in jumpbed.hosts for p in (h.home / ".cache" / "tfl" / "runs").glob("*/*")]
    assert left == [], left
    assert not any((tfl_home / "runs").glob("*/logs/*.log"))


def test_the_lost_host_probe_of_a_host_reached_straight_asks_its_ssh_config_hostname(
        jumpbed: JumpBed, tmp_path: Path) -> None:
    """An ssh config alias (``Host edge`` / ``HostName`` the bastion's address, its sshd up) reached straight:
    the watch asks the address ssh dials, as it does through a bastion. Asked by the alias, it heard
    nothing: the launcher's namespace resolves no name (and no DNS query leaves it)."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host edge\n    HostName {BASTION_ADDRESS}\n")
    probe = ("import sys; from launcher.describe.hosts import SSHTarget; from launcher.engines.ssh.connect import reach; "
             "print(reach(SSHTarget(host='edge', config=sys.argv[1], jump='none')))")
    asked = subprocess.run(["ip", "netns", "exec", jumpbed.launcher_ns, sys.executable, "-c", probe, str(config)],
                           capture_output=True, text=True, timeout=60)
    assert (asked.returncode, asked.stdout.strip()) == (0, "True"), asked.stdout + asked.stderr


def test_proxyjump_of_an_ssh_config_and_status_stop_rm_of_the_recorded_run(
        jumpbed: JumpBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host 198.18.*\n    ProxyJump root@{BASTION_ADDRESS}\n")
    cluster = jumpbed.cluster_file(tmp_path / "cluster.json", tasks_for(jumpbed), sys.executable,
                                   ssh={"config": str(config), "fence_after": FENCE})
    launcher = subprocess.Popen(jumpbed.launcher_argv("launch", str(write_job(tmp_path / "src", LOOPS)), "--cluster",
                                                      str(cluster), "--keep-remote"),
                                env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        tasks_up(tfl_home, len(jumpbed.hosts), launcher)
        run = only_run(tfl_home)
        wait_for(lambda: all(t.get("pid") for t in _record(tfl_home, run)["tasks"]), timeout=30)
        status = tfl(jumpbed, child_env, "status", run, "--json")
        assert status.returncode == 0, status.stderr
        tasks = json.loads(status.stdout)["tasks"]
        assert len(tasks) == len(jumpbed.hosts) and all(t["rss_mb"] for t in tasks), status.stdout  # each host asked
        stopped = tfl(jumpbed, child_env, "stop", run)
        assert stopped.returncode == 0, stopped.stderr
        launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    dirs = [h.home / ".cache" / "tfl" / "runs" / run for h in jumpbed.hosts]
    assert all(d.exists() for d in dirs)  # --keep-remote
    removed = tfl(jumpbed, child_env, "rm", run)
    assert removed.returncode == 0, removed.stderr
    assert "left:" not in removed.stdout and not any(d.exists() for d in dirs), removed.stdout
    assert re.search(r"tfl: removed 1 run\(s\)", removed.stdout), removed.stdout


def _record(home: Path, run: str) -> dict[str, list[dict[str, object]]]:
    try:
        return dict(json.loads((home / "runs" / run / "state.json").read_text()))
    except (OSError, ValueError):
        return {"tasks": []}


@pytest.fixture
def jumpbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JumpBed]:
    """A bastion and four hosts behind it; gone after the test, failed or not, and proven gone."""
    yield from jumpbed_fixture(4, tmp_path_factory)


@pytest.fixture
def jumpbed64(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JumpBed]:
    yield from jumpbed_fixture(64, tmp_path_factory)


@pytest.mark.slow
def test_64_hosts_behind_one_bastion_with_default_maxstartups(
        jumpbed64: JumpBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    done, took = launch_quick(jumpbed64, tmp_path, child_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert 1 <= bastion_logins(jumpbed64) <= 3
    print(f"launch through the bastion, 64 hosts: {took:.1f} s, {bastion_logins(jumpbed64)} bastion logins")


@pytest.mark.slow
def test_a_cut_host_among_64_behind_one_bastion_is_named_and_no_other(
        jumpbed64: JumpBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    cut = jumpbed64.addresses[40]
    cluster = jumpbed64.cluster_file(tmp_path / "cluster.json", tasks_for(jumpbed64), sys.executable,
                                     ssh={"jump": BASTION_ADDRESS, "fence_after": FENCE})
    launcher = subprocess.Popen(jumpbed64.launcher_argv("launch", str(write_job(tmp_path / "src", LOOPS)), "--cluster",
                                                        str(cluster)),
                                env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pids = tasks_up(tfl_home, len(jumpbed64.hosts), launcher)
        when = jumpbed64.cut(cut)
        out, err = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    assert launcher.returncode == 1, err[-3000:]
    assert {m[0] for m in LOST.findall(err)} == {cut}, err[-3000:]
    assert 1 <= bastion_logins(jumpbed64) <= 3
    wait_for(lambda: not pid_alive(pids["worker:39"]), timeout=FENCE + 30)
    jumpbed64.join(cut)
    wait_for(lambda: tfl_processes(run_id=only_run(tfl_home)) == [], timeout=FENCE + 30)
    silent = max(int(m[2]) for m in LOST.findall(err))
    print(f"64 hosts behind a bastion: the cut host named after {silent} s of silence ({time.time() - when:.0f} s to the run's end)")
