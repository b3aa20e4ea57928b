"""TF_CONFIG from a Slurm allocation. Pure functions, no I/O, stdlib only (it runs in every task).

Not TensorFlow's ``SlurmClusterResolver``, which sorts hosts lexically (``node10`` before
``node9``), addresses tasks by node name (names need not resolve) and uses one fixed port.
Here:

- **Order**: nodes in Slurm's order, as ``scontrol show hostnames $SLURM_JOB_NODELIST``
  prints them; tasks in rank order with block distribution (``srun --distribution=block``):
  the first ``counts[0]`` ranks on the first node, and so on. Rank 0 is the chief, rank k
  is worker k-1.
- **Addresses**: each node's ``NodeAddr`` from ``scontrol show node -o``.
- **Ports**: derived from the job id, so that two jobs on one node do not collide::

      block(job) = 10000 + (job_id mod 711) * 32          # 711 blocks of 32 in 10000..32767
      port(task) = block(job) + slot

  ``slot`` counts the training tasks that share an address, in rank order (0, 1, ...: one
  node with four tasks uses slots 0-3; two nodes that share one address, as in the test
  cluster, use 0 and 1); the evaluator always takes slot 31, so it never meets a training
  task whatever node it lands on. Hence at most 31 training tasks per address. All ports
  lie in 10000..32767: above the well-known and most registered service ports, and below
  Linux's default ephemeral range (``net.ipv4.ip_local_port_range`` = 32768-60999), where
  outgoing connections take their local ports. Two jobs on one node collide only if their
  ids differ by a multiple of 711 and they run at the same time; a restart reuses the
  job's ports, as restarts of the other backends do.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.contract import CHIEF, EVALUATOR, SLURM_NODES, TRAINING_TYPES, WORKER
from launcher.engines.slurm.node.errors import SlurmLayoutError

PORT_FIRST = 10000
PORT_END = 32768  # exclusive: Linux's default ephemeral port range starts here
PORT_BLOCK = 32
PORT_BLOCKS = (PORT_END - PORT_FIRST) // PORT_BLOCK  # 711
EVALUATOR_SLOT = PORT_BLOCK - 1
MAX_TASKS_PER_ADDRESS = EVALUATOR_SLOT  # 31: slots 0..30 for training tasks

_TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?")


@dataclass(frozen=True)
class SlurmNode:
    name: str
    addr: str


def port_block(job_id: int) -> int:
    """The first port of the job's block."""
    return PORT_FIRST + (job_id % PORT_BLOCKS) * PORT_BLOCK


def slot_port(job_id: int, slot: int) -> int:
    if not 0 <= slot < PORT_BLOCK:
        raise SlurmLayoutError(f"port slot {slot} is outside 0..{PORT_BLOCK - 1}; "
                               f"run at most {MAX_TASKS_PER_ADDRESS} training tasks per node")
    return port_block(job_id) + slot


def parse_hostnames(text: str) -> tuple[str, ...]:
    """``scontrol show hostnames LIST`` output: one node name per line, in Slurm's order."""
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def parse_node_addrs(text: str) -> dict[str, str]:
    """``scontrol show node -o [LIST]`` output (one node per line) -> NodeName: NodeAddr."""
    addrs = {}
    for line in text.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        addr = re.search(r"\sNodeAddr=(\S+)", line)
        if name and addr:
            addrs[name[1]] = addr[1]
    return addrs


def nodes_in_order(hostnames: Sequence[str], addrs: dict[str, str]) -> tuple[SlurmNode, ...]:
    """The job's nodes in Slurm's order, each with its NodeAddr."""
    if not hostnames:
        raise SlurmLayoutError("the job has no nodes (SLURM_JOB_NODELIST is empty); run inside a Slurm job")
    missing = [h for h in hostnames if h not in addrs]
    if missing:
        raise SlurmLayoutError(f"node {missing[0]} has no NodeAddr in `scontrol show node -o` output; "
                               "check that the node is known to slurmctld")
    if len(set(hostnames)) < len(hostnames):
        raise SlurmLayoutError(f"node list {','.join(hostnames)} names a node twice")
    return tuple(SlurmNode(h, addrs[h]) for h in hostnames)


def format_nodes(nodes: Sequence[SlurmNode]) -> str:
    """The value of ``TFL_SLURM_NODES``."""
    return ",".join(f"{n.name}={n.addr}" for n in nodes)


def parse_nodes(text: str) -> tuple[SlurmNode, ...]:
    """Inverse of ``format_nodes``."""
    nodes = []
    for item in text.split(","):
        name, sep, addr = item.partition("=")
        if not (name and sep and addr):
            raise SlurmLayoutError(f"{SLURM_NODES}='{text}' is not name=addr,...; it is set by tfl's batch script")
        nodes.append(SlurmNode(name, addr))
    return tuple(nodes)


def parse_tasks_per_node(text: str) -> tuple[int, ...]:
    """Slurm's tasks-per-node form (``SLURM_TASKS_PER_NODE``): ``"2(x3),1"`` -> (2, 2, 2, 1)."""
    counts: list[int] = []
    for part in text.split(","):
        match = _TASKS_PER_NODE.fullmatch(part.strip())
        if not match:
            raise SlurmLayoutError(f"'{text}' is not a tasks-per-node list like '2(x3),1'")
        counts += [int(match[1])] * int(match[2] or 1)
    return tuple(counts)


def format_tasks_per_node(counts: Sequence[int]) -> str:
    """Inverse of ``parse_tasks_per_node``, compressed as Slurm writes it."""
    parts: list[str] = []
    i = 0
    while i < len(counts):
        run = 1
        while i + run < len(counts) and counts[i + run] == counts[i]:
            run += 1
        parts.append(f"{counts[i]}(x{run})" if run > 1 else str(counts[i]))
        i += run
    return ",".join(parts)


def training_layout(nodes: Sequence[SlurmNode], counts: Sequence[int]) -> tuple[SlurmNode, ...]:
    """The node of each training rank (block distribution)."""
    if len(counts) != len(nodes):
        raise SlurmLayoutError(f"{len(counts)} task counts for {len(nodes)} nodes "
                               f"({','.join(n.name for n in nodes)}); the training step must span every node of the job")
    placed = tuple(node for node, count in zip(nodes, counts, strict=True) for _ in range(count))
    if not placed:
        raise SlurmLayoutError("the training step has no tasks; ask for at least one task per node")
    return placed


def task_of_rank(rank: int) -> tuple[str, int]:
    """Rank 0 is the chief, rank k the worker k-1."""
    return (CHIEF, 0) if rank == 0 else (WORKER, rank - 1)


def rank_of_task(task_type: str, index: int) -> int:
    return 0 if task_type == CHIEF else index + 1


def host_port(host: str, port: int) -> str:
    """``host:port``, IPv6 hosts in brackets (as launcher.describe.spec.Address prints them)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def training_slots(placed: Sequence[SlurmNode]) -> tuple[int, ...]:
    """Each training rank's port slot: how many earlier ranks share its address."""
    used: dict[str, int] = {}
    slots = []
    for node in placed:
        slot = used.get(node.addr, 0)
        if slot >= MAX_TASKS_PER_ADDRESS:
            raise SlurmLayoutError(f"more than {MAX_TASKS_PER_ADDRESS} training tasks on address {node.addr} "
                                   f"(node {node.name}); use fewer tasks per node")
        used[node.addr] = slot + 1
        slots.append(slot)
    return tuple(slots)


def training_addresses(job_id: int, placed: Sequence[SlurmNode]) -> tuple[str, ...]:
    """Each training rank's host:port: its node's NodeAddr, a port slot per address."""
    return tuple(host_port(n.addr, slot_port(job_id, slot)) for n, slot in zip(placed, training_slots(placed), strict=True))


def evaluator_address(job_id: int, node: SlurmNode) -> str:
    return host_port(node.addr, slot_port(job_id, EVALUATOR_SLOT))


def job_cluster(job_id: int, nodes: Sequence[SlurmNode], counts: Sequence[int],
                  evaluator_node: SlurmNode | None = None) -> dict[str, list[str]]:
    """TF_CONFIG's ``cluster`` for the job: chief, workers, and the evaluator if its node is given.

    Task types without tasks are left out, as launcher.plan.tfconfig.tf_config leaves them out.
    """
    addresses = training_addresses(job_id, training_layout(nodes, counts))
    cluster = {CHIEF: list(addresses[:1]), WORKER: list(addresses[1:])}
    if evaluator_node is not None:
        cluster[EVALUATOR] = [evaluator_address(job_id, evaluator_node)]
    return {kind: tasks for kind, tasks in cluster.items() if tasks}


def slurm_tf_config(job_id: int, nodes: Sequence[SlurmNode], counts: Sequence[int], task_type: str, index: int,
                    evaluator_node: SlurmNode | None = None) -> dict[str, Any]:
    """The TF_CONFIG of one task: the shape of launcher.plan.tfconfig.tf_config (a test holds them equal).

    Training tasks see only the training cluster; the evaluator sees it and itself. Not a
    call to tf_config: that needs launcher.describe.spec, whose pydantic import would cost every
    task's start 0.4-0.9 s on the test machine; this module is stdlib only.
    """
    if task_type == EVALUATOR:
        if evaluator_node is None or index != 0:
            raise SlurmLayoutError("the evaluator is evaluator:0, and its TF_CONFIG needs the node it runs on")
        return {"cluster": job_cluster(job_id, nodes, counts, evaluator_node), "task": {"type": task_type, "index": 0}}
    if task_type not in TRAINING_TYPES or (task_type == CHIEF and index != 0):
        raise SlurmLayoutError(f"'{task_type}:{index}' is not a task of a Slurm run (chief:0, worker:N or evaluator:0)")
    if rank_of_task(task_type, index) >= sum(counts):
        raise SlurmLayoutError(f"task {task_type}:{index} is beyond the training step's {sum(counts)} tasks")
    return {"cluster": job_cluster(job_id, nodes, counts), "task": {"type": task_type, "index": index}}


# --- an elastic run: the nodes left after a failure ---------------------------------------
NODE_FAILURE = re.compile(r"srun: error: Node failure on (\S+)")  # srun's line when Slurm lost a node under its step
_BAD_NODE_STATES = ("DOWN", "NOT_RESPONDING", "FAIL")  # scontrol's State= flags of a node that cannot run a step


def failed_nodes(srun_err: str) -> tuple[str, ...]:
    """The nodes srun says Slurm lost under the step, in order."""
    return tuple(dict.fromkeys(NODE_FAILURE.findall(srun_err)))


def parse_job_nodelist(text: str) -> str | None:
    """``scontrol show job -o JOB`` output -> its NodeList (what the job holds now), or None."""
    match = re.search(r"(?:^|\s)NodeList=(\S+)", text)
    return match[1] if match and match[1] != "(null)" else None


def unusable_nodes(text: str) -> set[str]:
    """``scontrol show node -o LIST`` output -> the nodes Slurm holds down, failed or not responding."""
    bad = set()
    for line in text.splitlines():
        name, state = re.search(r"(?:^|\s)NodeName=(\S+)", line), re.search(r"\sState=(\S+)", line)
        if name and state and any(flag in state[1].split("+") or state[1].startswith(flag) for flag in _BAD_NODE_STATES):
            bad.add(name[1])
    return bad


def surviving_nodes(nodes: Sequence[SlurmNode], counts: Sequence[int], usable: Collection[str]
                    ) -> tuple[tuple[SlurmNode, ...], tuple[int, ...]]:
    """The nodes of the last attempt that are ``usable``, in order, with their training task counts."""
    kept = [(n, c) for n, c in zip(nodes, counts, strict=True) if n.name in usable]
    return tuple(n for n, _ in kept), tuple(c for _, c in kept)
