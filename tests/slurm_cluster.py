"""A private two-node Slurm cluster on this machine for the Slurm tests.

One ``slurmctld`` and two ``slurmd`` (``-N n1``, ``-N n2``) run from Debian's Slurm 22.05
with their own ports, state, spool, log and pid files under a private temp dir. Both nodes
have ``NodeHostname`` = this host and ``NodeAddr=127.0.0.1``: the node names do not resolve,
as on many clusters, so anything that reaches a node must go through its NodeAddr. Tests get
the env to run Slurm commands with (``SLURM_CONF`` set there, never in ``os.environ``).
Without the packages the Slurm tests are skipped, except in CI (CI=true) where that fails.

What works here, and what does not (Slurm 22.05.8 in this container, found by trying):

- ``AuthType=auth/none`` and ``CredType=cred/none``: no munge. ``SlurmUser``/``SlurmdUser``
  are the user running the tests (root here); a non-root user can run it too, but then
  jobs run as that user and only that user.
- ``ProctrackType=proctrack/linuxproc`` and ``TaskPlugin=task/none``: no cgroup.conf and
  no cgroup hierarchy to share between the two slurmd (the cgroup plugins were not tried;
  CI containers often cannot write cgroups); ``task/affinity`` would pin tasks to CPUs the
  nodes only pretend to have. linuxproc finds a step's processes by parentage, which is
  enough for scancel and --kill-on-bad-exit here.
- ``SlurmdParameters=config_overrides``: each node claims ``CPUS_PER_NODE`` CPUs whatever
  the machine has, so two nodes can hold a training group and an evaluator on two cores.
  (slurmd logs "Node configuration differs from hardware"; harmless.)
- several slurmd on one host: one ``Port=`` per ``NodeName`` and ``%n`` in the spool, pid
  and log paths. ``scontrol show node -o n1`` shows ``NodeAddr=127.0.0.1 NodeHostName=<host>``.
- ``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``: slurmctld (the first), slurmd
  and srun (the second) bind to 127.0.0.1, what this host's name resolves to, instead of
  0.0.0.0. Without them every daemon port is open on all interfaces, which with auth/none
  means anyone who can reach the machine may run jobs as the test user.
- GPUs: ``GresTypes=gpu``, ``Gres=gpu:2`` per node and a gres.conf whose ``File`` entries
  are character devices made with mknod (copies of /dev/null; a plain file is refused:
  "is not a valid character or block device"). Then ``srun --gpus-per-task=1`` with two
  tasks per node gives them CUDA_VISIBLE_DEVICES=0 and =1 (and SLURM_STEP_GPUS alike):
  --gpus-per-task binds one GPU per task; with TaskPlugin=task/none nothing renumbers
  them. Without root (no mknod) the cluster has no GPUs and GPU tests skip.
- slurmd logs "mpi/pmix: can not load PMIx library" errors at start: harmless, no MPI used.
- ``sbatch --parsable`` prints the bare job id. ``salloc -N 2 --ntasks-per-node 1 CMD``
  works without a terminal and exits with CMD's status.
- Steps that must run side by side (training group and evaluator) need ``srun --exact``:
  without it a step takes every CPU of the allocation on its nodes and the other waits.
- Allocations are packed: ``sbatch -N 2 -n 5`` on two 4-CPU nodes gets 4 CPUs on n1 and 1
  on n2, with or without ``--spread-job`` or ``-m plane=2``; only ``--ntasks-per-node``
  gives each node its share. A heterogeneous job (``#SBATCH hetjob``, 2 nodes + 1 task)
  stayed PENDING (Resources) for the 40 s we waited: only the backfill scheduler
  (bf_interval 30 s) starts those; not pursued.
- Pending reasons: a job needing both nodes while another holds n1 whole
  (``sbatch -N1 -w n1 --exclusive``) is PENDING with Reason=Resources, every time, once
  the scheduler has looked at it (until then Reason=None). A job asking for more nodes
  than exist (``-N 3``) is *accepted* and stays PENDING with Reason=PartitionConfig (later
  PartitionNodeLimit; EnforcePartLimits=NO, the default); an unknown partition is refused
  by sbatch: "sbatch: error: Batch job submission failed: Invalid partition name
  specified", exit 1.
- Batch jobs start 1-3 s after submission (slurmctld batches scheduling passes; the first
  pass comes ~2 s after it starts, hence the warm-up job), while ``srun``/``salloc``
  allocations are granted at once.
- No accounting (no slurmdbd): ``sacct`` prints "Slurm accounting storage is disabled" and
  exits 1. ``squeue -t all -j ID`` and ``scontrol show job -o ID`` still show an ended job
  for MinJobAge (300 s); after that both say "Invalid job id specified" and exit 1.
- ``scancel`` of a running job ends its tasks within a second (KillWait=5 s before SIGKILL
  here, 30 s by default); it exits 0 when cancelled twice, and also for an unknown job id.
  ``scancel --signal=TERM JOB.STEP`` only signals the step's tasks. SIGTERM to an ``srun``
  does not forward it: srun "forces job termination" and its tasks are killed at once.
- ``srun --kill-on-bad-exit=1``: when one task exits 3, srun terminates the others and
  exits with the largest status (143 for the terminated ones), not 3; the failed task is in
  srun's stderr: "srun: error: n2: task 1: Exited with exit code 3".
- Preemption (``start_cluster(..., preemption=True)``: ``PreemptType=preempt/partition_prio``,
  ``PreemptMode=REQUEUE``, the default partition at PriorityTier 1 with ``GraceTime``, a
  second partition URGENT at PriorityTier 2): an URGENT job that needs the nodes
  (``--exclusive``; without it, it fits beside a small job and preempts nothing) makes
  slurmctld set the running job's ``PreemptTime`` (``scontrol show job``) and send SIGTERM
  to its steps' tasks at once ("STEP CANCELLED"), not to the batch shell; the batch shell
  gets SIGTERM only at the end of GraceTime ("CANCELLED ... DUE TO PREEMPTION"), then
  SIGKILL. A job submitted with ``--requeue`` is then PENDING, Reason=BeginTime, for the
  credential lifetime + 1 s (120 s by default; ``AuthInfo=cred_expire=5`` here), and runs
  its batch script again with ``SLURM_RESTART_COUNT=1``; ``--open-mode=append`` keeps the
  first run's output. ``scancel --signal=TERM --batch JOB`` signals the batch shell only,
  as ``sbatch --signal=B:TERM@N`` does before the time limit.
- A killed slurmd is found out only by slurmctld's pings (every third of ``SlurmdTimeout``), and
  a ping round to the dead node takes ``MessageTimeout`` before the next round may start:
  with ``SlurmdTimeout=6``, n2 was DOWN 25-26 s after its slurmd was killed under Slurm's
  default ``MessageTimeout=10``, 16.5 s under 5 (4: 16.4 s; 2: 11.5 s; load 11-18). The
  clusters of the tests that kill a slurmd use 5 (``LOST_NODE_MESSAGE_TIMEOUT``): half the
  default still leaves a loaded machine's commands and step launches seconds to answer.
- ``slurmstepd`` processes are re-parented to init; they (and the daemons) have their cwd
  in the cluster's log dir, which is how teardown tells them from anybody else's. The
  daemons get PR_SET_PDEATHSIG, so a test run killed with SIGKILL leaves none behind.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from launcher.describe.ports import free_ports

SBIN = Path("/usr/sbin")
DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "salloc", "squeue", "scontrol", "scancel", "sinfo")
NODES = ("n1", "n2")
CPUS_PER_NODE = 4
GPUS_PER_NODE = 2  # fake ones (see fake_gpus); 0 when they cannot be made
PARTITION = "debug"
URGENT = "urgent"  # with preemption: a partition of a higher PriorityTier whose jobs preempt debug's
PREEMPT_GRACE = 20
SLURMD_TIMEOUT = 20  # a node whose slurmd is gone is noticed (DOWN, Not responding) within this, not 300 s
LOST_NODE_SLURMD_TIMEOUT = 6  # the clusters of the tests that kill a slurmd: they wait this out (up to ~1.7 x: pinged every 2 s)
MESSAGE_TIMEOUT = 10  # Slurm's default: how long a daemon or a command waits for a message's answer
LOST_NODE_MESSAGE_TIMEOUT = 5  # the same clusters: each ping of the dead slurmd waits this (see the module docstring)
REQUEUE_DELAY = 5  # a requeued job waits the credential lifetime (+1 s) before it may start again (120 s by default)  # GraceTime of the debug partition (seconds from the notice to SIGKILL)


@dataclass
class SlurmCluster:
    dir: Path
    conf: Path
    env: dict[str, str]  # os.environ plus SLURM_CONF: pass it to every Slurm command
    host: str  # NodeHostname of both nodes (this machine's name)
    ctld_port: int
    node_ports: dict[str, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # "slurmctld", "n1", "n2"
    nodes: tuple[str, ...] = NODES
    partition: str = PARTITION
    cpus_per_node: int = CPUS_PER_NODE
    gpus_per_node: int = 0

    def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster; ``check`` fails with its output."""
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def sbatch(self, *args: str) -> str:
        """``sbatch --parsable ARGS``: the job id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip()

    def job_field(self, job_id: str, fmt: str) -> str:
        """One ``squeue -o`` field of a job ('' once the controller forgot it)."""
        return self.run("squeue", "-h", "-t", "all", "-j", job_id, "-o", fmt, check=False).stdout.strip()

    def wait_for(self, what: str, probe: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not probe():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.logs_tail()}")
            time.sleep(0.1)

    def wait_state(self, job_id: str, *states: str, timeout: float = 60) -> str:
        seen: list[str] = []

        def probe() -> bool:
            seen[:] = [self.job_field(job_id, "%T")]
            return seen[0] in states
        self.wait_for(f"job {job_id} to be {'/'.join(states)} (last state: {seen})", probe, timeout)
        return seen[0]

    def queue(self) -> list[str]:
        """Job ids still pending or running."""
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def cancel_all(self, timeout: float = 60) -> None:
        """Cancel every job and wait until the queue and the nodes are empty."""
        for job_id in self.queue():
            self.run("scancel", job_id, check=False)
        self.wait_for("an empty queue", lambda: not self.queue(), timeout)
        self.wait_for("the cluster's job processes to end", lambda: not self.job_processes(), timeout)

    def job_processes(self) -> list[psutil.Process]:
        """Live slurmstepd and task processes of this cluster (not its daemons)."""
        daemons = {p.pid for p in self.procs.values()}
        return [p for p in cluster_processes(self.dir, self.conf) if p.pid not in daemons and _parent(p) not in daemons]

    def node_addr(self, node: str) -> str:
        line = self.run("scontrol", "show", "node", "-o", node).stdout
        return next(word.split("=", 1)[1] for word in line.split() if word.startswith("NodeAddr="))

    def logs_tail(self, lines: int = 15) -> str:
        out = []
        for log in sorted((self.dir / "log").glob("*.log")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)


def _parent(proc: psutil.Process) -> int | None:
    try:
        return proc.ppid()
    except psutil.Error:
        return None


def cluster_processes(directory: Path, conf: Path) -> list[psutil.Process]:
    """Every live process of this cluster: cwd in its dir (daemons, slurmstepd) or its SLURM_CONF (tasks)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if Path(proc.cwd()).is_relative_to(directory) or proc.environ().get("SLURM_CONF") == str(conf):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def missing_packages() -> list[str]:
    missing = [d for d in DAEMONS if not (SBIN / d).exists()]
    return missing + [c for c in CLIENTS if shutil.which(c) is None]


def fake_gpus(directory: Path) -> str:
    """gres.conf lines for GPUS_PER_NODE fake GPUs per node, or '' where devices cannot be made.

    slurmd wants each GPU ``File`` to be a character device; copies of /dev/null (1, 3) made
    with mknod (root only) do. Slurm then hands out and binds them as real GPUs would be.
    """
    dev = directory / "dev"
    dev.mkdir(mode=0o700, exist_ok=True)
    lines = []
    for n, node in enumerate(NODES):
        first = n * GPUS_PER_NODE
        try:
            for i in range(first, first + GPUS_PER_NODE):
                os.mknod(dev / f"fakegpu{i}", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            return ""
        lines.append(f"NodeName={node} Name=gpu File={dev}/fakegpu[{first}-{first + GPUS_PER_NODE - 1}]")
    return "\n".join(lines) + "\n"


def first_job_id() -> int:
    """Each pytest-xdist worker's clusters number their jobs from another point. A task's port follows
    its job id (launcher/engines/slurm/node/nodes.py: 711 blocks of 32 ports): two workers' clusters
    on this one machine, both numbering from 1, gave their jobs the same ports ("port 127.0.0.1:10321
    is taken"). Spread evenly over the blocks (two workers: 355 apart, four: 177), they collide only
    once one worker has started that many jobs."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    workers = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "2") or 2), index + 1)
    return 1 + index * (711 // workers)


def slurm_conf(directory: Path, host: str, user: str, ctld_port: int, node_ports: dict[str, int], gpus: bool,
               preemption: bool = False, slurmd_timeout: int = SLURMD_TIMEOUT,
               message_timeout: int = MESSAGE_TIMEOUT) -> str:
    """The slurm.conf of the test cluster (see the module docstring for why each line)."""
    d = directory
    partitions = [f"PartitionName={PARTITION} Nodes={','.join(node_ports)} Default=YES MaxTime=INFINITE State=UP"]
    if preemption:
        partitions[0] += f" PriorityTier=1 GraceTime={PREEMPT_GRACE}"
        partitions.append(f"PartitionName={URGENT} Nodes={','.join(node_ports)} MaxTime=INFINITE State=UP "
                          "PriorityTier=2 PreemptMode=OFF")
    gres = f"Gres=gpu:{GPUS_PER_NODE} " if gpus else ""
    nodes = [f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={CPUS_PER_NODE} {gres}"
             "RealMemory=1000 State=UNKNOWN" for n, p in node_ports.items()]
    return "\n".join([
        "ClusterName=tfltest",
        *(["GresTypes=gpu"] if gpus else []),
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "AuthType=auth/none",
        "CredType=cred/none",
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        "SlurmdParameters=config_overrides",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
        "JobCompType=jobcomp/none",
        "ReturnToService=2",
        f"FirstJobId={first_job_id()}",
        "KillWait=5",
        f"SlurmdTimeout={slurmd_timeout}",
        f"MessageTimeout={message_timeout}",
        f"StateSaveLocation={d}/state",
        f"SlurmdSpoolDir={d}/spool/%n",
        f"SlurmctldPidFile={d}/run/slurmctld.pid",
        f"SlurmdPidFile={d}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={d}/log/slurmctld.log",
        f"SlurmdLogFile={d}/log/slurmd-%n.log",
        *(["PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE", f"AuthInfo=cred_expire={REQUEUE_DELAY}"]
          if preemption else []),
        *nodes,
        *partitions,
        "",
    ])


def start_cluster(directory: Path, preemption: bool = False, slurmd_timeout: int = SLURMD_TIMEOUT,
                  message_timeout: int = MESSAGE_TIMEOUT) -> SlurmCluster:
    """``preemption``: a second partition (URGENT) whose jobs preempt the default one's, which
    are requeued (see the module docstring). ``slurmd_timeout``: how long slurmctld waits on a
    silent slurmd before it takes the node down (slurmctld pings every third of it);
    ``message_timeout``: Slurm's MessageTimeout, which each ping of a dead slurmd waits out."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for sub in ("state", "run", "log", *(f"spool/{n}" for n in NODES)):
        (directory / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    host = socket.gethostname()
    ctld_port, *ports = free_ports(1 + len(NODES))
    conf = directory / "slurm.conf"
    node_ports = dict(zip(NODES, ports, strict=True))
    gres = fake_gpus(directory)
    (directory / "gres.conf").write_text(gres)
    conf.write_text(slurm_conf(directory, host, pwd.getpwuid(os.getuid()).pw_name, ctld_port, node_ports, bool(gres),
                               preemption, slurmd_timeout, message_timeout))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(directory, conf, env, host, ctld_port, node_ports, gpus_per_node=GPUS_PER_NODE if gres else 0)
    try:
        cluster.procs["slurmctld"] = _daemon(cluster, "slurmctld", [str(SBIN / "slurmctld"), "-D"])
        for node in NODES:
            cluster.procs[node] = _daemon(cluster, f"slurmd-{node}", [str(SBIN / "slurmd"), "-D", "-N", node])
        cluster.wait_for("both nodes to be idle", lambda: _nodes_idle(cluster), timeout=60)
        _warm_up(cluster)
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def _warm_up(cluster: SlurmCluster) -> None:
    """One batch job on both nodes: proves steps run, and waits out slurmctld's first
    scheduling pass (~2 s after it starts; batch jobs submitted before it pend with
    Reason=None, while later ones start at submission)."""
    out = cluster.dir / "log" / "warm-up.out"
    job_id = cluster.sbatch("--nodes=2", "--ntasks-per-node=1", f"--output={out}", "--wrap", "srun --label printenv SLURMD_NODENAME")
    assert cluster.wait_state(job_id, "COMPLETED", "FAILED", "CANCELLED") == "COMPLETED", cluster.logs_tail()
    names = sorted(out.read_text().split())
    assert names == ["0:", "1:", *NODES], f"warm-up job ran on {names}"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the test process dies (even by SIGKILL), so a
    killed test run leaves no daemon behind holding its ports."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _daemon(cluster: SlurmCluster, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    with open(cluster.dir / "log" / f"{name}.out", "ab") as out:
        return subprocess.Popen(argv, env=cluster.env, cwd=cluster.dir / "log", stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)


def _nodes_idle(cluster: SlurmCluster) -> bool:
    for name, proc in cluster.procs.items():
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}\n{cluster.logs_tail()}")
    done = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
    states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
    return done.returncode == 0 and all(states.get(n) == "idle" for n in NODES)


def stop_cluster(cluster: SlurmCluster, grace: float = 15.0) -> None:
    """Cancel what runs, SIGTERM each daemon by pid, SIGKILL after ``grace`` s; prove all gone."""
    try:
        if cluster.procs and all(p.poll() is None for p in cluster.procs.values()):
            cluster.cancel_all()
    finally:
        _stop_daemons(cluster, grace)
    left = cluster_processes(cluster.dir, cluster.conf)
    described = [_describe(p) for p in left]
    for stray in left:
        try:
            stray.kill()
        except psutil.Error:
            pass
    assert not left, f"Slurm processes left alive: {described}"
    for port in (cluster.ctld_port, *cluster.node_ports.values()):
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"something still listens on 127.0.0.1:{port}"


def _stop_daemons(cluster: SlurmCluster, grace: float) -> None:
    """The slurmd first, then slurmctld: a slurmd that still owes the controller a message (a
    job's epilog completion, after its node was lost and came back) retries it for ~10 s at
    shutdown when the controller has already gone."""
    deadline = time.monotonic() + grace
    nodes = [p for name, p in cluster.procs.items() if name != "slurmctld"]
    controller = [p for name, p in cluster.procs.items() if name == "slurmctld"]
    for group in (nodes, controller):
        for proc in group:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in group:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())}"
    except psutil.Error:
        return f"{proc.pid} (gone)"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = missing_packages()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Slurm is missing ({', '.join(missing)}); CI must install slurmctld slurmd slurm-client (see .ci/run)")
        pytest.skip(f"Slurm not installed ({', '.join(missing)}): apt-get install slurmctld slurmd slurm-client")
    cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
    yield cluster
    stop_cluster(cluster)
