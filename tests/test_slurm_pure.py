"""The Slurm backend's pure parts, without a cluster: the ``slurm`` block, TF_CONFIG from
Slurm's node order, the batch script and srun lines, and squeue/sacct/scontrol parsing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import pytest

from launcher.describe.kinds import kind_of
from launcher.describe.spec import Topology
from launcher.engines.slurm.jobstate import (
    CommandResult,
    SlurmStep,
    SrunTaskFailure,
    parse_sacct,
    parse_scontrol_job,
    parse_squeue,
    parse_srun_failures,
    parse_steps,
    query_job,
    root_cause,
)
from launcher.engines.slurm.node.errors import SlurmError, SlurmLayoutError
from launcher.engines.slurm.node.nodes import (
    EVALUATOR_SLOT,
    PORT_BLOCKS,
    PORT_END,
    PORT_FIRST,
    SlurmNode,
    format_nodes,
    format_tasks_per_node,
    host_port,
    job_cluster,
    nodes_in_order,
    parse_hostnames,
    parse_node_addrs,
    parse_nodes,
    parse_tasks_per_node,
    port_block,
    rank_of_task,
    slurm_tf_config,
    task_of_rank,
    training_addresses,
    training_layout,
    training_slots,
)
from launcher.engines.slurm.node.task import main as task_main
from launcher.engines.slurm.node.task import task_start
from launcher.engines.slurm.settings import parse_slurm_cluster
from launcher.errors import ClusterFileError
from launcher.plan.tfconfig import TaskId, tf_config

ISSUE_EXAMPLE = {"slurm": {"nodes": 2, "tasks_per_node": 1, "evaluator": True, "partition": "debug",
                           "time": "01:00:00", "gpus_per_task": 1, "sbatch_args": ["--account=ml"]},
                 "env": {"TF_CPP_MIN_LOG_LEVEL": "2"}}
# Real output of Slurm 22.05.8 (the test cluster), one node per line.
SCONTROL_NODES = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=4 CPUEfctv=4 CPUTot=4 CPULoad=3.43 AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=vm Port=55131 Version=22.05.8 "
    "OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 State=ALLOCATED Partitions=debug\n"
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=4 CPUTot=4 Gres=(null) NodeAddr=127.0.0.1 "
    "NodeHostName=vm Port=35967 Version=22.05.8 OS=Linux 6.18.44-fc-v595 #1 SMP PREEMPT_DYNAMIC @0  State=IDLE\n"
)
SCONTROL_PENDING = (
    "JobId=3 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 Account=(null) "
    "QOS=(null) JobState=PENDING Reason=Resources Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-22T10:56:36 Partition=debug "
    "AllocNode:Sid=vm:3864 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=2-2 NumCPUs=2 NumTasks=2 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=2000M,node=2,billing=2 Socks/Node=* Command=(null) "
    "WorkDir=/work/wt-slurm StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= \n"
)
SCONTROL_FAILED = (
    "JobId=26 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A JobState=FAILED Reason=NonZeroExitCode "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:00 Partition=debug "
    "NodeList=n1 BatchHost=n1 NumNodes=1 NumCPUs=1 NumTasks=1 WorkDir=/tmp/slx StdOut=/dev/null Power= \n"
)


# --- the slurm block --------------------------------------------------------------------

def test_issue_example_parses() -> None:
    spec = parse_slurm_cluster(ISSUE_EXAMPLE, "slurm.json")
    s = spec.slurm
    assert (s.nodes, s.tasks_per_node, s.evaluator, s.partition, s.time, s.gpus_per_task, s.sbatch_args) == \
        (2, 1, True, "debug", "01:00:00", 1, ["--account=ml"])
    assert spec.env == {"TF_CPP_MIN_LOG_LEVEL": "2"} and s.training_tasks == 2


def test_defaults() -> None:
    s = parse_slurm_cluster({"slurm": {"nodes": 3}}).slurm
    assert (s.tasks_per_node, s.evaluator, s.partition, s.time, s.gpus_per_task, s.cpus_per_task, s.sbatch_args) == \
        (1, False, None, None, None, None, [])


@pytest.mark.parametrize("time", ["30", "30:00", "01:00:00", "2-00", "2-12:00", "2-12:00:00", "UNLIMITED", "0"])
def test_time_forms(time: str) -> None:
    assert parse_slurm_cluster({"slurm": {"nodes": 1, "time": time}}).slurm.time == time


@pytest.mark.parametrize(("slurm", "expected"), [
    ({"nodes": "2"}, "slurm.nodes: '2' is not a whole number (write e.g. 2)"),
    ({"nodes": True}, "slurm.nodes: True is not a whole number (write e.g. 2)"),
    ({"nodes": 1.5}, "slurm.nodes: 1.5 is not a whole number (write e.g. 2)"),
    ({"nodes": 0}, "slurm.nodes: 0 is out of range; it must be at least 1 (e.g. 2)"),
    ({}, "slurm.nodes: required key is missing"),
    ({"nodes": 1, "tasks_per_node": 32}, "slurm.tasks_per_node: 32 is out of range; it must be from 1 to 31"),
    ({"nodes": 1, "tasks_per_node": 0}, "slurm.tasks_per_node: 0 is out of range"),
    ({"nodes": 1, "evaluator": 1}, "slurm.evaluator: 1 is not true or false"),
    ({"nodes": 1, "evaluator": "yes"}, "slurm.evaluator: 'yes' is not true or false"),
    ({"nodes": 1, "gpus_per_task": 0}, "slurm.gpus_per_task: 0 is out of range; it must be at least 1 (e.g. 1 (or leave the key out))"),
    ({"nodes": 1, "cpus_per_task": "4"}, "slurm.cpus_per_task: '4' is not a whole number"),
    ({"nodes": 1, "time": "1h"}, "slurm.time: '1h' is not a Slurm time limit"),
    ({"nodes": 1, "time": 60}, "slurm.time: expected text in double quotes, got a whole number"),
    ({"nodes": 1, "partition": "gpu a"}, "slurm.partition: 'gpu a' is not a partition name"),
    ({"nodes": 1, "sbatch_args": ["--account", "ml"]}, "slurm.sbatch_args: item 1 'ml' is not an option; write each option with its value as one item"),
    ({"nodes": 1, "sbatch_args": ["--nodes=3"]}, "slurm.sbatch_args: item 0 '--nodes=3': tfl sets --nodes itself; use slurm.nodes instead"),
    ({"nodes": 1, "sbatch_args": ["-N3"]}, "slurm.sbatch_args: item 0 '-N3': tfl sets -N itself; use slurm.nodes instead"),
    ({"nodes": 1, "sbatch_args": ["-pgpu"]}, "tfl sets -p itself; use slurm.partition instead"),
    ({"nodes": 1, "sbatch_args": ["--ntasks-per-node=2"]}, "use slurm.tasks_per_node instead"),
    ({"nodes": 1, "sbatch_args": ["--export=NONE"]}, "use the top-level env (tfl passes the environment to every task) instead"),
    ({"nodes": 1, "sbatch_args": ["--output=x.log"]}, "tfl sets --output itself; use nothing (tfl writes the logs into the run dir) instead"),
    ({"nodes": 1, "sbatch_args": ["--comment=a\n#SBATCH --nodes=9"]}, "holds a line break; write the option on one line"),
    ({"nodes": 1, "sbatch_args": ["--account ml"]}, "item 0 '--account ml' has its value after a space; write it after '=' (\"--account=ml\")"),
    ({"nodes": 1, "sbatch_args": ["-A ml"]}, "item 0 '-A ml' has its value after a space; write it right after the letter (\"-Aml\")"),
    ({"nodes": 1, "sbatch_args": ["--nodes 3"]}, "item 0 '--nodes 3': tfl sets --nodes itself; use slurm.nodes instead"),
    ({"nodes": 1, "sbatch_args": "--account=ml"}, "slurm.sbatch_args: expected a list [...], got text"),
    ({"nodes": 1, "nodez": 2}, "slurm.nodez: unknown key; remove it or check its spelling"),
])
def test_bad_slurm_block(slurm: dict[str, Any], expected: str) -> None:
    with pytest.raises(ClusterFileError) as err:
        parse_slurm_cluster({"slurm": slurm}, "slurm.json")
    message = str(err.value)
    assert message.startswith("slurm.json: ") and expected in message and "\n" not in message


@pytest.mark.parametrize(("data", "expected"), [
    ({"slurm": {"nodes": 1}, "env": {"TF_CONFIG": "{}"}}, "env: sets TF_CONFIG, which tfl sets for each task; remove it"),
    ({"slurm": {"nodes": 1}, "env": {"TFL_RUN_ID": "x"}}, "env: sets TFL_RUN_ID, which tfl sets"),
    ({"slurm": {"nodes": 1}, "env": {"A": 1}}, "env.A: expected text in double quotes, got a whole number"),
    ({"slurm": {"nodes": 1}, "cluster": {"chief": ["localhost:1"]}}, "'cluster' cannot be used with 'slurm' (Slurm places the tasks); remove 'cluster'"),
    ({"slurm": {"nodes": 1}, "hosts": {}}, "'hosts' cannot be used with 'slurm'"),
    ({"slurm": {"nodes": 1}, "devices": {}}, "'devices' cannot be used with 'slurm'"),
    ({"slurm": 2}, "slurm: expected an object {...}, got a whole number"),
    ([1], "the file must hold a JSON object with a 'slurm' key"),
])
def test_bad_slurm_description(data: Any, expected: str) -> None:
    with pytest.raises(ClusterFileError, match="^slurm.json: ") as err:
        parse_slurm_cluster(data, "slurm.json")
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_slurm_block_makes_a_slurm_description() -> None:
    assert kind_of(ISSUE_EXAMPLE).name == "slurm"
    assert kind_of({"cluster": {"chief": ["localhost:1"]}}).name == "cluster"
    assert kind_of(["slurm"]).name == "cluster"  # not an object: the cluster parser says what is wrong


# --- nodes, ports and TF_CONFIG ---------------------------------------------------------

def test_hostnames_keep_slurm_order() -> None:
    # `scontrol show hostnames 'node[9-10]'` prints node9 first; a lexical sort would not.
    order = parse_hostnames("node9\nnode10\n\n")
    assert order == ("node9", "node10") and sorted(order) != list(order)


def test_node_addrs_from_real_scontrol_output() -> None:
    assert parse_node_addrs(SCONTROL_NODES) == {"n1": "127.0.0.1", "n2": "127.0.0.1"}
    assert parse_node_addrs("NodeName=gpu01 NodeAddr=10.1.0.7 NodeHostName=gpu01\nnoise\n") == {"gpu01": "10.1.0.7"}


def test_nodes_in_order() -> None:
    addrs = {"node10": "10.0.0.10", "node9": "10.0.0.9"}
    assert nodes_in_order(["node9", "node10"], addrs) == (SlurmNode("node9", "10.0.0.9"), SlurmNode("node10", "10.0.0.10"))
    with pytest.raises(SlurmLayoutError, match="node node11 has no NodeAddr"):
        nodes_in_order(["node9", "node11"], addrs)
    with pytest.raises(SlurmLayoutError, match="names a node twice"):
        nodes_in_order(["node9", "node9"], addrs)
    with pytest.raises(SlurmLayoutError, match="has no nodes"):
        nodes_in_order([], addrs)


def test_nodes_env_round_trip() -> None:
    nodes = (SlurmNode("n1", "127.0.0.1"), SlurmNode("gpu-2", "fd00::2"))
    assert format_nodes(nodes) == "n1=127.0.0.1,gpu-2=fd00::2"
    assert parse_nodes(format_nodes(nodes)) == nodes
    with pytest.raises(SlurmLayoutError, match="is not name=addr"):
        parse_nodes("n1,n2=1.2.3.4")


@pytest.mark.parametrize(("text", "counts"), [
    ("1(x2)", (1, 1)), ("2(x3),1", (2, 2, 2, 1)), ("4", (4,)), ("1,2,1(x2)", (1, 2, 1, 1)),
])
def test_tasks_per_node(text: str, counts: tuple[int, ...]) -> None:
    assert parse_tasks_per_node(text) == counts
    assert parse_tasks_per_node(format_tasks_per_node(counts)) == counts


def test_tasks_per_node_compresses_like_slurm() -> None:
    assert format_tasks_per_node((2, 2, 2, 1)) == "2(x3),1"
    assert format_tasks_per_node((1,)) == "1"


@pytest.mark.parametrize("text", ["", "x", "2(x)", "2(x3", "2,,1", "-1"])
def test_bad_tasks_per_node(text: str) -> None:
    with pytest.raises(SlurmLayoutError, match="is not a tasks-per-node list"):
        parse_tasks_per_node(text)


def test_port_blocks_stay_in_range_and_below_the_ephemeral_range() -> None:
    assert port_block(0) == PORT_FIRST and port_block(1) == PORT_FIRST + 32 and port_block(PORT_BLOCKS) == PORT_FIRST
    for job_id in [*range(0, 3 * PORT_BLOCKS), 2**31 - 1, 10**12]:
        assert 1024 <= PORT_FIRST <= port_block(job_id) and port_block(job_id) + EVALUATOR_SLOT < PORT_END == 32768


def test_jobs_close_in_id_never_share_ports() -> None:
    def ports(job_id: int) -> set[int]:
        return set(range(port_block(job_id), port_block(job_id) + 32))
    for job_id in range(1, 1500):
        for later in (job_id + 1, job_id + 100, job_id + PORT_BLOCKS - 1):
            assert not ports(job_id) & ports(later), (job_id, later)
    assert ports(5) == ports(5 + PORT_BLOCKS)  # the documented collision


def test_layout_is_block_in_node_order() -> None:
    a, b = SlurmNode("node9", "10.0.0.9"), SlurmNode("node10", "10.0.0.10")
    assert training_layout([a, b], (2, 1)) == (a, a, b)
    with pytest.raises(SlurmLayoutError, match="2 task counts for 1 nodes"):
        training_layout([a], (1, 1))
    with pytest.raises(SlurmLayoutError, match="has no tasks"):
        training_layout([a], (0,))


def test_task_of_rank() -> None:
    assert [task_of_rank(r) for r in range(3)] == [("chief", 0), ("worker", 0), ("worker", 1)]
    assert [rank_of_task(*task_of_rank(r)) for r in range(5)] == list(range(5))


def test_port_slots_count_tasks_per_address() -> None:
    a, b = SlurmNode("a", "10.0.0.1"), SlurmNode("b", "10.0.0.2")
    base = port_block(7)
    assert training_slots([a, a, b, b]) == (0, 1, 0, 1)
    assert training_addresses(7, [a, a, b, b]) == \
        (f"10.0.0.1:{base}", f"10.0.0.1:{base + 1}", f"10.0.0.2:{base}", f"10.0.0.2:{base + 1}")
    # Two nodes behind one address (the test cluster: NodeAddr=127.0.0.1 for both).
    n1, n2 = SlurmNode("n1", "127.0.0.1"), SlurmNode("n2", "127.0.0.1")
    assert training_addresses(7, [n1, n2]) == (f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}")
    with pytest.raises(SlurmLayoutError, match="more than 31 training tasks on address 10.0.0.1"):
        training_addresses(7, [a] * 32)


def test_tf_config_chief_first_in_slurm_order_not_lexical() -> None:
    nodes = nodes_in_order(["node9", "node10"], {"node9": "10.0.0.9", "node10": "10.0.0.10"})
    base = port_block(42)
    assert slurm_tf_config(42, nodes, (1, 1), "chief", 0) == \
        {"cluster": {"chief": [f"10.0.0.9:{base}"], "worker": [f"10.0.0.10:{base}"]}, "task": {"type": "chief", "index": 0}}


LAYOUTS = [  # (NodeAddrs in Slurm's order, tasks per node)
    (("10.0.0.1",), (1,)), (("10.0.0.1",), (3,)), (("10.0.0.1", "10.0.0.2"), (1, 1)),
    (("10.0.0.9", "10.0.0.10", "10.0.0.11"), (2, 1, 3)), (("127.0.0.1", "127.0.0.1"), (2, 2)),
    (("fd00::1", "fd00::2"), (1, 2)), (("gpu01.cluster", "gpu02.cluster"), (4, 4)),
]


@pytest.mark.parametrize(("addrs", "counts"), LAYOUTS)
def test_tf_config_is_launcher_tfconfig_shape(addrs: tuple[str, ...], counts: tuple[int, ...]) -> None:
    """Every task's TF_CONFIG equals what launcher.plan.tfconfig.tf_config makes of the same cluster,
    which launcher.describe.spec.Topology accepts (one chief, no address twice)."""
    nodes = tuple(SlurmNode(f"node{i}", a) for i, a in enumerate(addrs))
    evaluator_node = nodes[-1]
    topology = Topology.model_validate(job_cluster(1234, nodes, counts, evaluator_node))
    tasks = [task_of_rank(r) for r in range(sum(counts))] + [("evaluator", 0)]
    for task_type, index in tasks:
        expected = tf_config(topology, TaskId(task_type, index))
        assert slurm_tf_config(1234, nodes, counts, task_type, index, evaluator_node) == expected


def test_tf_config_evaluator_sees_itself_training_does_not() -> None:
    nodes = (SlurmNode("n1", "127.0.0.1"), SlurmNode("n2", "127.0.0.1"))
    base = port_block(9)
    evaluator = slurm_tf_config(9, nodes, (1, 1), "evaluator", 0, evaluator_node=nodes[0])
    assert evaluator["cluster"] == {"chief": [f"127.0.0.1:{base}"], "worker": [f"127.0.0.1:{base + 1}"],
                                    "evaluator": [f"127.0.0.1:{base + 31}"]}
    chief = slurm_tf_config(9, nodes, (1, 1), "chief", 0, evaluator_node=nodes[0])
    assert "evaluator" not in chief["cluster"]
    single = slurm_tf_config(9, nodes[:1], (1,), "chief", 0)
    assert single["cluster"] == {"chief": [f"127.0.0.1:{base}"]}  # no empty worker list


@pytest.mark.parametrize(("task", "expected"), [
    (("evaluator", 0), "its TF_CONFIG needs the node it runs on"),
    (("worker", 5), "task worker:5 is beyond the training step's 2 tasks"),
    (("chief", 1), "'chief:1' is not a task of a Slurm run"),
    (("ps", 0), "'ps:0' is not a task of a Slurm run"),
])
def test_tf_config_refuses_tasks_the_job_does_not_have(task: tuple[str, int], expected: str) -> None:
    nodes = (SlurmNode("n1", "127.0.0.1"), SlurmNode("n2", "127.0.0.1"))
    with pytest.raises(SlurmLayoutError) as err:
        slurm_tf_config(9, nodes, (1, 1), *task)
    assert expected in str(err.value)


def test_tf_config_ipv6_node_addr() -> None:
    nodes = (SlurmNode("a", "fd00::1"), SlurmNode("b", "fd00::2"))
    assert host_port("fd00::1", 5) == "[fd00::1]:5" and host_port("10.0.0.1", 5) == "10.0.0.1:5"
    config = slurm_tf_config(1, nodes, (1, 1), "chief", 0)
    assert config["cluster"]["chief"] == [f"[fd00::1]:{port_block(1)}"]


# --- the task driver's view of a step (pure: environ is passed in) ----------------------

STEP_ENV = {"SLURM_JOB_ID": "12", "TFL_SLURM_NODES": "n1=127.0.0.1,n2=127.0.0.1", "TFL_SLURM_TRAINING_LAYOUT": "1(x2)",
            "TFL_RUN_DIR": "/shared/runs/r1", "TFL_RUN_ID": "r1", "PATH": "/usr/bin"}


def test_task_start_training_rank_on_its_node() -> None:
    start = task_start("training", "/jobs/mnist.py", ["--epochs", "2"],
                       {**STEP_ENV, "SLURM_PROCID": "1", "SLURMD_NODENAME": "n2", "TFL_ATTEMPT": "1"}, "/venv/bin/python")
    base = port_block(12)
    assert (start.task, start.node, start.host, start.port) == ("worker:0", "n2", "127.0.0.1", base + 1)
    assert start.argv == ("/venv/bin/python", "-u", "/jobs/mnist.py", "--epochs", "2")
    assert json.loads(start.env["TF_CONFIG"]) == {"cluster": {"chief": [f"127.0.0.1:{base}"], "worker": [f"127.0.0.1:{base + 1}"]},
                                                  "task": {"type": "worker", "index": 0}}
    assert (start.env["TFL_TASK"], start.env["TFL_ATTEMPT"], start.env["PATH"]) == ("worker:0", "1", "/usr/bin")
    assert start.env["TFL_PROGRESS_FILE"] == "/shared/runs/r1/progress/worker-0.json"
    assert start.log_path == "/shared/runs/r1/logs/worker-0.log"


def test_task_start_evaluator() -> None:
    start = task_start("evaluator", "/jobs/mnist.py", [], {**STEP_ENV, "SLURM_PROCID": "0", "SLURMD_NODENAME": "n2"}, "py")
    assert (start.task, start.host, start.port) == ("evaluator:0", "127.0.0.1", port_block(12) + 31)
    assert json.loads(start.env["TF_CONFIG"])["task"] == {"type": "evaluator", "index": 0}
    assert start.env["TFL_ATTEMPT"] == "0" and start.log_path.endswith("/logs/evaluator-0.log")


@pytest.mark.parametrize(("change", "expected"), [
    ({"SLURMD_NODENAME": "n1"}, "training rank 1 runs on n1 but belongs on n2; start the training step with --distribution=block"),
    ({"SLURMD_NODENAME": "n7"}, "this task runs on n7, which is not among the job's nodes"),
    ({"SLURM_PROCID": "2"}, "training rank 2 runs on n2 but belongs on no node"),
    ({"SLURM_JOB_ID": ""}, "SLURM_JOB_ID is not set; `python -m launcher.engines.slurm.node.task` runs inside a step"),
    ({"SLURM_JOB_ID": "12_3"}, "SLURM_JOB_ID='12_3' is not a number"),
    ({"TFL_SLURM_NODES": ""}, "TFL_SLURM_NODES is not set"),
])
def test_task_start_refuses_a_wrong_step(change: dict[str, str], expected: str) -> None:
    env = {**STEP_ENV, "SLURM_PROCID": "1", "SLURMD_NODENAME": "n2", **change}
    with pytest.raises(SlurmLayoutError) as err:
        task_start("training", "/j.py", [], env, "py")
    assert expected in str(err.value)


def test_task_start_unknown_role() -> None:
    with pytest.raises(SlurmError, match="unknown role 'chief'"):
        task_start("chief", "/j.py", [], STEP_ENV, "py")


def test_driver_outside_a_step_says_so_in_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "TFL_"))}
    done = subprocess.run([sys.executable, "-m", "launcher.engines.slurm.node.task", "training", "/j.py"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "tfl: error: SLURM_JOB_ID is not set; `python -m launcher.engines.slurm.node.task` runs inside a step of tfl's batch script\n"
    done = subprocess.run([sys.executable, "-m", "launcher.engines.slurm.node.task"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("tfl: error: usage: python -m launcher.engines.slurm.node.task {nodes |")


def _listen_on_a_chief_port() -> tuple[socket.socket, int]:
    """A listening socket on the chief port of some job id (the first whose port is free here)."""
    for job_id in range(1, PORT_BLOCKS):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port_block(job_id)))
        except OSError:
            sock.close()
            continue
        sock.listen()
        return sock, job_id
    raise AssertionError("no free port in 10000..32767")


def test_driver_refuses_a_taken_port(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def no_exec(start: object) -> None:
        raise AssertionError(f"the driver went on to exec the job: {start}")
    monkeypatch.setattr("launcher.engines.slurm.node.task._exec", no_exec)
    busy, job_id = _listen_on_a_chief_port()
    with busy:
        for key, value in {**STEP_ENV, "SLURM_JOB_ID": str(job_id), "SLURM_PROCID": "0", "SLURMD_NODENAME": "n1"}.items():
            monkeypatch.setenv(key, value)
        assert task_main(["training", "/j.py"]) == 2  # before any exec
    assert capsys.readouterr().err == (
        f"tfl: error: chief:0 on n1: port 127.0.0.1:{port_block(job_id)} is taken (Address already in use); "
        "another job on this node may use it (ports follow the job id, see launcher/engines/slurm/node/nodes.py)\n")


# --- squeue, sacct, scontrol ------------------------------------------------------------

def test_parse_squeue_real_output() -> None:
    text = "1|COMPLETED|None|n[1-2]\n3|PENDING|Resources|\n2|RUNNING|None|n1\n"
    pending = parse_squeue(text, "3")
    assert pending is not None and (pending.state, pending.reason, pending.nodelist, pending.is_pending) == \
        ("PENDING", "Resources", None, True)
    running = parse_squeue(text, "2")
    assert running is not None and (running.state, running.reason, running.nodelist, running.is_terminal) == \
        ("RUNNING", None, "n1", False)
    done = parse_squeue(text, "1")
    assert done is not None and done.is_terminal and done.exit_code is None and done.source == "squeue"
    assert parse_squeue(text, "30") is None and parse_squeue("", "3") is None


def test_parse_sacct() -> None:
    text = "41|CANCELLED by 0|0:15|n[1-2]|None\n42|PENDING|0:0|None assigned|Resources\n43|FAILED|3:0|n1|NonZeroExitCode\n"
    cancelled, pending, failed = (parse_sacct(text, j) for j in ("41", "42", "43"))
    assert cancelled is not None and (cancelled.state, cancelled.exit_code, cancelled.signal, cancelled.is_terminal) == \
        ("CANCELLED", 0, 15, True)
    assert pending is not None and (pending.state, pending.nodelist, pending.reason) == ("PENDING", None, "Resources")
    assert failed is not None and (failed.exit_code, failed.reason, failed.source) == (3, "NonZeroExitCode", "sacct")


def test_parse_scontrol_job_real_output() -> None:
    pending = parse_scontrol_job(SCONTROL_PENDING)
    assert pending is not None and (pending.job_id, pending.state, pending.reason, pending.nodelist) == \
        ("3", "PENDING", "Resources", None)
    failed = parse_scontrol_job(SCONTROL_FAILED)
    assert failed is not None and (failed.state, failed.reason, failed.nodelist, failed.exit_code, failed.signal) == \
        ("FAILED", "NonZeroExitCode", "n1", 3, 0)
    odd = parse_scontrol_job("JobId=5 JobName=a b JobState=PENDING Reason=ReqNodeNotAvail,_UnavailableNodes:n1 NodeList= \n")
    assert odd is not None and odd.reason == "ReqNodeNotAvail,_UnavailableNodes:n1"
    assert parse_scontrol_job("") is None


def test_parse_steps() -> None:
    assert parse_steps("2.0|training|n[1-2]\n2.batch|batch|n1\n") == \
        [SlurmStep("2.0", "training", "n[1-2]"), SlurmStep("2.batch", "batch", "n1")]


def test_srun_failures_real_output() -> None:
    text = ("srun: error: n2: task 1: Exited with exit code 3\n"
            "srun: launch/slurm: _step_signal: Terminating StepId=9.0\n"
            "slurmstepd-n1: error: *** STEP 9.0 ON n1 CANCELLED AT 2026-11-22T11:01:40 ***\n"
            "srun: error: n1: task 0: Terminated\n"
            "srun: Force Terminated StepId=9.0\n")
    failures = parse_srun_failures(text)
    assert failures == [SrunTaskFailure("n2", (1,), "Exited with exit code 3", 3), SrunTaskFailure("n1", (0,), "Terminated", None)]
    assert root_cause(failures) == failures[0]
    assert root_cause(list(reversed(failures))) == failures[0]  # not the task srun terminated afterwards


def test_a_task_killed_from_outside_is_the_cause_not_the_survivor_that_exits_1_after_srun_terminates_it() -> None:
    """The CI flake of test_mnist_on_two_nodes_with_an_evaluator_survives_a_killed_task: the worker
    killed with -9, then the chief, given srun's SIGTERM, waits for a step as the kit does after a
    notice and exits 1 when its collective fails on the dead worker."""
    text = ("srun: error: n2: task 1: Killed\n"
            "srun: launch/slurm: _step_signal: Terminating StepId=4.0\n"
            "srun: error: n1: task 0: Exited with exit code 1\n")
    failures = parse_srun_failures(text)
    assert root_cause(failures) == SrunTaskFailure("n2", (1,), "Killed", None)
    assert root_cause([SrunTaskFailure("n1", (0,), "Terminated", None)]) == SrunTaskFailure("n1", (0,), "Terminated", None)


def test_srun_failures_ranges_and_kills() -> None:
    failures = parse_srun_failures("srun: error: gpu07: tasks 0-2,5: Killed\nsrun: error: gpu08: task 6: Exited with exit code 0\n")
    assert failures[0] == SrunTaskFailure("gpu07", (0, 1, 2, 5), "Killed", None)
    assert root_cause(failures) == failures[0]  # exit code 0 is no cause
    assert root_cause([]) is None and parse_srun_failures("all fine\n") == []


class FakeSlurm:
    """Answers each command by its name; records the order they were asked in."""

    def __init__(self, **answers: CommandResult) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, argv: Sequence[str]) -> CommandResult:
        self.asked.append(argv[0])
        return self.answers[argv[0]]


UNKNOWN = CommandResult(1, "", "slurm_load_jobs error: Invalid job id specified\n")
NO_ACCOUNTING = CommandResult(1, "", "Slurm accounting storage is disabled\n")


def test_query_job_squeue_first() -> None:
    fake = FakeSlurm(squeue=CommandResult(0, "7|PENDING|Resources|\n", ""))
    state = query_job("7", fake)
    assert state is not None and (state.state, state.reason, state.source) == ("PENDING", "Resources", "squeue")
    assert fake.asked == ["squeue"]


def test_query_job_falls_back_to_sacct_where_accounting_is_on() -> None:
    fake = FakeSlurm(squeue=UNKNOWN, sacct=CommandResult(0, "7|COMPLETED|0:0|n[1-2]|None\n", ""))
    state = query_job("7", fake)
    assert state is not None and (state.state, state.exit_code, state.source) == ("COMPLETED", 0, "sacct")
    assert fake.asked == ["squeue", "sacct"]


def test_query_job_without_accounting_asks_scontrol() -> None:
    fake = FakeSlurm(squeue=CommandResult(0, "", ""), sacct=NO_ACCOUNTING, scontrol=CommandResult(0, SCONTROL_FAILED, ""))
    state = query_job("26", fake)
    assert state is not None and (state.state, state.exit_code, state.source) == ("FAILED", 3, "scontrol")
    assert fake.asked == ["squeue", "sacct", "scontrol"]


def test_query_job_nobody_knows_it() -> None:
    assert query_job("7", FakeSlurm(squeue=UNKNOWN, sacct=NO_ACCOUNTING, scontrol=UNKNOWN)) is None
    # sacct with accounting on, but the job is not (yet) recorded: empty output.
    assert query_job("7", FakeSlurm(squeue=UNKNOWN, sacct=CommandResult(0, "", ""), scontrol=UNKNOWN)) is None
    # no sacct installed at all
    assert query_job("7", FakeSlurm(squeue=UNKNOWN, sacct=CommandResult(127, "", "not found"), scontrol=UNKNOWN)) is None


@pytest.mark.parametrize(("answers", "expected"), [
    ({"squeue": CommandResult(1, "", "squeue: error: Unable to contact slurm controller (connect failure)\n")},
     "squeue -h -t all -j 7 -o %i|%T|%r|%N exited 1: squeue: error: Unable to contact slurm controller (connect failure)"),
    ({"squeue": CommandResult(127, "", "")}, "squeue is not on PATH; install Slurm's client commands (slurm-client) or fix PATH"),
    ({"squeue": CommandResult(1, "", "squeue: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\n"
                                     "squeue: fatal: Could not establish a configuration source\n")},
     "exited 1: squeue: fatal: Could not establish a configuration source"),
    ({"squeue": UNKNOWN, "sacct": CommandResult(1, "", "sacct: error: Problem talking to the database: Connection refused\n")},
     "sacct -n -P -X -j 7 -o JobIDRaw,State,ExitCode,NodeList,Reason exited 1: sacct: error: Problem talking to the database"),
    ({"squeue": UNKNOWN, "sacct": NO_ACCOUNTING, "scontrol": CommandResult(1, "", "")}, "scontrol show job -o 7 exited 1: no output"),
])
def test_query_job_failures_are_one_line(answers: dict[str, CommandResult], expected: str) -> None:
    with pytest.raises(SlurmError) as err:
        query_job("7", FakeSlurm(**answers))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_node_slurm_took_down_says_when_and_why() -> None:
    from launcher.engines.slurm.jobstate import describe_node_down, parse_slurmd_timeout

    timeout = parse_slurmd_timeout("KillWait                = 5 sec\nSlurmdTimeout           = 20 sec\n")
    assert timeout == "20 sec"
    assert describe_node_down("n2", "Not responding|2026-11-25T01:55:03\n", timeout) == (
        "; Slurm marked n2 down at 01:55:03 (Not responding, at most SlurmdTimeout = 20 sec after its slurmd fell silent)")
    assert describe_node_down("n2", "tfl-test|2026-11-25T01:55:03\n", timeout) == "; Slurm marked n2 down at 01:55:03 (tfl-test)"
    assert describe_node_down("n2", "", timeout) == ""
