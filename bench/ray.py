"""15. Ray: launch → every task running against the same job over SSH on as many hosts, and a
node's death → noticed. `uv run python -m bench.ray [--reps N]` prints the section's table.

Ray: a private three-node cluster on loopback (``tests.ray_cluster``: a head and two nodes,
one logical CPU and an 80 MB object store each, all on 127.0.0.1); two tiny tasks (chief,
worker) under STRICT_SPREAD, so each on a node of its own. SSH: the same tiny job over the
bench's private sshd on 127.0.0.2 and 127.0.0.3 (``bench.ssh``). Both launch from the CLI
and are timed from spawning ``tfl launch`` to the last task's first line (the job's own
clock). Node death: a detached run of two tasks that sleep; the worker's node is killed
(raylet and every process on it, SIGKILL), and the time until the run's record says the
worker failed is measured; Ray's health check (``health_check_period_ms`` 3000 ×
``health_check_failure_threshold`` 5, after ``health_check_initial_delay_ms`` 5000 at a
node's start; each check times out after ``health_check_timeout_ms`` 10000) decides it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
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
    cluster.add_node()  # back to three nodes for the next repetition
    return noticed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
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
    print(f"\nreps={args.reps}, Ray processes left after the cluster's shutdown: {left}")


if __name__ == "__main__":
    main()
