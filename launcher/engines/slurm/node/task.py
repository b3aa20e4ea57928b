"""The small driver each srun step of a tfl batch script runs (``python -m launcher.engines.slurm.node.task``).

- ``nodes``: run once in the batch step; prints the job's nodes in Slurm's order with their
  NodeAddr (``scontrol show hostnames`` and ``scontrol show node -o``), for ``TFL_SLURM_NODES``.
- ``survivors SRUN_ERR ATTEMPT`` (an elastic run, in the batch step after a failed training
  step): the nodes of that attempt that Slurm still gives the job and holds usable (``scontrol
  show job`` and ``show node``; those srun said failed are out too). Prints the ``lost`` event,
  then the next attempt's ``TFL_SLURM_NODES``, its layout and the lost nodes, one a line; exit 3 when no node was lost.
- ``training JOB [ARGS]`` / ``evaluator JOB [ARGS]``: run in every task of a step; builds
  the task's TF_CONFIG from Slurm's variables (SLURM_JOB_ID, SLURM_PROCID, SLURMD_NODENAME)
  and the batch script's, notes where it runs (node, address, pid) in the run dir for the
  launcher, sends the task's output to its log in the run dir, and execs the job with
  TF_CONFIG in its environment (never on a command line).

Errors are one line on stderr (srun passes it to the step's stderr file in the run dir) and
exit status 2.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.contract import ATTEMPT, EVALUATOR, LOGS_SUBDIR, RUN_DIR, SLURM_LAYOUT, SLURM_NODES, TF_CONFIG, task_slug, task_variables
from launcher.engines.slurm.node.batch import EVALUATOR_ROLE, TRAINING_ROLE, LostNodes, RunFiles, TaskInfo, write_task_info
from launcher.engines.slurm.node.errors import SlurmError, SlurmLayoutError
from launcher.engines.slurm.node.nodes import (
    EVALUATOR_SLOT,
    failed_nodes,
    format_nodes,
    format_tasks_per_node,
    host_port,
    nodes_in_order,
    parse_hostnames,
    parse_job_nodelist,
    parse_node_addrs,
    parse_nodes,
    parse_tasks_per_node,
    rank_of_task,
    slot_port,
    slurm_tf_config,
    surviving_nodes,
    task_of_rank,
    training_layout,
    training_slots,
    unusable_nodes,
)
from launcher.errors import TflError
from launcher.tasklog import attempt_banner

ROLES = (TRAINING_ROLE, EVALUATOR_ROLE)


@dataclass(frozen=True)
class TaskStart:
    """What one task runs: the job's argv, its environment, its log and its address."""

    task: str  # chief:0, worker:N, evaluator:0
    node: str
    host: str  # the task's TF_CONFIG address: its node's NodeAddr ...
    port: int  # ... and its port (see nodes.py)
    argv: tuple[str, ...]
    env: dict[str, str]
    log_path: str
    run_dir: str
    attempt: int


def _need(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if not value:
        raise SlurmLayoutError(f"{name} is not set; `python -m launcher.engines.slurm.node.task` runs inside a step of tfl's batch script")
    return value


def _number(environ: Mapping[str, str], name: str) -> int:
    value = _need(environ, name)
    if not value.isdigit():
        raise SlurmLayoutError(f"{name}={value!r} is not a number")
    return int(value)


def task_start(role: str, job: str, job_args: Sequence[str], environ: Mapping[str, str], python: str) -> TaskStart:
    """The task this process is, from the step's environment. Pure: ``environ`` is passed in."""
    if role not in ROLES:
        raise SlurmError(f"unknown role '{role}'; use one of {', '.join(ROLES)}")
    job_id = _number(environ, "SLURM_JOB_ID")
    nodes = parse_nodes(_need(environ, SLURM_NODES))
    counts = parse_tasks_per_node(_need(environ, SLURM_LAYOUT))
    node_name = _need(environ, "SLURMD_NODENAME")
    here = next((n for n in nodes if n.name == node_name), None)
    if here is None:
        raise SlurmLayoutError(f"this task runs on {node_name}, which is not among the job's nodes ({format_nodes(nodes)})")
    if role == TRAINING_ROLE:
        task_type, index = task_of_rank(_number(environ, "SLURM_PROCID"))
        placed = training_layout(nodes, counts)
        rank = rank_of_task(task_type, index)
        if rank >= len(placed) or placed[rank] != here:
            expected = placed[rank].name if rank < len(placed) else "no node"
            raise SlurmLayoutError(f"training rank {rank} runs on {node_name} but belongs on {expected}; "
                                   "start the training step with --distribution=block over every node of the job")
        port = slot_port(job_id, training_slots(placed)[rank])
    else:
        task_type, index, port = EVALUATOR, 0, slot_port(job_id, EVALUATOR_SLOT)
    config = slurm_tf_config(job_id, nodes, counts, task_type, index, evaluator_node=here)
    run_dir = _need(environ, RUN_DIR)
    attempt = environ.get(ATTEMPT, "0")
    if not attempt.isdigit():
        raise SlurmLayoutError(f"{ATTEMPT}={attempt!r} is not a number; it is set by tfl's batch script")
    env = {**environ, TF_CONFIG: json.dumps(config, separators=(",", ":")),
           **task_variables(task_type, index, run_dir, int(attempt))}
    log_path = f"{run_dir}/{LOGS_SUBDIR}/{task_slug(task_type, index)}.log"
    return TaskStart(f"{task_type}:{index}", node_name, here.addr, port, (python, "-u", job, *job_args), env, log_path,
                     run_dir, int(attempt))


def resolve_nodes(environ: Mapping[str, str]) -> str:
    """``TFL_SLURM_NODES`` for this job: asks scontrol (one controller call for all nodes)."""
    nodelist = _need(environ, "SLURM_JOB_NODELIST")
    hostnames = parse_hostnames(_scontrol(["show", "hostnames", nodelist]))
    addrs = parse_node_addrs(_scontrol(["show", "node", "-o", nodelist]))
    return format_nodes(nodes_in_order(hostnames, addrs))


NO_NODE_LOST = 3  # ``survivors``' exit status when every node of the attempt is still usable


def survivors(srun_err: str, attempt: int, environ: Mapping[str, str]) -> tuple[LostNodes, str, str] | None:
    """After attempt ``attempt`` failed: the ``lost`` event and the next attempt's nodes and
    layout, or None when no node was lost. Asks scontrol twice (the job's nodes, their states)."""
    nodes = parse_nodes(_need(environ, SLURM_NODES))
    counts = parse_tasks_per_node(_need(environ, SLURM_LAYOUT))
    listed = parse_job_nodelist(_scontrol(["show", "job", "-o", str(_number(environ, "SLURM_JOB_ID"))]))
    in_job = set(parse_hostnames(_scontrol(["show", "hostnames", listed]))) if listed else set()
    names = ",".join(n.name for n in nodes)
    usable = in_job - unusable_nodes(_scontrol(["show", "node", "-o", names])) - set(failed_nodes(srun_err))
    kept, kept_counts = surviving_nodes(nodes, counts, usable)
    if len(kept) == len(nodes):
        return None
    event = LostNodes(attempt, sum(counts), sum(kept_counts), tuple(n.name for n in nodes), tuple(n.name for n in kept))
    return event, format_nodes(kept), format_tasks_per_node(kept_counts)


def _survivors_main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        raise SlurmError("usage: python -m launcher.engines.slurm.node.task survivors SRUN_ERR ATTEMPT")
    try:
        srun_err = Path(argv[0]).read_text(errors="replace")
    except OSError:
        srun_err = ""
    found = survivors(srun_err, int(argv[1]), os.environ)
    if found is None:
        return NO_NODE_LOST
    event, nodes, layout = found
    print(event.event(), nodes or "-", layout or "-", ",".join(event.lost), sep="\n")
    return 0


def _scontrol(args: list[str]) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"scontrol {' '.join(args)} could not run: {exc}") from None
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise SlurmError(f"scontrol {' '.join(args)} exited {done.returncode}: {message[-1] if message else 'no output'}")
    return done.stdout


def _check_port_free(start: TaskStart) -> None:
    with socket.socket(socket.AF_INET6 if ":" in start.host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((start.host, start.port))
        except OSError as exc:
            raise SlurmError(f"{start.task} on {start.node}: port {host_port(start.host, start.port)} is taken ({exc.strerror}); another "
                             "job on this node may use it (ports follow the job id, see launcher/engines/slurm/node/nodes.py)") from None


def _record(start: TaskStart, environ: Mapping[str, str]) -> None:
    """Where this task runs, for the launcher (``RunFiles.task_info``): the pid stays the job's after exec."""
    task_type, _, index = start.task.partition(":")
    info = TaskInfo(task=start.task, node=start.node, addr=start.host, port=start.port, pid=os.getpid(),
                    attempt=start.attempt, step=f"{environ.get('SLURM_JOB_ID')}.{environ.get('SLURM_STEP_ID')}",
                    time=time.time())
    try:
        write_task_info(RunFiles(start.run_dir), task_slug(task_type, int(index)), info)
    except OSError as exc:
        raise SlurmError(f"{start.task} on {start.node}: cannot write to the run dir {start.run_dir} ({exc.strerror}); "
                         "it must lie on storage every node shares (set TFL_HOME there)") from None


def _exec(start: TaskStart) -> None:
    log = Path(start.log_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    if start.attempt:
        os.write(fd, attempt_banner(start.task, start.attempt).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        os.execve(start.argv[0], list(start.argv), start.env)
    except OSError as exc:
        raise SlurmError(f"{start.task} on {start.node}: cannot run {start.argv[0]}: {exc.strerror}") from None


def main(argv: Sequence[str]) -> int:
    try:
        if list(argv[:1]) == ["nodes"]:
            print(resolve_nodes(os.environ))
            return 0
        if list(argv[:1]) == ["survivors"]:
            return _survivors_main(argv[1:])
        if len(argv) < 2:
            raise SlurmError("usage: python -m launcher.engines.slurm.node.task {nodes | training JOB [ARGS] | evaluator JOB [ARGS]}")
        start = task_start(argv[0], argv[1], argv[2:], os.environ, sys.executable)
        _check_port_free(start)
        _record(start, os.environ)
        _exec(start)
    except TflError as exc:
        print(f"tfl: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0  # not reached: _exec replaces this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
