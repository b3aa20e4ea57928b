"""15. Ray: launch → every task running against the same job over SSH on as many hosts, a
node's death → noticed, and the import cost of `tfl --help` / `tfl status` against main.
`uv run python -m bench.ray [--reps N] [--rounds N]` prints the section's tables.

Ray: a private five-node cluster on loopback (``tests.ray_cluster``: a head, where tfl
connects, with no CPU for tasks, and four nodes of one logical CPU each, an 80 MB object store
each, all on 127.0.0.1, Ray's default health checks); two tiny tasks (chief,
worker) under STRICT_SPREAD, so each on a node of its own. SSH: the same tiny job over the
bench's private sshd on 127.0.0.2 and 127.0.0.3 (``bench.ssh``). Both launch from the CLI
and are timed from spawning ``tfl launch`` to the last task's first line (the job's own
clock). Node death: a detached run of two tasks that sleep; the worker's node is killed
(raylet and every process on it, SIGKILL), and the time until the run's record says the
worker failed is measured; Ray's health check (``health_check_period_ms`` 3000 ×
``health_check_failure_threshold`` 5, after ``health_check_initial_delay_ms`` 5000 at a
node's start; each check times out after ``health_check_timeout_ms`` 10000) decides it.
Import cost: `python -m launcher --help` and `python -m launcher status` (an empty store) from
this checkout and from main (the merge base, unpacked by `git archive` into a temp dir), in
alternating rounds with the same interpreter, the ratio taken within each round; and the
modules each imports (``ray`` must not be among them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.common import TINY, Workspace, tfl_command
from bench.runs import GroupRun
from bench.ssh import _launch as ssh_launch
from bench.ssh import _start_sshd
from tests.ray_cluster import RayCluster, start_ray_cluster, stop_ray_cluster


def _description(home: Path, address: str, **ray: object) -> Path:
    path = home / "ray.json"
    (home / "shared").mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"ray": {"address": address, "workers": 1, **ray}, "storage": {"path": str(home / "shared")}}))
    return path


def ray_launch(ws: Workspace, cluster: RayCluster, rep: int) -> float:
    home = ws.home(f"ray-r{rep}")
    home.mkdir(parents=True, exist_ok=True)
    spawned = time.time()
    started = time.monotonic()
    out = subprocess.run([*tfl_command(), "launch", str(TINY), "--cluster", str(_description(home, cluster.address)),
                          "--", "--sleep", "0.5"], env=ws.env(home), capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - started
    if out.returncode != 0:
        raise RuntimeError(f"tfl launch on Ray exited {out.returncode}: {out.stderr[-500:]}")
    (run_dir,) = (home / "runs").iterdir()
    return GroupRun(wall, run_dir, spawned).all_started_s(2)


def node_death(ws: Workspace, cluster: RayCluster, rep: int) -> float:
    """Seconds from the worker's node killed to the record saying the worker failed."""
    home = ws.home(f"ray-death-r{rep}")
    home.mkdir(parents=True, exist_ok=True)
    env = ws.env(home)
    out = subprocess.run([*tfl_command(), "launch", str(TINY), "--cluster", str(_description(home, cluster.address)),
                          "--detach", "--", "--sleep", "600"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    (run_dir,) = (home / "runs").iterdir()
    state = run_dir / "state.json"
    deadline = time.monotonic() + 300
    while not all(t["state"] == "running" for t in json.loads(state.read_text())["tasks"]):
        assert time.monotonic() < deadline, "the tasks never ran"
        time.sleep(0.2)
    node = json.loads(state.read_text())["plan"]["unit"]["nodes"]["worker:0"]
    killed = time.time()
    cluster.kill_node(node)
    while True:
        worker = next(t for t in json.loads(state.read_text())["tasks"] if t["task"] == "worker:0")
        if worker["ended"]:
            noticed = float(worker["ended"]) - killed
            break
        assert time.monotonic() < deadline + 120, "the node's death was never noticed"
        time.sleep(0.1)
    deadline = time.monotonic() + 120
    while json.loads(state.read_text())["state"] in ("starting", "running", "restarting"):
        assert time.monotonic() < deadline, "the run did not end after its worker's node died"
        time.sleep(0.2)
    return noticed  # the cluster's four task nodes leave two for the next repetition's tasks, up to 3 repetitions


ROOT = Path(__file__).resolve().parents[1]
MODULES = ("import sys; sys.argv = ['tfl', *sys.argv[1:]]\nfrom launcher.cli import main\ntry:\n    main()\n"
           "except SystemExit:\n    pass\nprint(len(sys.modules), 'ray' in sys.modules, file=sys.stderr)")


def _main_checkout(into: Path) -> Path:
    """main at the merge base, unpacked (no worktree: nothing of the repository changes)."""
    base = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", base, "launcher"], cwd=ROOT, capture_output=True, check=True).stdout
    tar = into / "main.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into / "main", filter="data")
    return into / "main"


def _tfl(code_root: Path, home: Path, *args: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(code_root), "TFL_HOME": str(home)}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "launcher", *args], cwd=code_root, env=env, capture_output=True, check=True, timeout=120)
    return time.monotonic() - started


def _modules(code_root: Path, home: Path, *args: str) -> tuple[int, bool]:
    env = {**os.environ, "PYTHONPATH": str(code_root), "TFL_HOME": str(home)}
    out = subprocess.run([sys.executable, "-c", MODULES, *args], cwd=code_root, env=env, capture_output=True, text=True,
                         timeout=120)
    count, has_ray = out.stderr.strip().splitlines()[-1].split()
    return int(count), has_ray == "True"


def import_cost(rounds: int) -> None:
    """`tfl --help` and `tfl status`, this checkout / main, alternating which goes first; 2 warm-up rounds dropped."""
    with tempfile.TemporaryDirectory(prefix="tfl-bench-imports-") as tmp:
        main, home = _main_checkout(Path(tmp)), Path(tmp) / "home"
        home.mkdir(mode=0o700)
        print("| command | modules (this / main), ray imported | this checkout | main | this / main (same round) |")
        print("|---|---|---|---|---|")
        for args in (("--help",), ("status",)):
            ours: list[float] = []
            theirs: list[float] = []
            for r in range(rounds + 2):
                order = [(ROOT, ours), (main, theirs)] if r % 2 else [(main, theirs), (ROOT, ours)]
                for code_root, into in order:
                    took = _tfl(code_root, home, *args)
                    if r >= 2:
                        into.append(took)
            (n_ours, ray_ours), (n_main, _) = _modules(ROOT, home, *args), _modules(main, home, *args)
            ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
            print(f"| `tfl {' '.join(args)}` | {n_ours} / {n_main}, ray: {'yes' if ray_ours else 'no'} | {_fmt(ours, 'ms', 1000)} | "
                  f"{_fmt(theirs, 'ms', 1000)} | {_fmt(ratios, '×')} |")
        print(f"\nrounds={rounds} (+2 warm-up), load {os.getloadavg()[0]:.1f}")


def _fmt(values: list[float], unit: str = "s", scale: float = 1.0) -> str:
    v = [x * scale for x in values]
    digits = 0 if unit == "ms" else 2
    return f"{statistics.median(v):.{digits}f} {unit} ({min(v):.{digits}f}–{max(v):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3, choices=(1, 2, 3), help="each node death takes a task node for good")
    parser.add_argument("--rounds", type=int, default=12, help="rounds of the import-cost comparison (0: skip it)")
    parser.add_argument("--no-cluster", action="store_true", help="only the import cost")
    args = parser.parse_args()
    if args.rounds:
        import_cost(args.rounds)
    if args.no_cluster:
        return
    print(f"\nload before the cluster: {os.getloadavg()[0]:.1f}")
    ws = Workspace()
    cluster = start_ray_cluster()
    sshd_dir = ws.root / "sshd"
    server, port = _start_sshd(sshd_dir, ("127.0.0.2", "127.0.0.3"), skip_bashrc=True)
    rays, sshs, deaths = [], [], []
    try:
        ray_launch(ws, cluster, -1)  # warm-up: Ray's first upload of the job dir and kit, the workers' first start
        for rep in range(args.reps):
            rays.append(ray_launch(ws, cluster, rep))
            sshs.append(ssh_launch(ws, sshd_dir, server.pid, port, 2, rep).all_started_s)
        deaths = [node_death(ws, cluster, rep) for rep in range(args.reps)]
    finally:
        server.terminate()
        server.wait(10)
        left = stop_ray_cluster(cluster)
        ws.close()
    ratios = [r / s for r, s in zip(rays, sshs, strict=True)]

    def fmt(values: list[float], unit: str = "s") -> str:
        return f"{statistics.median(values):.2f} {unit} ({min(values):.2f}–{max(values):.2f})"
    print("| measure | SSH (2 hosts) | Ray (2 nodes) | Ray / SSH (same repetition) |")
    print("|---|---|---|---|")
    print(f"| launch → every task running | {fmt(sshs)} | {fmt(rays)} | {fmt(ratios, '×')} |")
    print(f"| the worker's node killed → tfl has recorded the worker's failure |  | {fmt(deaths)} |  |")
    print(f"\nreps={args.reps}, load after: {os.getloadavg()[0]:.1f}, Ray processes left after the cluster's shutdown: {left}")


if __name__ == "__main__":
    main()
