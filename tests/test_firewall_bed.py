"""``"ssh": {"firewall": true}`` on hosts with networks of their own (``tests.netbed``): the chief on
the first host, a worker on the second, the third outside the run. While the run lives, the
outside host cannot connect to a task port and a peer can; however the run ends (succeeded,
failed, ``tfl stop``, its launcher killed with -9) no ``tfl_`` table is left on any host; a host
without nft refuses the launch in one line naming it, before any task starts.

The job here listens on its TF_CONFIG port, as TensorFlow's server does, until the test writes
the exit code it should end with into a file every host sees.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.describe.ports import free_port
from launcher.engines.ssh.node import agent_firewall as agent
from launcher.files import write_atomic
from tests.netbed import NetBed
from tests.procs import pid_alive, tfl_processes
from tests.test_lost_hosts import start, tasks_up
from tests.test_ssh import only_run, wait_for, write_job

pytestmark = pytest.mark.ssh

LISTENS = """
    import json, os, socket, sys
    config = json.loads(os.environ["TF_CONFIG"])
    me = config["cluster"][config["task"]["type"]][config["task"]["index"]]
    server = socket.create_server(("0.0.0.0", int(me.rsplit(":", 1)[1])))
    server.settimeout(0.1)
    print("up", os.environ["TFL_TASK"], os.getpid(), flush=True)
    done = os.environ["DONE"]
    while not os.path.exists(done):
        try:
            server.accept()[0].close()
        except OSError:
            pass
    sys.exit(int(open(done).read()))
"""
FENCE = 6.0  # the agents' dead-man timer here (30 s by default)
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError as exc:
    sys.exit(f"{type(exc).__name__}")
"""


def fenced_cluster(tmp_path: Path, bed: NetBed) -> tuple[Path, dict[str, int]]:
    """chief on h1, worker on h2, h3 outside; the file and task -> port."""
    h1, h2, _ = bed.addresses
    ports = {"chief:0": free_port(), "worker:0": free_port()}
    tasks = {"chief": [f"{h1}:{ports['chief:0']}"], "worker": [f"{h2}:{ports['worker:0']}"]}
    path = bed.cluster_file(tmp_path / "cluster.json", tasks, sys.executable, ssh={"fence_after": FENCE, "firewall": True},
                            env={"DONE": str(tmp_path / "done")})
    data = json.loads(path.read_text())
    data["hosts"] = {h: s for h, s in data["hosts"].items() if h in (h1, h2)}
    path.write_text(json.dumps(data))
    return path, ports


def reaches(bed: NetBed, source: str, address: str, port: int) -> bool:
    """Can a process on ``source`` open a TCP connection to ``address:port``? (A dropped SYN: 3 s.)"""
    done = subprocess.run(["ip", "netns", "exec", bed.host(source).netns, sys.executable, "-c", CONNECT, address, str(port)],
                          capture_output=True, text=True, timeout=30)
    return done.returncode == 0


OTHERS_PYTHON = Path("/usr/bin/python3")  # one every user may run (the test's own may sit in a private home)
NOBODY, DAEMON = (65534, 65534), (1, 1)  # (uid, gid): users other than the run's


def reaches_as(bed: NetBed, user: tuple[int, int], source: str, address: str, port: int) -> bool:
    """``reaches``, from a process of another user (``user``) on ``source``."""
    if not OTHERS_PYTHON.exists():
        pytest.skip(f"{OTHERS_PYTHON} is missing: no python another user can run")
    done = subprocess.run(["ip", "netns", "exec", bed.host(source).netns, "setpriv", f"--reuid={user[0]}",
                           f"--regid={user[1]}", "--clear-groups", str(OTHERS_PYTHON), "-c", CONNECT, address, str(port)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 or "Error" in done.stderr or "timeout" in done.stderr, done.stderr  # it ran, as that user
    return done.returncode == 0


def run_tables(bed: NetBed) -> dict[str, list[str]]:
    """host -> its ``tfl_`` nftables tables."""
    found = {}
    for host in bed.hosts:
        out = subprocess.run(["ip", "netns", "exec", host.netns, "nft", "list", "tables"], capture_output=True, text=True,
                             check=True).stdout
        found[host.address] = [line for line in out.splitlines() if " tfl_" in line]
    return found


def no_tables(bed: NetBed) -> bool:
    return not any(run_tables(bed).values())


@pytest.mark.parametrize("end", ["succeeded", "failed", "stopped", "killed"])
def test_only_the_runs_hosts_reach_its_task_ports_and_no_table_outlives_the_run(
        end: str, netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    cluster, ports = fenced_cluster(tmp_path, netbed)
    launcher = start(write_job(tmp_path / "src", LISTENS), cluster, child_env)
    try:
        pids = tasks_up(tfl_home, 2, launcher)
        run = only_run(tfl_home)
        tables = run_tables(netbed)
        table = f"table inet tfl_{''.join(c if c.isalnum() else '_' for c in run)}"
        assert tables == {h1: [table], h2: [table], h3: []}, tables
        if end == "succeeded":
            assert reaches(netbed, h2, h1, ports["chief:0"])  # a peer
            assert reaches(netbed, h1, h2, ports["worker:0"])
            assert not reaches(netbed, h3, h1, ports["chief:0"])  # outside the run
            assert not reaches(netbed, h3, h2, ports["worker:0"])
            assert reaches(netbed, h3, h1, 22)  # nothing else is touched: the host's sshd answers
        if end in ("succeeded", "failed"):
            # At once whole: a task that saw the file before its text was written read "" (a loaded CI run)
            write_atomic(tmp_path / "done", "0" if end == "succeeded" else "3")
            launcher.communicate(timeout=120)
            assert launcher.returncode == (0 if end == "succeeded" else 1)
        elif end == "stopped":
            stop = subprocess.run([sys.executable, "-m", "launcher", "stop", run], env=child_env, capture_output=True,
                                  text=True, timeout=120)
            assert stop.returncode == 0, stop.stderr
            launcher.communicate(timeout=120)
        else:
            launcher.send_signal(signal.SIGKILL)
            launcher.wait(10)
            # The agents hear their stdin end: the tasks' stop them, the firewall's removes the table.
            wait_for(lambda: no_tables(netbed) and not any(pid_alive(p) for p in pids.values()), timeout=FENCE + 20)
    finally:
        launcher.kill()
        launcher.wait(10)
    assert run_tables(netbed) == {h1: [], h2: [], h3: []}
    assert not any(pid_alive(p) for p in pids.values())
    assert tfl_processes(run_id=run) == []
    wait_for(lambda: _agents(netbed) == [], timeout=FENCE + 20)


def test_other_users_on_the_runs_hosts_cannot_reach_its_task_ports(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """Their connections come from a run host's own address (or over loopback), which the input chain
    admits: each host's output chain refuses them at the source, the run's own user's it lets out."""
    h1, h2, _ = netbed.addresses
    cluster, ports = fenced_cluster(tmp_path, netbed)
    chief, worker = ports["chief:0"], ports["worker:0"]
    launcher = start(write_job(tmp_path / "src", LISTENS), cluster, child_env)
    try:
        pids = tasks_up(tfl_home, 2, launcher)
        assert not reaches_as(netbed, NOBODY, h1, "127.0.0.1", chief), "another user on the chief's host, over loopback"
        assert not reaches_as(netbed, NOBODY, h1, h1, chief), "another user on the chief's host, by its address"
        assert not reaches_as(netbed, NOBODY, h2, h1, chief), "another user on a peer host"
        assert not reaches_as(netbed, DAEMON, h1, h2, worker), "another user on the chief's host, to the worker"
        assert reaches(netbed, h1, "127.0.0.1", chief) and reaches(netbed, h1, h1, chief)  # the run's user (root here)
        assert reaches(netbed, h2, h1, chief) and reaches(netbed, h1, h2, worker)
        assert reaches_as(netbed, NOBODY, h1, h2, 22)  # nothing else is touched: the peer's sshd answers them
        write_atomic(tmp_path / "done", "0")
        out, err = launcher.communicate(timeout=120)
        assert launcher.returncode == 0, err[-3000:]
    finally:
        launcher.kill()
        launcher.wait(10)
    assert no_tables(netbed)
    assert not any(pid_alive(p) for p in pids.values())
    wait_for(lambda: _agents(netbed) == [], timeout=FENCE + 20)


def test_the_output_chain_lets_a_non_root_run_users_connections_out(netbed: NetBed) -> None:
    """The bed logs in as root; here the run's user is ``nobody``: its connections to the port go out
    (loopback and the host's address), another user's (``daemon``) do not. The rules are the agent's own."""
    h1 = netbed.addresses[0]
    ns = netbed.host(h1).netns
    port = free_port()
    server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", SERVES, str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        assert reaches_as(netbed, DAEMON, h1, h1, port)  # no table yet: anyone
        rules = (agent.ruleset("tfl_t", "input_ab", [port], [h1], [])
                 + agent.output_ruleset("tfl_t", "output_ab", NOBODY[0], [port], [[h1, port]]))
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True, check=True, timeout=30)
        try:
            assert reaches_as(netbed, NOBODY, h1, "127.0.0.1", port) and reaches_as(netbed, NOBODY, h1, h1, port)
            assert not reaches_as(netbed, DAEMON, h1, "127.0.0.1", port)
            assert not reaches_as(netbed, DAEMON, h1, h1, port)
            assert reaches(netbed, h1, h1, port)  # root
        finally:
            subprocess.run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "tfl_t"], check=True, timeout=30)
    finally:
        server.kill()
        server.wait(10)


@pytest.mark.slow
def test_tensorflow_trains_over_two_fenced_hosts(netbed: NetBed, tmp_path: Path, tfl_home: Path,
                                                 child_env: dict[str, str]) -> None:
    """jobs/mnist.py, MultiWorkerMirroredStrategy over both chains: the coordination service on the
    chief's port, the collectives between the hosts, the chief's own loopback (the bed logs in as root)."""
    from tests.hostenv import host_python
    from tests.test_ssh_multihost import EPOCH, MNIST, QUIET, cluster

    path = cluster(tmp_path, netbed, host_python("hostenv"), env=QUIET, ssh={"firewall": True})
    result = subprocess.run([sys.executable, "-m", "launcher", "launch", MNIST, "--cluster", str(path), "--", "--epochs", "2",
                             "--steps-per-epoch", "5", "--batch-size", "32"], env=child_env, capture_output=True, text=True,
                            timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    run = only_run(tfl_home)
    status = subprocess.run([sys.executable, "-m", "launcher", "status", run], env=child_env, capture_output=True, text=True,
                            timeout=120)
    assert "host, fenced" in status.stdout, status.stdout  # the tables were installed (else the launch is refused)
    for log in ("chief-0.log", "worker-0.log"):
        assert [int(e) for e in EPOCH.findall((tfl_home / "runs" / run / "logs" / log).read_text())] == [1, 2], log
    assert no_tables(netbed)
    wait_for(lambda: _agents(netbed) == [], timeout=FENCE + 20)


SERVES = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("up", flush=True)
while True:
    server.accept()[0].close()
"""


# As the job kit does on SIGTERM (the notice: agree on a step, save), the task keeps serving on its port.
TAKES_ITS_GRACE = LISTENS.replace("    import json, os, socket, sys\n",
                                  "    import json, os, signal, socket, sys\n    signal.signal(signal.SIGTERM, lambda *_: None)\n")


def test_a_lost_launchers_tasks_stay_fenced_for_as_long_as_they_serve(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """The agents that lose the launcher give its tasks their grace (SIGTERM, 30 s, SIGKILL): all that
    while a task's port still answers, and so must stay out of reach of the hosts outside the run."""
    h1, h2, h3 = netbed.addresses
    cluster, ports = fenced_cluster(tmp_path, netbed)
    launcher = start(write_job(tmp_path / "src", TAKES_ITS_GRACE), cluster, child_env)
    try:
        pids = tasks_up(tfl_home, 2, launcher)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        looks = 0
        while True:
            tables = run_tables(netbed)  # first the tables, then the tasks: a table gone before they are is seen
            if not any(pid_alive(p) for p in pids.values()):
                break
            assert tables[h1] and tables[h2], f"a task still serves, its table is gone: {tables}"
            assert not reaches(netbed, h3, h1, ports["chief:0"]), "a host outside the run reached a live task"
            looks += 1
        assert looks >= 1  # the tasks outlived the launcher (their grace): the window was looked at
        wait_for(lambda: no_tables(netbed), timeout=FENCE + 20)  # and the tables go once the tasks have
    finally:
        launcher.kill()
        launcher.wait(10)
    assert tfl_processes(run_id=only_run(tfl_home)) == []
    wait_for(lambda: _agents(netbed) == [], timeout=FENCE + 20)


def test_a_host_without_nft_refuses_the_launch_in_one_line_naming_it(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, _ = netbed.addresses
    cluster, _ = fenced_cluster(tmp_path, netbed)
    netbed.home(h2).mkdir(parents=True, exist_ok=True)
    (netbed.home(h2) / ".bashrc").write_text("export TFL_TEST_NFT=/nonexistent/nft\n")  # the agent's test-only switch
    result = subprocess.run([sys.executable, "-m", "launcher", "launch", str(write_job(tmp_path / "src", LISTENS)),
                             "--cluster", str(cluster)], env=child_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tfl: error: {h2}: cannot fence the task ports"), result.stderr
    assert "nft not found" in lines[0] and "install nftables" in lines[0] and "ssh.firewall" in lines[0], lines
    assert not list(tfl_home.glob("runs/*/logs/*.log")) or "up " not in "".join(
        p.read_text() for p in tfl_home.glob("runs/*/logs/*.log"))  # no task started
    assert run_tables(netbed)[h1] == []  # the first host's table, installed before the refusal, is gone again
    wait_for(lambda: _agents(netbed) == [], timeout=FENCE + 20)


def _agents(bed: NetBed) -> list[int]:
    """The tfl agents still alive on the bed's hosts."""
    found = []
    for host in bed.hosts:
        for pid in bed.pids(host):
            try:
                if "tfl-agent" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(pid)
            except OSError:
                pass
    return found


def test_an_elastic_run_a_lost_hosts_table_goes_with_it_and_comes_back_with_it(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    """A cut host's agent removes its table with its task (the fence); taken back, the host gets the
    run's table again before its task starts, and the others kept admitting it meanwhile."""
    from tests.test_elastic_bed import STEPS, TOTAL, finish, record, release, training, ups

    h1, h2, h3 = netbed.addresses
    tasks = {"chief": [f"{h1}:{free_port()}"], "worker": [f"{h2}:{free_port()}", f"{h3}:{free_port()}"]}
    (tmp_path / "shared").mkdir()
    cluster = netbed.cluster_file(tmp_path / "cluster.json", tasks, sys.executable,
                                  ssh={"fence_after": FENCE, "firewall": True}, storage={"path": str(tmp_path / "shared")},
                                  elastic={"min_tasks": 2, "global_batch": 6})
    job = write_job(tmp_path / "src", STEPS.format(total=TOTAL))  # the last step waits for ``release``
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--cluster", str(cluster),
                                 "--probe-interval", "2", "--grace-period", "10", "--", str(tmp_path / "shared")],
                                env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        training(tmp_path, tfl_home, launcher)
        table = run_tables(netbed)[h1]
        assert len(table) == 1 and run_tables(netbed) == {h1: table, h2: table, h3: table}
        netbed.cut(h3)
        wait_for(lambda: len(record(tfl_home).get("resizes", [])) == 1, timeout=120)
        wait_for(lambda: run_tables(netbed)[h3] == [], timeout=FENCE + 20)  # fenced on the cut host itself
        assert run_tables(netbed) == {h1: table, h2: table, h3: []}
    finally:
        netbed.join(h3)
    try:
        wait_for(lambda: len(record(tfl_home).get("resizes", [])) == 2 and sum(u[2] == 3 for u in ups(tfl_home)) >= 6,
                 timeout=180)
        assert run_tables(netbed) == {h1: table, h2: table, h3: table}
        rules = subprocess.run(["ip", "netns", "exec", netbed.host(h3).netns, "nft", "list", *table[0].split()],
                               capture_output=True, text=True, check=True).stdout
        port = tasks["worker"][1].rsplit(":", 1)[1]
        assert f"ip saddr {{ {h1}, {h2}, {h3} }} tcp dport {port} accept" in rules, rules  # the run's hosts, its port
        assert f"tcp dport {port} drop" in rules, rules
    finally:
        release(tmp_path)
        out, err = finish(launcher, tfl_home)
    assert launcher.returncode == 0, err[-3000:]
    assert run_tables(netbed) == {h1: [], h2: [], h3: []}
