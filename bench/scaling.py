"""4. Scaling: time until every task has started, for N local tiny tasks and N SSH hosts."""

from __future__ import annotations

import os
from pathlib import Path

from bench.common import TINY, Section, Stats, Workspace, ratio_stats, verdict
from bench.config import Config
from bench.runs import plain_group, tfl_group
from bench.ssh import SHELLS, SSHLaunch

SSH_TARGET = 1.3


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


def _floor_note(ssh: dict[str, dict[int, list[SSHLaunch]]] | None) -> str:
    """What this machine's cores allow: the CPU a launch needs, spread over every core, is its least time."""
    if not ssh:
        return ""
    cores = os.cpu_count() or 1
    notes = []
    for shell, runs in ssh.items():
        one, top = min(runs), max(runs)
        if one == top:
            continue
        cpu_top = Stats.of([s.cpu_s for s in runs[top]]).median
        t_one = Stats.of([s.all_started_s for s in runs[one]]).median
        floor = cpu_top / cores
        notes.append(f"{SHELLS[shell]}, {top} hosts: the launch used {cpu_top:.2f} s of CPU (median), so on {cores} cores "
                     f"it cannot take less than {floor:.2f} s, {floor / t_one:.2f}× the {one}-host median ({t_one:.2f} s) "
                     "before any waiting")
    per_host = _per_host_cpu(ssh)
    return ("; ".join(notes) + ". " + per_host).strip()


def _per_host_cpu(ssh: dict[str, dict[int, list[SSHLaunch]]]) -> str:
    """The sessions' CPU per host, with and without the account's ~/.bashrc."""
    parts = []
    for shell, runs in ssh.items():
        top = max(runs)
        parts.append(f"{Stats.of([s.sessions_cpu_s for s in runs[top]]).median / top * 1000:.0f} ms with {SHELLS[shell]}")
    return f"CPU of the sshd sessions per host (at {max(max(r) for r in ssh.values())} hosts): " + ", ".join(parts) + "." \
        if parts else ""


def _bashrc_hint() -> str:
    try:
        text = (Path.home() / ".bashrc").read_text(errors="replace")
    except OSError:
        return ""
    return " (this account's runs `pyenv init`)" if "pyenv init" in text else ""


def scaling_section(cfg: Config, local: dict[int, dict[str, list[float]]],
                    ssh: dict[str, dict[int, list[SSHLaunch]]] | None, ssh_note: str) -> Section:
    rows = []
    for n, kinds in local.items():
        rows.append([f"local, {n} task(s)", Stats.of(kinds["plain"]).fmt(1000, 0, " ms"), Stats.of(kinds["tfl"]).fmt(1000, 0, " ms"),
                     ratio_stats(kinds["tfl"], kinds["plain"]).fmt(digits=2, unit="× plain"), "—", "—", "—"])
    ok: bool | None = None
    top = max(local)
    headline = [f"local ×{top}: {Stats.of(local[top]['tfl']).median * 1000:.0f} ms"]
    for shell, runs in (ssh or {}).items():
        one = [s.all_started_s for s in runs[min(runs)]]
        for n, launches in runs.items():
            samples = [s.all_started_s for s in launches]
            ratio = ratio_stats(samples, one)
            cpu = Stats.of([s.cpu_s for s in launches])
            launcher_cpu = Stats.of([s.launcher_cpu_s for s in launches])
            judged = shell == "plain" and n == max(runs)
            conns = sorted({(s.connections, s.sessions) for s in launches})
            rows.append([f"SSH, {n} host(s), {SHELLS[shell]}", "—", Stats.of(samples).fmt(1000, 0, " ms"),
                         ratio.fmt(digits=2, unit=f"× {min(runs)} host"),
                         f"{cpu.fmt(digits=2, unit=' s')}; launcher {launcher_cpu.median:.2f} s",
                         " or ".join(f"{c} / {s}" for c, s in conns),
                         f"≤ {SSH_TARGET}×: {verdict(ratio.median <= SSH_TARGET)}" if judged else "—"])
            if judged:
                ok = ratio.median <= SSH_TARGET
            if n == max(runs) and n != min(runs):
                headline.append(f"SSH {n} hosts: {ratio.median:.2f}× 1 host ({SHELLS[shell]})")
    if not ssh:
        rows.append(["SSH, 1–8 hosts", "—", ssh_note, "—", "—", "—", f"8 hosts ≤ {SSH_TARGET}× 1 host: not measured"])
    return Section(
        4, "Scaling", f"report local N = {', '.join(map(str, cfg.local_ns))}; SSH: {max(cfg.ssh_ns)} hosts ≤ {SSH_TARGET}× 1 host",
        ["tasks", "plain script", "tfl launch", "ratio (same repetition)", "CPU used by the whole launch",
         "SSH connections / sessions", "target"], rows,
        "not measured" if ok is None else verdict(ok),
        notes=[f"Time from spawning the command until the last task began running its own code (each tiny task "
               f"writes `time.time()` as its first act). {cfg.reps} repetitions, tfl and the plain script back to back.",
               "Every task is a new Python interpreter; beyond 2 tasks they compete for this machine's 2 cores, "
               "which is most of the growth with N for both launchers.",
               ssh_note,
               "Per host, a launch opens one SSH connection and one session: the host's agent, which first "
               "checks the host (python, ports), makes the run's private dir, unpacks the shipped job and the job kit "
               "(every launch ships the kit), finds the kit where the tasks will import it, then runs the host's tasks; once the "
               "run has ended, one more session per host removes what was shipped, after every task started, so it "
               "counts in the CPU column but not in the time (the last column counts both from sshd's log). "
               "Every session starts the account's login shell, and bash started by sshd "
               f"sources ~/.bashrc, whatever it holds{_bashrc_hint()}. That cost is the account's, not tfl's, so the "
               "SSH hosts are measured twice where the account has a ~/.bashrc: with a plain login shell (the private "
               "sshd sets SHLVL=1, which makes bash skip ~/.bashrc), on which the target is judged, and with the "
               f"account's ~/.bashrc as it is ({min(cfg.ssh_ns)} and {max(cfg.ssh_ns)} hosts).",
               _floor_note(ssh),
               "SSH CPU: the launcher's own CPU plus that of every sshd session it opened (sshd's reaped children: "
               "the session processes, their shells, tfl's agents, the tasks). The loopback \"hosts\" are all this one "
               "machine, so that CPU shares its 2 cores: no launch can take less than CPU / 2 here, however "
               "parallel the launcher is."],
        raw={"local": {str(n): k for n, k in local.items()},
             "ssh": {shell: {str(n): [s.__dict__ for s in launches] for n, launches in runs.items()}
                     for shell, runs in (ssh or {}).items()}},
        headline="; ".join(headline) if ssh else f"{headline[0]}; SSH not measured")
