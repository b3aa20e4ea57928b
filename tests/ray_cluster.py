"""A private Ray cluster of five nodes on this machine, on loopback only (module fixture).

``ray.cluster_utils.Cluster``: a head and four more nodes, each its own raylet with an 80 MB
object store, all on 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` and
``node_ip_address``: Ray would take the machine's interface otherwise). The head has no CPU
for tasks: it is the node tfl's launcher (a Ray driver) connects to, since a driver on a host
of several nodes joins the head, and a driver's node must outlive the run (its actors and
placement group are the driver's: they die with its node). The four others have one logical
CPU each. Ray tells the nodes apart by node id, so STRICT_SPREAD puts each task on a node of
its own; a run of three tasks leaves a spare node, so a test that kills a task's node finds the
group a place again at once (as a cluster with a free node would) instead of racing a new
node's start.

Ray's node-death detection is shortened in the tests (``TEST_SYSTEM_CONFIG``: a health check
every second, five failures in a row); the bench keeps Ray's defaults.

The nodes' session dirs, Ray's address file (``RAY_TMPDIR``) and their per-user cache (where the
task runners keep their dirs) lie in a private temp dir. The environment variables the cluster
needs are set in this process only while it lives (its nodes, also those added later, inherit
them); ``stop_ray_cluster`` puts ``os.environ`` back exactly as it was, stops every Ray process
it started by identity (pid and start time), and returns those it had to kill. The fixture also proves
that no private dir of a cluster this process stopped was made again (``made_again``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

from launcher.describe.ports import free_ports

NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
NODES = 5  # the head (no CPU: the launcher's node) and four task nodes
# Node death noticed in about 5 s (a killed raylet's checks fail at once) rather than Ray's ~15 s;
# each check still waits Ray's default 10 s for a slow raylet, so a loaded machine is not taken for a dead one.
TEST_SYSTEM_CONFIG: dict[str, Any] = {"health_check_period_ms": 1000, "health_check_failure_threshold": 5}
STOPPED_ROOTS: list[str] = []  # the private dirs of the clusters this process stopped (``made_again``)


@dataclass
class RayCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    root: str  # the private dir of its sessions and caches
    saved_env: dict[str, str]  # os.environ before the cluster: put back by stop_ray_cluster
    # Every Ray process it started (more join as nodes are added), by identity: pid and start time. By the
    # module's end the pid of one that ended (a killed node's) may be another's: pid_max 32768 wraps in minutes.
    procs: set[psutil.Process] = field(default_factory=set)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def nodes(self) -> list[Any]:
        return [self.cluster.head_node, *self.cluster.worker_nodes]

    def task_nodes(self) -> list[Any]:
        """The nodes a task can be placed on (the head has no CPU), alive or not."""
        return list(self.cluster.worker_nodes)

    def node_of(self, node_id: str) -> Any:
        return next(n for n in self.nodes() if n.node_id == node_id)

    def add_node(self, tries: int = 3) -> Any:
        """A node more; one whose raylet gave up waiting for its agents (a loaded machine) is
        stopped by pid and tried again."""
        with _urgent_start(self.root):
            return self._add_node(tries)

    def _add_node(self, tries: int) -> Any:
        for attempt in range(tries):
            before = _of_root(self.root)
            known = self.procs | {c for p in self.procs for c in _children(p)}
            try:
                node = self.cluster.add_node(**_node_args())
            except Exception:
                _kill(_of_root(self.root) - before - known)
                if attempt == tries - 1:
                    raise
                continue
            self._note(node)
            self.cluster.wait_for_nodes()
            return node
        raise AssertionError("unreachable")

    def _note(self, node: Any) -> None:
        for infos in node.all_processes.values():
            self.procs.update(p for p in map(_process, (i.process.pid for i in infos)) if p is not None)

    def kill_node(self, node_id: str) -> None:
        """A node's death: its raylet and every process under it (workers, agents), SIGKILL at once.
        Never through ``Cluster.remove_node``: on the head that also takes the GCS down (the whole cluster)."""
        node = self.node_of(node_id)
        assert node is not self.cluster.head_node, "the head is the launcher's node: no task runs there"
        raylet = _process(next(i.process.pid for i in node.all_processes["raylet"]))
        if raylet is not None:
            _kill([raylet, *_children(raylet)])


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True) if proc.is_running() else []
    except psutil.Error:
        return []


def _node_args() -> dict[str, Any]:
    """A node's arguments, with its agents' ports given: a raylet otherwise waits a fixed time for the
    port files its agents write, and dies when they are slow to start (a loaded machine)."""
    names = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")
    return {**NODE_ARGS, **dict(zip(names, free_ports(len(names)), strict=True))}


def _alive(procs: set[psutil.Process]) -> list[psutil.Process]:
    """Those still running (is_running: the same pid *and* start time) and not zombies."""
    found = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            pass
    return sorted(found, key=lambda p: p.pid)


def _of_root(root: str) -> set[psutil.Process]:
    """Every live process whose command line names the cluster's private dir (its session dir is
    there): Ray's GCS, raylets, workers and helpers, also those of a node that failed to start."""
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(root in part for part in proc.info["cmdline"] or ()):
            found.add(proc)
    return found


def _kill(procs: set[psutil.Process] | list[psutil.Process]) -> None:
    for proc in procs:
        try:
            if proc.is_running():  # never a process that got the pid of one of ours that ended
                proc.kill()
        except psutil.Error:
            pass


@contextlib.contextmanager
def _urgent_start(root: str) -> Iterator[None]:
    """Start Ray's processes a little ahead of the machine's other work (nice -5, where allowed), then
    put every one of them back to this process's own priority: a raylet gives up after a fixed ~15 s wait for
    its Python agents, whose start-up (imports) takes longer than that on a loaded 2-core machine."""
    normal = os.getpriority(os.PRIO_PROCESS, 0)  # this process's own (e.g. 10 under `nice -n 10 pytest`)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, min(normal, 0) - 5)
        raised = True
    except OSError:  # not allowed (not root): start at the normal priority
        raised = False
    try:
        yield
    finally:
        if raised:
            os.setpriority(os.PRIO_PROCESS, 0, normal)
            for proc in _of_root(root):
                try:
                    os.setpriority(os.PRIO_PROCESS, proc.pid, normal)
                except OSError:
                    pass


def start_ray_cluster(nodes: int = NODES, system_config: dict[str, Any] | None = None, tries: int = 3) -> RayCluster:
    """The cluster; a node that does not come up within Ray's 30 s (a loaded machine) is tried again.
    ``system_config``: Ray's ``_system_config`` for the head (None: Ray's defaults)."""
    saved = dict(os.environ)
    for attempt in range(tries):
        root = tempfile.mkdtemp(prefix="tfl-ray-")  # short: Ray's unix sockets live under it (107-byte limit)
        try:
            with _urgent_start(root):
                return _start(root, nodes, saved, system_config or {})
        except Exception:
            _kill(_of_root(root))
            shutil.rmtree(root, ignore_errors=True)
            STOPPED_ROOTS.append(root)
            _restore_env(saved)
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _restore_env(saved: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(saved)


def _start(root: str, nodes: int, saved: dict[str, str], system_config: dict[str, Any]) -> RayCluster:
    from ray.cluster_utils import Cluster

    # The nodes inherit this process's env (also those added later): until stop_ray_cluster puts it back.
    os.makedirs(os.path.join(root, "ray"), mode=0o700)  # RAY_TMPDIR/ray: Ray's address file (else /tmp/ray, shared)
    os.environ.update(ENV, XDG_CACHE_HOME=os.path.join(root, "cache"), RAY_TMPDIR=root)
    # A copy: Ray writes the session's spill dir into the dict it is given, and a later cluster of this process
    # (another module's, a retried start) handed that dict made the stopped cluster's session dir again (its spill dir).
    cluster = Cluster(initialize_head=True, head_node_args={**_node_args(), "num_cpus": 0, "include_dashboard": False,
                                                            "temp_dir": os.path.join(root, "t"),
                                                            "_system_config": dict(system_config)})
    found = RayCluster(cluster, root, saved)
    found._note(cluster.head_node)
    for _ in range(nodes - 1):
        found.add_node()
    return found


def stop_ray_cluster(found: RayCluster) -> list[int]:
    """Shut the cluster down, kill whatever of it outlived that, put ``os.environ`` back as it
    was before the cluster; the pids that were left."""
    procs = set(found.procs) | _of_root(found.root)
    for proc in list(procs):  # workers and runners the raylets started are theirs: take them too
        procs.update(_children(proc))
    try:
        found.cluster.shutdown()
    except Exception:  # noqa: BLE001 (a node already removed by a test; the pids below are the proof)
        pass
    deadline = time.monotonic() + 15
    while _alive(procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(procs | _of_root(found.root))
    _kill(left)
    shutil.rmtree(found.root, ignore_errors=True)
    STOPPED_ROOTS.append(found.root)
    _restore_env(found.saved_env)
    return [p.pid for p in left]


def made_again() -> list[str]:
    """The private dirs of this process's stopped clusters that exist again (removed now): Ray made them again."""
    back = [root for root in STOPPED_ROOTS if os.path.exists(root)]
    for root in back:
        shutil.rmtree(root, ignore_errors=True)
    return back


def task_runners(found: RayCluster) -> list[int]:
    """The live actor processes of tfl's task runners on the cluster's nodes (``ray::TaskRunner...``)."""
    procs = set(found.procs)
    for proc in list(procs):
        procs.update(_children(proc))
    runners = []
    for proc in _alive(procs):
        try:
            if proc.cmdline()[:1] and proc.cmdline()[0].startswith("ray::TaskRunner"):
                runners.append(proc.pid)
        except psutil.Error:
            pass
    return runners


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    """The cluster for one test module; afterwards the proof that no Ray process of it is left, that
    this process is not connected to Ray, and that ``os.environ`` is exactly what it was."""
    saved = dict(os.environ)
    try:
        os.environ.update(ENV)  # before Ray is imported: it reads some of these once
        if os.environ.get("CI") == "true":  # the dev group installs the extra: in CI its absence is a failure
            import ray
        else:
            ray = pytest.importorskip("ray")
        found = start_ray_cluster(system_config=TEST_SYSTEM_CONFIG)
    except BaseException:
        _restore_env(saved)
        raise
    try:
        yield found
    finally:
        left = stop_ray_cluster(found)
        connected = ray.is_initialized()
        if connected:
            ray.shutdown()
        changed = sorted(k for k in {*found.saved_env, *os.environ} if found.saved_env.get(k) != os.environ.get(k))
        _restore_env(saved)  # also without what importing Ray set (RAY_CLIENT_MODE) and ENV
        back = made_again()  # this cluster's own, or one an earlier cluster of this process left
        assert not left, f"Ray processes left after the cluster's shutdown (killed now): {left}"
        assert not connected, "the test process was left connected to Ray (ray.init without ray.shutdown)"
        assert not changed, f"environment variables not restored after the Ray cluster: {changed}"
        assert not back, f"the dirs of Ray clusters stopped before were made again (removed now): {back}"
