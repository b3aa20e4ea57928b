"""TF_CONFIG from a Slurm allocation. Pure functions, no I/O.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from launcher.slurm.errors import SlurmLayoutError
from launcher.spec import Address, Topology, describe_error
from launcher.tfconfig import TaskId, tf_config

PORT_FIRST = 10000
PORT_END = 32768  # exclusive: Linux's default ephemeral port range starts here
PORT_BLOCK = 32
PORT_BLOCKS = (PORT_END - PORT_FIRST) // PORT_BLOCK  # 711
EVALUATOR_SLOT = PORT_BLOCK - 1
MAX_TASKS_PER_ADDRESS = EVALUATOR_SLOT  # 31: slots 0..30 for training tasks

# Set by the batch script for every step (see script.py), read by the task driver (task.py).
NODES_ENV = "TFL_SLURM_NODES"  # the job's nodes in Slurm's order: "n1=10.0.0.1,n2=10.0.0.2"
LAYOUT_ENV = "TFL_SLURM_TRAINING_LAYOUT"  # training tasks per node, in Slurm's form: "2(x3),1"

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
            raise SlurmLayoutError(f"{NODES_ENV}='{text}' is not name=addr,...; it is set by tfl's batch script")
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


def task_of_rank(rank: int) -> TaskId:
    """Rank 0 is the chief, rank k the worker k-1."""
    return TaskId("chief", 0) if rank == 0 else TaskId("worker", rank - 1)


def rank_of_task(task: TaskId) -> int:
    return 0 if task.type == "chief" else task.index + 1


def training_addresses(job_id: int, placed: Sequence[SlurmNode]) -> tuple[Address, ...]:
    """Each training rank's host:port: its node's NodeAddr, a port slot per address."""
    used: dict[str, int] = {}
    addresses = []
    for node in placed:
        slot = used.get(node.addr, 0)
        if slot >= MAX_TASKS_PER_ADDRESS:
            raise SlurmLayoutError(f"more than {MAX_TASKS_PER_ADDRESS} training tasks on address {node.addr} "
                                   f"(node {node.name}); use fewer tasks per node")
        used[node.addr] = slot + 1
        addresses.append(Address(node.addr, slot_port(job_id, slot)))
    return tuple(addresses)


def evaluator_address(job_id: int, node: SlurmNode) -> Address:
    return Address(node.addr, slot_port(job_id, EVALUATOR_SLOT))


def slurm_topology(job_id: int, nodes: Sequence[SlurmNode], counts: Sequence[int],
                   evaluator_node: SlurmNode | None = None) -> Topology:
    """The cluster of the job's tasks: chief, workers, and the evaluator if its node is given."""
    addresses = [str(a) for a in training_addresses(job_id, training_layout(nodes, counts))]
    cluster = {"chief": addresses[:1], "worker": addresses[1:]}
    if evaluator_node is not None:
        cluster["evaluator"] = [str(evaluator_address(job_id, evaluator_node))]
    try:
        return Topology.model_validate(cluster)
    except ValidationError as exc:
        raise SlurmLayoutError(f"the job's node addresses make no valid cluster: {describe_error(exc)}") from None


def slurm_tf_config(job_id: int, nodes: Sequence[SlurmNode], counts: Sequence[int], task: TaskId,
                    evaluator_node: SlurmNode | None = None) -> dict[str, Any]:
    """The TF_CONFIG of one task, the same shape as for every other backend."""
    if task.type == "evaluator" and evaluator_node is None:
        raise SlurmLayoutError("the evaluator's TF_CONFIG needs the node it runs on")
    topology = slurm_topology(job_id, nodes, counts, evaluator_node if task.type == "evaluator" else None)
    if task.is_training and rank_of_task(task) >= len(topology.chief) + len(topology.worker):
        raise SlurmLayoutError(f"task {task} is beyond the training step's {sum(counts)} tasks")
    return tf_config(topology, task)
