"""§18 Many hosts (issue 29): SSH runs of 16 to 256 hosts on the large network test bed.

Each configuration (H hosts × K tasks per host, T = H × K tasks of tests/jobs/loops.py: no
TensorFlow, the figures are tfl's) is launched with ``--detach`` on the first H hosts of one
bed (``tests.netbed``: a network namespace, an address of 198.18.0.0/15 and an sshd per host),
then measured: launch → every task running (wall, each task's first line); the launcher's
CPU for it (the foreground ``tfl launch`` and the background launcher until then); over an
idle window its CPU, threads, fds and bytes written (/proc/PID/io); the record's size;
``tfl status RUN`` with the cluster's known_hosts grown to 5,000 lines; then the last host is
cut (its link down): the time until tfl names it in its tasks' logs, until the run has
ended, and every other host's tasks checked not to be called lost. Nothing may be left on
any host afterwards (the cut host's tasks are stopped by their agents' fence). Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil

from bench.common import PYTHON, ROOT, BenchError, Section, Stats, Workspace, load1, tfl_command
from bench.config import Config, machine, timestamp
from bench.report import section_lines, summary_row
from tests.bedjob import cluster_for, loops_job, only_sshds, record, run_id, wait_recorded, wait_up
from tests.netbed import NetBed, make_netbed, netbed_available

FENCE = 10.0  # ssh.fence_after: the cut host's tasks stop after it
KNOWN_HOSTS_LINES = 5000
NOTICED = "unreachable since"
LOST = "tfl: lost "  # the line tfl writes in a task's log when it loses the task's agent
STATUS_REPS = 3
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class ManyRun:
    """One configuration's figures (seconds, bytes)."""

    hosts: int
    per_host: int
    launch_s: float = 0.0
    foreground_cpu_s: float = 0.0
    launcher_cpu_s: float = 0.0  # the background launcher's, until every task was up
    recorded_s: float = 0.0  # launch → the record says the run is running (every start recorded)
    idle_s: float = 0.0
    idle_cpu_s: float = 0.0
    threads: int = 0  # the most seen during the idle window
    fds: int = 0
    idle_wchar: int = 0
    idle_write_bytes: int = 0
    record_bytes: int = 0
    status_s: list[float] = field(default_factory=list)
    status_head: str = ""
    noticed_s: float | None = None
    ended_s: float | None = None
    others_lost: list[str] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)

    @property
    def tasks(self) -> int:
        return self.hosts * self.per_host


def configurations(cfg: Config) -> list[tuple[int, int]]:
    return [(h, 1) for h in cfg.many_hosts] + [cfg.many_wide]


def many_host_runs(cfg: Config, ws: Workspace) -> list[ManyRun] | str:
    """The figures of every configuration, or why they could not be taken."""
    why = netbed_available()
    if why:
        return f"not measured: {why}"
    configs = configurations(cfg)
    bed = make_netbed(ws.root / "bed", max(h for h, _ in configs))
    job = loops_job(ws.root / "job")
    runs = []
    try:
        for hosts, per_host in configs:
            print(f"bench:   {hosts} hosts × {per_host} …", flush=True)
            runs.append(_measure(bed, ws, job, hosts, per_host, cfg.many_idle_s))
    finally:
        bed.teardown()
    if bed.leftovers():
        raise BenchError(f"the test bed left {bed.leftovers()}")
    return runs


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _io(pid: int) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())}


def _threads_fds(pid: int) -> tuple[int, int]:
    threads = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    return threads, len(os.listdir(f"/proc/{pid}/fd"))


def _long_known_hosts(short: Path, lines: int) -> str:
    """The bed's known_hosts, then other hosts' lines up to ``lines`` (names that never resolve)."""
    text = short.read_text()
    key = text.split(None, 1)[1].strip()
    have = len(text.splitlines())
    return text + "".join(f"host-{i}.example.invalid {key}\n" for i in range(max(0, lines - have)))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _measure(bed: NetBed, ws: Workspace, job: Path, hosts: int, per_host: int, idle: float) -> ManyRun:
    run = ManyRun(hosts, per_host, load=(load1(), 0.0))
    home = ws.home(f"many-{hosts}x{per_host}")
    known = home / "known_hosts"
    assert bed.known_hosts is not None
    known.write_text(bed.known_hosts.read_text())
    cluster = cluster_for(bed, home / "cluster.json", hosts, per_host, PYTHON, fence_after=FENCE, known_hosts=str(known))
    # As an installed tfl runs: its bytecode cached (this session's environment sets PYTHONDONTWRITEBYTECODE,
    # which would add the compiling of tfl's modules, ~0.3 s of CPU, to every command).
    env = {k: v for k, v in ws.env(home).items() if k != "PYTHONDONTWRITEBYTECODE"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    fg = subprocess.Popen([*tfl_command(), "launch", str(job), "--cluster", str(cluster), "--detach"], env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = fg.communicate(timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if fg.returncode != 0:
        raise BenchError(f"tfl launch --detach on {hosts} hosts exited {fg.returncode}: {err[-2000:]}")
    run.foreground_cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    launcher = int(record(home)["launcher_pid"])
    pids = wait_up(home, run.tasks, 900, lambda: None if _alive(launcher) else "the launcher exited")
    run.launch_s = time.perf_counter() - started
    run.launcher_cpu_s = _cpu_s(launcher)
    wait_recorded(home, "running", 900)  # the launcher records each start after its task runs: the idle begins then
    run.recorded_s = time.perf_counter() - started
    _idle(run, launcher, idle)
    state = home / "runs" / str(run_id(home)) / "state.json"
    run.record_bytes = state.stat().st_size
    _status(run, home, env, known)
    _cut(run, bed, home, launcher, pids, hosts, per_host)
    run.load = (run.load[0], load1())
    return run


def _idle(run: ManyRun, launcher: int, idle: float) -> None:
    cpu0, io0, t0 = _cpu_s(launcher), _io(launcher), time.perf_counter()
    while time.perf_counter() - t0 < idle:
        threads, fds = _threads_fds(launcher)
        run.threads, run.fds = max(run.threads, threads), max(run.fds, fds)
        time.sleep(1.0)
    io1 = _io(launcher)
    run.idle_s, run.idle_cpu_s = time.perf_counter() - t0, _cpu_s(launcher) - cpu0
    run.idle_wchar, run.idle_write_bytes = io1["wchar"] - io0["wchar"], io1["write_bytes"] - io0["write_bytes"]


def _status(run: ManyRun, home: Path, env: dict[str, str], known: Path) -> None:
    short = known.read_text()
    (home / "known_hosts.tmp").write_text(_long_known_hosts(known, KNOWN_HOSTS_LINES))
    (home / "known_hosts.tmp").replace(known)
    try:
        for _ in range(STATUS_REPS):
            started = time.perf_counter()
            result = subprocess.run([*tfl_command(), "status", str(run_id(home))], env=env, capture_output=True,
                                    text=True, timeout=300)
            run.status_s.append(time.perf_counter() - started)
            if result.returncode != 0 or "running" not in result.stdout:
                raise BenchError(f"tfl status on {run.hosts} hosts: {result.returncode} {result.stdout[-500:]} {result.stderr[-500:]}")
            run.status_head = "\n".join(result.stdout.splitlines()[:6])
    finally:
        (home / "known_hosts.tmp").write_text(short)
        (home / "known_hosts.tmp").replace(known)


def _cut(run: ManyRun, bed: NetBed, home: Path, launcher: int, pids: dict[str, int], hosts: int, per_host: int) -> None:
    victim = bed.addresses[hosts - 1]
    names = [n for n, _ in sorted(pids.items())]
    victims = {f"worker-{i}.log" for i in range(run.tasks - 1 - per_host, run.tasks - 1)}  # the last host's workers
    logs = home / "runs" / str(run_id(home)) / "logs"
    cut = time.perf_counter()
    bed.cut(victim)
    try:
        while time.perf_counter() - cut < FENCE + 300 and (run.noticed_s is None or run.ended_s is None):
            now = time.perf_counter() - cut
            if run.noticed_s is None and any(NOTICED in (logs / v).read_text(errors="replace") for v in sorted(victims)[:1]):
                run.noticed_s = now
            if run.ended_s is None and not _alive(launcher):
                run.ended_s = now
            time.sleep(0.05)
        run.others_lost = sorted(log.name for log in logs.glob("*.log") if log.name not in victims
                                 and any(m in log.read_text(errors="replace") for m in (NOTICED, LOST)))
        deadline = time.perf_counter() + FENCE + 60
        while any(_alive(p) for p in pids.values()) and time.perf_counter() < deadline:
            time.sleep(0.2)
        left = sorted(n for n in names if _alive(pids[n]))
        if left:
            raise BenchError(f"{len(left)} task(s) outlived the run on {hosts} hosts: {left[:5]}")
    finally:
        bed.join(victim)
    if run.noticed_s is None or run.ended_s is None:
        raise BenchError(f"cut of {victim} ({hosts} hosts): named after {run.noticed_s}, ended after {run.ended_s}")
    # The cut host's sshd session for the lost connection ends once its retransmissions reach us again
    # (a reset): within a minute of the join.
    deadline = time.perf_counter() + 90
    while (left_on_hosts := only_sshds(bed)) and time.perf_counter() < deadline:
        time.sleep(0.5)
    if left_on_hosts:
        shown = {host: [_cmdline(p) for p in found] for host, found in list(left_on_hosts.items())[:5]}
        raise BenchError(f"processes left on the hosts after the run: {shown}")


def _cmdline(pid: int) -> str:
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())[:120]}"
    except psutil.Error:
        return f"{pid} (gone)"


def _goals(r: ManyRun) -> dict[str, bool]:
    return {"launch CPU": r.foreground_cpu_s + r.launcher_cpu_s <= 0.030 * r.hosts + 1.0,
            "idle CPU": r.hosts < 256 or r.idle_cpu_s / r.idle_s <= 0.05,
            "threads": r.threads <= r.hosts + r.tasks + 16, "fds": r.fds <= r.hosts + r.tasks + 32,
            "record": r.record_bytes <= 4096 * r.tasks, "status": Stats.of(r.status_s).median <= 2.0,
            "cut host": (r.noticed_s or 1e9) <= 15.0 and not r.others_lost}


def many_hosts_section(cfg: Config, runs: list[ManyRun] | str) -> Section:
    target = ("launch CPU ≤ 30 ms × H + 1 s; idle CPU ≤ 5 % of a core at 256 hosts; threads ≤ H + T + 16, fds ≤ H + T + 32; "
              "record ≤ 4 KB × T; `tfl status RUN` ≤ 2 s; a cut host named ≤ 15 s, no other host lost")
    headers = ["hosts × tasks (T)", "launch → all running", "launch CPU (goal)", "idle CPU", "threads / fds (goals)",
               "written while idle", "record (per task)", "`tfl status RUN`", "cut: named / run ended / others lost"]
    section = Section(18, "Many hosts", target, headers)
    if isinstance(runs, str):
        section.verdict, section.headline = "not measured", runs
        section.rows = [["—", runs, "", "", "", "", "", "", ""]]
        return section
    missed: list[str] = []
    for r in runs:
        goals = _goals(r)
        missed += [f"{name} at {r.hosts}×{r.per_host}" for name, ok in goals.items() if not ok]
        mark = {name: "" if ok else " ✗" for name, ok in goals.items()}
        section.rows.append([
            f"{r.hosts} × {r.per_host} ({r.tasks})", f"{r.launch_s:.1f} s (recorded {r.recorded_s:.1f} s)",
            f"{r.foreground_cpu_s + r.launcher_cpu_s:.1f} s (fg {r.foreground_cpu_s:.1f} + bg {r.launcher_cpu_s:.1f}; "
            f"≤ {0.03 * r.hosts + 1:.1f}){mark['launch CPU']}",
            f"{100 * r.idle_cpu_s / r.idle_s:.1f} % over {r.idle_s:.0f} s{mark['idle CPU']}",
            f"{r.threads} / {r.fds} (≤ {r.hosts + r.tasks + 16} / {r.hosts + r.tasks + 32}){mark['threads']}{mark['fds']}",
            f"{r.idle_wchar / r.idle_s / 1024:.1f} KB/s (disk {r.idle_write_bytes / r.idle_s / 1024:.1f} KB/s)",
            f"{r.record_bytes / 1024:.0f} KB ({r.record_bytes / r.tasks / 1024:.1f} KB){mark['record']}",
            f"{Stats.of(r.status_s).fmt(unit=' s')}{mark['status']}",
            f"{r.noticed_s:.1f} s / {r.ended_s:.1f} s / {len(r.others_lost) or 'none'}{mark['cut host']}"])
    section.verdict = "met" if not missed else "missed"
    top = max(runs, key=lambda r: r.tasks)
    section.headline = (f"up to {max(r.hosts for r in runs)} hosts: launch {top.launch_s:.0f} s at {top.hosts}×{top.per_host}, "
                        f"status {max(Stats.of(r.status_s).median for r in runs):.2f} s at most"
                        + (f"; missed: {', '.join(missed)}" if missed else ""))
    section.notes = [
        f"Configurations {', '.join(f'{r.hosts}×{r.per_host}' for r in runs)}, one after another on one bed of "
        f"{max(r.hosts for r in runs)} hosts (each a network namespace with its own sshd; tests/netbed.py's large bed), "
        "one launch each, `--detach`, every task tests/jobs/loops.py (no TensorFlow).",
        "Launch: from spawning `tfl launch --detach` until every task had printed its first line; (recorded): until "
        "the run's record said `running` (the launcher records each start once the task's agent has reported it, "
        "rewriting the whole record each time). Launch CPU: the foreground `tfl launch --detach` (it reaches no host: "
        "the background launcher checks them on the connections the run keeps) plus the "
        "background launcher until every task had printed its first line. Idle: the background launcher's CPU over the "
        "window, its most threads and fds (sampled every second), and the bytes it wrote (/proc/PID/io `wchar`, every "
        "write call; `write_bytes`, what reached the disk).",
        f"`tfl status RUN` (the summary; {STATUS_REPS} runs) with the cluster's known_hosts grown to {KNOWN_HOSTS_LINES:,} "
        "lines: a run of more than 8 hosts whose launcher is alive is answered from its record, no host asked, so the "
        "file is not read; the known_hosts cost applies when hosts are asked (a launcher gone, or ≤ 8 hosts).",
        f"The cut: the last host's link down (its processes run on); named = its first task's log says `{NOTICED}`; "
        f"ended = the background launcher has exited; the cut host's tasks stop on their own after ssh.fence_after = "
        f"{FENCE:g} s. Then no process but its sshd is left on any host (checked by each namespace's processes).",
        "The machine (2 cores) was shared with other engineers' test suites: the load before/after each configuration is "
        "in the raw samples; wall and CPU figures grow with it.",
    ]
    section.raw = {"runs": [asdict(r) for r in runs], "idle_window_s": cfg.many_idle_s}
    return section


def write_section(doc: Path, section: Section) -> None:
    """§18 into docs/benchmarks.md in place (the other sections untouched, some written by hand):
    its summary row after §17's (or where it was), its text before the raw samples (or where it was)."""
    text = doc.read_text()
    row = summary_row(section)
    lines = text.splitlines()
    start = lines.index("## Summary") if "## Summary" in lines else len(lines)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    summary = [line for line in lines[start:end] if not line.startswith(f"| {section.number} | ")]
    last = max((i for i, line in enumerate(summary) if re.match(r"\| \d+ \| ", line)), default=None)
    if last is not None:
        summary.insert(last + 1, row)
    lines[start:end] = summary
    text = "\n".join(lines) + "\n"
    body = "\n".join(section_lines(section))
    heading = re.compile(rf"^## {section.number}\. .*?(?=^## )", re.M | re.S)
    if heading.search(text):
        text = heading.sub(lambda _: body + "\n", text, count=1)
    else:
        text = text.replace("\n## Raw samples", "\n" + body + "\n## Raw samples", 1)
    doc.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.many_hosts", description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="16,64,128,256", help="host counts, one task each")
    parser.add_argument("--wide", default="32x8", help="HOSTSxTASKS: the run with several tasks per host")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds the idle launcher is watched")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md", help="the report §18 is written into")
    parser.add_argument("--raw", type=Path, default=ROOT / "docs" / "samples" / "many-hosts.jsonl",
                        help="every sample, one JSON line per invocation (appended)")
    args = parser.parse_args(argv)
    wide = tuple(int(n) for n in args.wide.split("x"))
    cfg = replace(Config.full(), many_hosts=tuple(int(h) for h in args.hosts.split(",")),
                  many_wide=(wide[0], wide[1]), many_idle_s=args.idle)
    ws, started, load0, when = Workspace(), time.monotonic(), load1(), timestamp()
    try:
        runs = many_host_runs(cfg, ws)
    finally:
        ws.close()
    section = many_hosts_section(cfg, runs)
    section.took_s, section.load, section.measured_at = time.monotonic() - started, (load0, load1()), when
    argv_text = " ".join(argv if argv is not None else sys.argv[1:])
    on = machine()  # launch CPU is seconds of this CPU: another machine's figures compare only as ratios to their goals
    section.notes.append(f"Machine: {on['cpu']}, {on['cores']} cores, {on['memory']}; Python {on['python']}, {on['openssh']}.")
    section.notes.append(f"Measured by `sudo uv run python -m bench.many_hosts {argv_text}`".rstrip() + " (not by `python -m bench`, "
                         "which re-renders the whole report); raw samples: docs/samples/many-hosts.jsonl.")
    write_section(args.out, section)
    args.raw.parent.mkdir(parents=True, exist_ok=True)
    with args.raw.open("a") as raw:
        raw.write(json.dumps({"command": f"python -m bench.many_hosts {argv_text}".strip(), "measured_at": when,
                              "took_s": round(section.took_s, 1), "load": section.load, "machine": on, **section.raw}) + "\n")
    print("\n".join(section_lines(section)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
