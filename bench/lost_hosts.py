"""§13 Lost hosts: on the network test bed (``tests.netbed``), how fast tfl notices a host cut
off, ends the run, and how fast every task of the run is stopped (the survivors by tfl at
once, the cut host's by its agent's dead-man timer); and how fast a launcher killed with -9
leaves no remote task.

Each trial: a chief and two workers, one per host, running a tiny loop (no TensorFlow: the
figures are tfl's and the agents', not TensorFlow's start-up); the bed's hosts are reached
over SSH, each in a network namespace of its own. Needs root and ``ip netns``.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from pathlib import Path

import psutil

from bench.common import PYTHON, BenchError, Section, Stats, Workspace, assert_none_left, tfl_command
from bench.config import Config
from tests.netbed import NetBed, make_netbed, netbed_available

FENCE = 10.0  # ssh.fence_after in these runs (30 s by default): the cut host's tasks stop after it
LOOPS = """import os, time
print("up", os.environ["TFL_TASK"], os.getpid(), flush=True)
while True:
    time.sleep(0.2)
"""
UP = re.compile(r"^up (\S+) (\d+)$", re.M)
NOTICED = "unreachable since"
TARGET_NOTICED, TARGET_ENDED = 15.0, 60.0


def lost_host_trials(cfg: Config, ws: Workspace) -> dict[str, list[float]] | str:
    """Samples per measure, or why they could not be taken."""
    why = netbed_available()
    if why:
        return f"not measured: {why}"
    bed = make_netbed(ws.root / "netbed")
    job = ws.root / "loops.py"
    job.write_text(LOOPS)
    samples: dict[str, list[float]] = {"noticed": [], "ended": [], "stopped": [], "fenced": [], "killed": []}
    try:
        for _ in range(cfg.lost_host_trials):
            _cut_trial(bed, ws, job, samples)
            _kill_trial(bed, ws, job, samples)
    finally:
        bed.teardown()
    if bed.leftovers():
        raise BenchError(f"the test bed left {bed.leftovers()}")
    return samples


def _launch(bed: NetBed, ws: Workspace, job: Path, label: str) -> tuple[Path, subprocess.Popen[bytes], dict[str, int]]:
    home = ws.home(label)
    h1, h2, h3 = bed.addresses
    tasks = {"chief": [f"{h1}:2222"], "worker": [f"{h2}:2222", f"{h3}:2222"]}
    cluster = bed.cluster_file(home / "cluster.json", tasks, PYTHON, ssh={"fence_after": FENCE})
    launcher = subprocess.Popen([*tfl_command(), "launch", str(job), "--cluster", str(cluster)], env=ws.env(home),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = {m[0]: int(m[1]) for log in home.glob("runs/*/logs/*.log") for m in UP.findall(log.read_text())}
        if len(pids) == 3:
            return home, launcher, pids
        if launcher.poll() is not None:
            break
        time.sleep(0.05)
    launcher.kill()
    raise BenchError(f"the tasks of {home} did not all start")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cut_trial(bed: NetBed, ws: Workspace, job: Path, samples: dict[str, list[float]]) -> None:
    home, launcher, pids = _launch(bed, ws, job, "lost-cut")
    victim = bed.addresses[1]
    bed.cut(victim)
    cut = time.monotonic()
    noticed = ended = stopped = fenced = None
    log = next(home.glob("runs/*/logs/worker-0.log"))
    while time.monotonic() - cut < FENCE + 60 and None in (noticed, ended, stopped, fenced):
        now = time.monotonic() - cut
        if noticed is None and NOTICED in log.read_text():
            noticed = now
        if ended is None and launcher.poll() is not None:
            ended = now
        if stopped is None and not any(_alive(pids[t]) for t in ("chief:0", "worker:1")):
            stopped = now
        if fenced is None and not _alive(pids["worker:0"]):
            fenced = now
        time.sleep(0.02)
    bed.join(victim)
    launcher.kill()
    if None in (noticed, ended, stopped, fenced):
        raise BenchError(f"cut trial in {home}: noticed {noticed}, ended {ended}, survivors {stopped}, fenced {fenced}")
    for key, value in (("noticed", noticed), ("ended", ended), ("stopped", stopped), ("fenced", fenced)):
        samples[key].append(float(value))  # type: ignore[arg-type]
    assert_none_left(home)
    _wait_reachable(victim)


def _kill_trial(bed: NetBed, ws: Workspace, job: Path, samples: dict[str, list[float]]) -> None:
    home, launcher, pids = _launch(bed, ws, job, "lost-kill")
    time.sleep(0.5)  # every pid recorded
    launcher.kill()
    killed = time.monotonic()
    launcher.wait(10)
    while any(_alive(p) for p in pids.values()):
        if time.monotonic() - killed > FENCE + 30:
            raise BenchError(f"remote tasks of {home} outlived the fence after the launcher's SIGKILL")
        time.sleep(0.02)
    samples["killed"].append(time.monotonic() - killed)
    assert_none_left(home)


def _wait_reachable(host: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, 22), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise BenchError(f"{host} did not come back after the join")


def lost_host_section(cfg: Config, samples: dict[str, list[float]] | str) -> Section:
    section = Section(13, "Lost hosts", f"a cut host named ≤ {TARGET_NOTICED:g} s after the cut, the run ended ≤ "
                                        f"{TARGET_ENDED:g} s after it; report the fencing figures",
                      ["measure", "median (min–max)", "p95", "trials", "target"])
    if isinstance(samples, str):
        section.verdict, section.headline, section.notes = "not measured", samples, [samples]
        section.rows = [["cut → noticed; launcher kill -9 → remote tasks gone", samples, "", "", ""]]
        return section
    stats = {key: Stats.of(values) for key, values in samples.items()}
    met = stats["noticed"].p95 <= TARGET_NOTICED and stats["ended"].p95 <= TARGET_ENDED
    section.verdict = "met" if met else "missed"
    section.rows = [
        ["cut → tfl names the host (its task's log says `unreachable since`)", stats["noticed"].fmt(unit=" s"),
         f"{stats['noticed'].p95:.2f} s", str(stats["noticed"].n), f"≤ {TARGET_NOTICED:g} s"],
        ["cut → tfl has ended the run (exit 1, one root cause naming the host)", stats["ended"].fmt(unit=" s"),
         f"{stats['ended'].p95:.2f} s", str(stats["ended"].n), f"≤ {TARGET_ENDED:g} s"],
        ["cut → the survivors (chief, other worker) stopped by tfl", stats["stopped"].fmt(unit=" s"),
         f"{stats['stopped'].p95:.2f} s", str(stats["stopped"].n), "report"],
        [f"cut → every task of the run stopped (the cut host's by its agent's fence, ssh.fence_after = {FENCE:g} s)",
         stats["fenced"].fmt(unit=" s"), f"{stats['fenced'].p95:.2f} s", str(stats["fenced"].n), "report"],
        ["launcher kill -9 → every remote task gone (hosts reachable: the agents see their stdin end)",
         stats["killed"].fmt(unit=" s"), f"{stats['killed'].p95:.2f} s", str(stats["killed"].n), "report"],
    ]
    section.headline = (f"noticed in {stats['noticed'].median:.1f} s, run ended in {stats['ended'].median:.1f} s, "
                        f"all stopped in {stats['fenced'].median:.1f} s (fence {FENCE:g} s)")
    section.notes = [
        "How a cut is noticed: each agent pings when it has sent nothing for 3.3 s; a task silent for 5 s makes tfl "
        "try a TCP connection to its host's sshd port (4 s at most); no answer = the host is lost, all its tasks at once "
        "(launcher/engines/ssh/watch.py). A host that answers (a stuck agent) is left to the 30 s channel timeout.",
        "The cut host's task is stopped on the host itself by its agent once it has heard nothing for ssh.fence_after "
        "(then SIGTERM, 5 s grace, SIGKILL); tfl cannot reach it. The fence counts from the last ping the agent heard "
        "(tfl pings four times per fence, every 2 s at least: 2.5 s at this fence), up to 2.5 s before the cut, so that "
        "figure lies between the fence less 2.5 s and the fence "
        "plus the agent's 0.1 s check.",
        "A launcher killed with -9 on a working network: the kernel closes its SSH connections, each sshd ends the "
        "session, each agent sees its stdin end and stops its task at once; on a cut network the fence applies instead.",
        "Ratios are within one run; absolute figures are inflated by the shared 2-core machine's load.",
    ]
    section.raw = {"samples": samples, "fence_after": FENCE}
    return section
