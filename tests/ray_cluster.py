"""A private Ray cluster of three nodes on this machine, on loopback only (session fixture).

``ray.cluster_utils.Cluster``: a head and two more nodes, each its own raylet with one logical
CPU and an 80 MB object store, all on 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` and
``node_ip_address``: Ray would take the machine's interface otherwise). Ray tells the nodes
apart by node id, so STRICT_SPREAD puts each task on a node of its own. The nodes' session
dirs and their per-user cache (where the task runners keep their dirs) lie in a private temp
dir. At the end every Ray process the fixture started is stopped by pid, and the fixture
proves none is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "node_ip_address": "127.0.0.1"}
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


@dataclass
class RayCluster:
    cluster: Any  # ray.cluster_utils.Cluster
    root: str  # the private dir of its sessions and caches
    pids: set[int] = field(default_factory=set)  # every Ray process it started (more join as nodes are added)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def nodes(self) -> list[Any]:
        return [self.cluster.head_node, *self.cluster.worker_nodes]

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
            known = self.pids | {c.pid for p in self.pids for c in _children(p)}
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
            self.pids.update(i.process.pid for i in infos)

    def kill_node(self, node_id: str) -> None:
        """A node's death: its raylet and every process under it (workers, agents), SIGKILL at once.
        Never through ``Cluster.remove_node``: on the head that also takes the GCS down (the whole cluster)."""
        node = self.node_of(node_id)
        raylet = next(i.process.pid for i in node.all_processes["raylet"])
        victims = [raylet, *(c.pid for c in _children(raylet))]
        _kill(victims)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _node_args() -> dict[str, Any]:
    """A node's arguments, with its agents' ports given: a raylet otherwise waits a fixed time for the
    port files its agents write, and dies when they are slow to start (a loaded machine)."""
    names = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")
    socks = [socket.socket() for _ in names]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return {**NODE_ARGS, **{name: sock.getsockname()[1] for name, sock in zip(names, socks, strict=True)}}
    finally:
        for sock in socks:
            sock.close()


def _alive(pids: set[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append(pid)
        except psutil.Error:
            pass
    return found


def _of_root(root: str) -> set[int]:
    """Every live process whose command line names the cluster's private dir (its session dir is
    there): Ray's GCS, raylets, workers and helpers, also those of a node that failed to start."""
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(root in part for part in proc.info["cmdline"] or ()):
            found.add(proc.info["pid"])
    return found


def _kill(pids: set[int] | list[int]) -> None:
    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


@contextlib.contextmanager
def _urgent_start(root: str) -> Iterator[None]:
    """Start Ray's processes a little ahead of the machine's other work (nice -5, where allowed), then
    put every one of them back to the normal priority: a raylet gives up after a fixed ~15 s wait for
    its Python agents, whose start-up (imports) takes longer than that on a loaded 2-core machine."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -5)
        raised = True
    except OSError:  # not allowed (not root): start at the normal priority
        raised = False
    try:
        yield
    finally:
        if raised:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
            for pid in _of_root(root):
                try:
                    os.setpriority(os.PRIO_PROCESS, pid, 0)
                except OSError:
                    pass


def start_ray_cluster(nodes: int = 3, tries: int = 3) -> RayCluster:
    """The cluster; a node that does not come up within Ray's 30 s (a loaded machine) is tried again."""
    for attempt in range(tries):
        root = tempfile.mkdtemp(prefix="tfl-ray-")  # short: Ray's unix sockets live under it (107-byte limit)
        try:
            with _urgent_start(root):
                return _start(root, nodes)
        except Exception:
            _kill(_of_root(root))
            shutil.rmtree(root, ignore_errors=True)
            if attempt == tries - 1:
                raise
    raise AssertionError("unreachable")


def _start(root: str, nodes: int) -> RayCluster:
    from ray.cluster_utils import Cluster


    os.environ.update(ENV, XDG_CACHE_HOME=os.path.join(root, "cache"))  # the nodes inherit this process's env
    cluster = Cluster(initialize_head=True, head_node_args={**_node_args(), "include_dashboard": False,
                                                            "temp_dir": os.path.join(root, "t")})
    found = RayCluster(cluster, root)
    found._note(cluster.head_node)
    for _ in range(nodes - 1):
        found.add_node()
    return found


def stop_ray_cluster(found: RayCluster) -> list[int]:
    """Shut the cluster down, kill by pid whatever of it outlived that; the pids that were left."""
    pids = set(found.pids) | _of_root(found.root)
    for pid in list(pids):  # workers and runners the raylets started are theirs: take them too
        pids.update(c.pid for c in _children(pid))
    try:
        found.cluster.shutdown()
    except Exception:  # noqa: BLE001 (a node already removed by a test; the pids below are the proof)
        pass
    deadline = time.monotonic() + 15
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _alive(pids | _of_root(found.root))
    _kill(left)
    shutil.rmtree(found.root, ignore_errors=True)
    return left


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    saved = dict(os.environ)
    os.environ.update(ENV)  # before Ray is imported: it reads some of these once
    pytest.importorskip("ray")
    found = start_ray_cluster()
    try:
        yield found
    finally:
        left = stop_ray_cluster(found)
        os.environ.clear()
        os.environ.update(saved)
        assert not left, f"Ray processes left after the cluster's shutdown (killed now): {left}"
