"""4. Scaling: time until every task has started, for N local tiny tasks and N SSH hosts."""

from __future__ import annotations

import os

from bench.common import TINY, Section, Stats, Workspace, ratio_stats, verdict
from bench.config import Config
from bench.runs import plain_group, tfl_group
from bench.ssh import SSHLaunch

SSH_TARGET = 1.5


def local_scaling(cfg: Config, ws: Workspace) -> dict[int, dict[str, list[float]]]:
    """N -> "tfl"/"plain" -> seconds from spawning the command to the last task running its code."""
    times: dict[int, dict[str, list[float]]] = {n: {"tfl": [], "plain": []} for n in cfg.local_ns}
    for rep in range(cfg.reps):
        for n in cfg.local_ns:
            for kind in (("tfl", "plain") if rep % 2 == 0 else ("plain", "tfl")):
                start = tfl_group if kind == "tfl" else plain_group
                run = start(ws, f"scale-{n}-r{rep}", TINY, n, ["--sleep", "0.5"])
                times[n][kind].append(run.all_started_s(n))
    return times


def _floor_note(ssh: dict[int, list[SSHLaunch]] | None) -> str:
    """What this machine's cores allow: the CPU a launch needs, spread over every core, is its least time."""
    if not ssh or len(ssh) < 2:
        return ""
    cores = os.cpu_count() or 1
    one, top = min(ssh), max(ssh)
    cpu_top = Stats.of([s.cpu_s for s in ssh[top]]).median
    floor = cpu_top / cores
    t_one = Stats.of([s.all_started_s for s in ssh[one]]).median
    return (f"The {top}-host launch used {cpu_top:.2f} s of CPU (median), so on {cores} cores it cannot take less than "
            f"{floor:.2f} s, already {floor / t_one:.2f}× the {one}-host median ({t_one:.2f} s) before any waiting: on "
            "this machine the SSH target is bounded by CPU, not by how parallel tfl is. Per host, the launch opens two "
            "SSH connections (the preflight probe, then the run) and starts Python twice there (probe, agent).")


def scaling_section(cfg: Config, local: dict[int, dict[str, list[float]]], ssh: dict[int, list[SSHLaunch]] | None,
                    ssh_note: str) -> Section:
    rows = []
    for n, kinds in local.items():
        rows.append([f"local, {n} task(s)", Stats.of(kinds["plain"]).fmt(1000, 0, " ms"), Stats.of(kinds["tfl"]).fmt(1000, 0, " ms"),
                     ratio_stats(kinds["tfl"], kinds["plain"]).fmt(digits=2, unit="× plain"), "—", "—"])
    ok: bool | None = None
    top = max(local)
    headline = [f"local ×{top}: {Stats.of(local[top]['tfl']).median * 1000:.0f} ms"]
    if ssh:
        one = [s.all_started_s for s in ssh[min(ssh)]]
        for n, launches in ssh.items():
            samples = [s.all_started_s for s in launches]
            ratio = ratio_stats(samples, one)
            cpu = Stats.of([s.cpu_s for s in launches])
            launcher_cpu = Stats.of([s.launcher_cpu_s for s in launches])
            last = n == max(ssh)
            rows.append([f"SSH, {n} host(s)", "—", Stats.of(samples).fmt(1000, 0, " ms"),
                         ratio.fmt(digits=2, unit=f"× {min(ssh)} host"),
                         f"{cpu.fmt(digits=2, unit=' s')}; launcher {launcher_cpu.median:.2f} s",
                         f"≤ {SSH_TARGET}×: {verdict(ratio.median <= SSH_TARGET)}" if last else "—"])
            if last:
                ok = ratio.median <= SSH_TARGET
                headline.append(f"SSH {n} hosts: {ratio.median:.2f}× 1 host")
    else:
        rows.append(["SSH, 1–8 hosts", "—", ssh_note, "—", "—", f"8 hosts ≤ {SSH_TARGET}× 1 host: not measured"])
    return Section(
        4, "Scaling", f"report local N = {', '.join(map(str, cfg.local_ns))}; SSH: {max(cfg.ssh_ns)} hosts ≤ {SSH_TARGET}× 1 host",
        ["tasks", "plain script", "tfl launch", "ratio (same repetition)", "CPU used by the whole launch", "target"], rows,
        "not measured" if ok is None else verdict(ok),
        notes=[f"Time from spawning the command until the last task began running its own code (each tiny task "
               f"writes `time.time()` as its first act). {cfg.reps} repetitions, tfl and the plain script back to back.",
               "Every task is a new Python interpreter; beyond 2 tasks they compete for this machine's 2 cores, "
               "which is most of the growth with N for both launchers.",
               ssh_note,
               _floor_note(ssh),
               "SSH CPU: the launcher's own CPU plus that of every sshd session it opened (sshd's reaped children: "
               "the session processes, tfl's agents and probes, the tasks). The loopback \"hosts\" are all this one "
               "machine, so that CPU shares its 2 cores: no launch can take less than CPU / 2 here, however "
               "parallel the launcher is."],
        raw={"local": {str(n): k for n, k in local.items()},
             "ssh": {str(n): [s.__dict__ for s in launches] for n, launches in (ssh or {}).items()}},
        headline="; ".join(headline) if ssh else f"{headline[0]}; SSH not measured")
