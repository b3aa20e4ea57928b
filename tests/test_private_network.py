"""A local run's private network (``--network``), with real processes: the task ports are
unreachable from an "outside" host (a network namespace on a bridge, ``tests.netbed``) and from
this machine, reachable between the tasks; the tasks still download from an HTTP server
outside; the fallback and the refusal; an ordinary user; nothing left afterwards. Real TensorFlow
trains in a private network in tests/test_e2e_tf.py::test_local_cluster_with_evaluator (``--network
auto`` chooses it here): one real-TensorFlow run proves both, at one run's start-up cost."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.netbed import NetBed
from tests.procs import pid_alive

DENY = "TFL_TEST_DENY_NETNS"  # launcher/engines/local/node/netns_holder.py reads it, for tests only
JOB = '''
import json, os, socket, sys, threading, time, urllib.request
cluster = json.loads(os.environ["TF_CONFIG"])["cluster"]
me = json.loads(os.environ["TF_CONFIG"])["task"]
mine = cluster[me["type"]][me["index"]]
name = f"{me['type']}-{me['index']}"
out = sys.argv[2]
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(mine.rsplit(":", 1)[1])))  # as TensorFlow binds: every interface
server.listen(16)
def answer():
    while True:
        conn, _ = server.accept()
        conn.sendall(name.encode()); conn.close()
threading.Thread(target=answer, daemon=True).start()
peers = {}
for peer in (a for a in cluster["chief"] + cluster.get("worker", []) if a != mine):
    host, port = peer.rsplit(":", 1)
    for _ in range(600):
        try:
            with socket.create_connection((host, int(port)), timeout=2) as c:
                peers[peer] = c.recv(64).decode(); break
        except OSError:
            time.sleep(0.1)
try:
    download = urllib.request.urlopen(sys.argv[1], timeout=30).read().decode()
except OSError as exc:
    download = f"failed: {exc}"
result = {"peers": peers, "download": download, "netns": os.readlink("/proc/self/ns/net"), "pid": os.getpid()}
with open(f"{out}/{name}.tmp", "w") as f:
    json.dump(result, f)
os.replace(f"{out}/{name}.tmp", f"{out}/{name}.json")
while not os.path.exists(f"{out}/done"):
    time.sleep(0.05)
'''


def _tfl(args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _wait_for(paths: list[Path], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout  # a hang guard
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"never written: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.05)


def _connects(host: str, port: int, netns: str | None = None) -> bool:
    """Whether a TCP connect to host:port succeeds, from this namespace or from ``netns``."""
    code = f"import socket; socket.create_connection(({host!r}, {port}), timeout=3).close()"
    prefix = ["ip", "netns", "exec", netns] if netns else []
    return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True).returncode == 0


def _netns_pids(link: str, home: str | None = None) -> list[int]:
    """Every process whose network namespace is ``link`` (``net:[inode]``); with ``home``, only
    those started under that run store (TFL_HOME): once a namespace is gone the kernel may give
    its inode number to another session's new one."""
    found = []
    for pid in psutil.pids():
        try:
            if os.readlink(f"/proc/{pid}/ns/net") == link and (
                    home is None or psutil.Process(pid).environ().get("TFL_HOME") == home):
                found.append(pid)
        except (OSError, psutil.Error):
            pass
    return found


def _slirps(holders: list[int]) -> list[int]:
    return [p.pid for p in psutil.process_iter(["pid", "cmdline"])
            if p.info["cmdline"] and "slirp4netns" in p.info["cmdline"][0] and
            any(str(h) in p.info["cmdline"] for h in holders)]


@pytest.mark.parametrize("mode", ["private", "host"])
def test_task_ports_reachable_only_by_each_other(mode: str, netbed: NetBed, child_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    if mode == "private" and shutil.which("slirp4netns") is None:
        pytest.skip("slirp4netns not installed (apt-get install slirp4netns; .ci/run installs it)")
    outside, web = netbed.hosts[0], netbed.hosts[1]
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "data.txt").write_text("the dataset")
    server = subprocess.Popen(["ip", "netns", "exec", web.netns, sys.executable, "-m", "http.server", "8080", "--bind",
                               web.address, "--directory", str(tmp_path / "www")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "job.py").write_text(JOB)
    try:
        started = _tfl(["launch", str(tmp_path / "job.py"), "--local", "2", "--network", mode, "--detach", "--",
                        f"http://{web.address}:8080/data.txt", str(out)], child_env)
        assert started.returncode == 0, started.stderr
        run_id = started.stdout.strip()
        _wait_for([out / "chief-0.json", out / "worker-0.json"])
        results = {n: json.loads((out / f"{n}.json").read_text()) for n in ("chief-0", "worker-0")}
        plan = json.loads((Path(child_env["TFL_HOME"]) / "runs" / run_id / "state.json").read_text())["plan"]
        ports = [t["port"] for t in plan["tasks"]]
        reach = {"outside host": [_connects(netbed.gateway, p, outside.netns) for p in ports],
                 "this machine": [_connects("127.0.0.1", p) for p in ports]}
        links = {r["netns"] for r in results.values()}
        tasks = [r["pid"] for r in results.values()]
        members = _netns_pids(next(iter(links))) if mode == "private" else tasks
        helpers = [p for p in members if p not in tasks] + _slirps(members)
        status = _tfl(["status", run_id], child_env).stdout
    finally:
        (out / "done").touch()
    _wait_for([Path(child_env["TFL_HOME"]) / "runs" / run_id / "state.json"])
    deadline = time.monotonic() + 60
    while json.loads(_tfl(["status", run_id, "--json"], child_env).stdout)["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    server.kill()
    server.wait()
    view = json.loads(_tfl(["status", run_id, "--json"], child_env).stdout)
    assert view["state"] == "succeeded" and view["network"] == mode
    assert f"network: {mode}" in status
    for result in results.values():  # each task reached the other, and the web outside
        assert list(result["peers"].values()) in (["chief-0"], ["worker-0"]), result
        assert result["download"] == "the dataset"
    mine = os.readlink("/proc/self/ns/net")
    if mode == "private":
        assert links != {mine} and len(links) == 1  # one namespace of their own, shared
        assert reach == {"outside host": [False, False], "this machine": [False, False]}
        assert len(helpers) == 2, helpers  # the holder and slirp4netns
    else:
        assert links == {mine}
        assert reach == {"outside host": [True, True], "this machine": [True, True]}  # the exposure the mode removes
    deadline, link = time.monotonic() + 10, next(iter(links))
    while any(pid_alive(p) for p in [*members, *helpers, server.pid]) or (
            mode == "private" and _netns_pids(link, child_env["TFL_HOME"])):
        assert time.monotonic() < deadline, "the run's processes or its namespace outlived it"
        time.sleep(0.1)


def test_fallback_says_so_in_one_line_and_runs_on_the_host(tmp_path: Path, child_env: dict[str, str]) -> None:
    (tmp_path / "job.py").write_text("print('ran')\n")
    result = _tfl(["launch", str(tmp_path / "job.py"), "--local", "2"], {**child_env, DENY: "1"})
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "no private network" in line]
    assert len(warnings) == 1 and "Operation not permitted" in warnings[0], result.stderr
    (run,) = (Path(child_env["TFL_HOME"]) / "runs").iterdir()
    assert json.loads(_tfl(["status", run.name, "--json"], child_env).stdout)["network"] == "host"


def test_a_detached_launch_shows_the_fallback_line_too(tmp_path: Path, child_env: dict[str, str]) -> None:
    (tmp_path / "job.py").write_text("print('ran')\n")
    result = _tfl(["launch", str(tmp_path / "job.py"), "--local", "2", "--detach"], {**child_env, DENY: "1"})
    assert result.returncode == 0, result.stderr
    assert len([line for line in result.stderr.splitlines() if "no private network" in line]) == 1, result.stderr
    run_dir = _run_dir(child_env, result.stdout.strip())
    deadline = time.monotonic() + 60
    while json.loads((run_dir / "state.json").read_text())["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_network_private_refuses_where_no_namespace_can_be_made(tmp_path: Path, child_env: dict[str, str]) -> None:
    (tmp_path / "job.py").write_text("print('ran')\n")
    result = _tfl(["launch", str(tmp_path / "job.py"), "--local", "2", "--network", "private"], {**child_env, DENY: "1"})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("tfl: error: --network private:"), result.stderr
    assert "ran" not in result.stdout
    assert not list((Path(child_env["TFL_HOME"]) / "runs").glob("*/state.json"))  # refused before the run existed


@pytest.mark.parametrize("network", ["private", "host"])
def test_a_python_that_does_not_exist_is_one_line_in_either_network(tmp_path: Path, child_env: dict[str, str],
                                                                    network: str) -> None:
    """Through nsenter the task started and failed ("nsenter: failed to execute /nope/python", a failed
    run with a log tail); on the host network it was tfl's one line once the run existed. Now the
    launch's preflight refuses it in both, before the run exists (as `--detach` does too)."""
    (tmp_path / "job.py").write_text("print('ran')\n")
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": {"chief": ["localhost:23999"]},
                                   "hosts": {"localhost": {"python": str(tmp_path / "no-python")}}}))
    result = _tfl(["launch", str(tmp_path / "job.py"), "--cluster", str(cluster), "--network", network], child_env)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"tfl: error: localhost: python '{tmp_path / 'no-python'}' not found (no such file); set "
                             "hosts.localhost.python to a python that has tensorflow\n"), result.stderr
    assert "nsenter" not in result.stderr + result.stdout
    assert not list((Path(child_env["TFL_HOME"]) / "runs").glob("*/state.json"))  # refused before the run existed


def test_network_private_refuses_ssh_hosts(tmp_path: Path, child_env: dict[str, str]) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": {"chief": ["198.51.100.250:2222"]}, "ssh": {"user": "nobody"}}))
    (tmp_path / "job.py").write_text("print('ran')\n")
    result = _tfl(["launch", str(tmp_path / "job.py"), "--cluster", str(cluster), "--network", "private", "--dry-run"],
                  child_env)
    assert result.returncode == 2 and "firewall" in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_an_ordinary_user_gets_a_namespace_of_a_user_namespace(tmp_path: Path) -> None:
    """As uid 65534 (nobody): the holder makes a user namespace that maps only the user's own ids,
    the loopback is up inside, tasks keep their uid, and the holder ends with ``close``."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to become another user (setpriv)")
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK) or not os.stat(ROOT).st_mode & 0o005:
        pytest.skip(f"{python} or the checkout is not usable by another user")
    code = ("import json, subprocess, sys\n"
            "sys.executable = sys.argv[1]\n"
            "from launcher.engines.local.netns import make_private_network\n"
            "net = make_private_network(outbound=False)\n"
            "probe = 'import os, socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); '\\\n"
            "        'socket.create_connection(s.getsockname()).close(); print(os.getuid(), os.readlink(\"/proc/self/ns/net\"))'\n"
            "inside = subprocess.run(net.enter([sys.argv[1], '-c', probe]), capture_output=True, text=True)\n"
            "net.close()\n"
            "print(json.dumps({'user_ns': net.user_ns, 'inside': inside.stdout.split(), 'rc': inside.returncode,\n"
            "                  'err': inside.stderr, 'holder': net.holder.pid, 'alive': net.holder.poll() is None}))\n")
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", code, python],
                            capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["rc"] == 0, seen["err"]
    assert seen["user_ns"] and seen["inside"][0] == "65534"
    assert seen["inside"][1] != os.readlink("/proc/self/ns/net") and not seen["alive"]
    assert not pid_alive(seen["holder"])


def _run_dir(child_env: dict[str, str], run_id: str) -> Path:
    return Path(child_env["TFL_HOME"]) / "runs" / run_id


def _private_helpers(task_pid: int) -> tuple[str, list[int]]:
    """A private run's namespace (``net:[inode]``) and every process in it or serving it."""
    link = os.readlink(f"/proc/{task_pid}/ns/net")
    members = _netns_pids(link)
    return link, members + _slirps(members)


def test_restart_stop_and_a_killed_launcher_keep_working_privately(tmp_path: Path, child_env: dict[str, str]) -> None:
    """A restart runs in the same namespace; `tfl stop` ends a private run; a launcher killed with
    SIGKILL takes its holder and slirp4netns with it, `tfl stop` then ends the tasks, and the
    namespace is gone with them."""
    job = tmp_path / "job.py"
    job.write_text("import os, sys, time\n"
                   "open(os.path.join(sys.argv[1], f\"{os.environ['TFL_TASK'].split(':')[0]}-{os.environ['TFL_ATTEMPT']}\"), 'w')"
                   ".write(os.readlink('/proc/self/ns/net'))\n"
                   "if os.environ['TFL_TASK'] == 'chief:0' and os.environ['TFL_ATTEMPT'] == '0':\n"
                   "    while not os.path.exists(os.path.join(sys.argv[1], 'worker-0')): time.sleep(0.05)\n"
                   "    sys.exit(3)  # once the worker has written its file\n"
                   "time.sleep(600)\n")
    out = tmp_path / "out"
    out.mkdir()
    started = _tfl(["launch", str(job), "--local", "2", "--max-restarts", "1", "--detach", "--", str(out)], child_env)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    _wait_for([out / "chief-1", out / "worker-1"])
    assert len({(out / n).read_text() for n in ("chief-0", "worker-0", "chief-1", "worker-1")}) == 1  # one namespace
    record = json.loads((_run_dir(child_env, run_id) / "state.json").read_text())
    launcher = record["launcher_pid"]
    tasks = [t["pid"] for t in record["tasks"] if t["pid"]]
    while len(tasks) < 2 or any(t["attempt"] != 1 for t in record["tasks"]):
        time.sleep(0.1)
        record = json.loads((_run_dir(child_env, run_id) / "state.json").read_text())
        tasks = [t["pid"] for t in record["tasks"] if t["pid"]]
    link, helpers = _private_helpers(tasks[0])
    helpers = [p for p in helpers if p not in tasks]
    assert len(helpers) == 2, helpers
    os.kill(launcher, 9)
    deadline = time.monotonic() + 20
    while any(pid_alive(p) for p in helpers):  # they end with the launcher; the tasks go on
        assert time.monotonic() < deadline, "holder or slirp4netns outlived the launcher"
        time.sleep(0.1)
    assert all(pid_alive(p) for p in tasks)
    stopped = _tfl(["stop", run_id], child_env)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 20
    while any(pid_alive(p) for p in tasks) or _netns_pids(link, child_env["TFL_HOME"]):
        assert time.monotonic() < deadline, "tasks or their namespace outlived `tfl stop`"
        time.sleep(0.1)
    assert json.loads(_tfl(["status", run_id, "--json"], child_env).stdout)["network"] == "private"


def network_helpers(home: Path) -> list[int]:
    """Live namespace holders and slirp4netns processes started by a launcher of ``home``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
            if ("netns_holder.py" in line or "slirp4netns" in line) and proc.environ().get("TFL_HOME") == str(home):
                found.append(proc.pid)
        except psutil.Error:
            pass
    return found


def test_a_resumed_private_run_gets_a_namespace_again(tmp_path: Path, child_env: dict[str, str]) -> None:
    job = tmp_path / "job.py"
    job.write_text("import os, sys, time\n"
                   "open(os.path.join(sys.argv[1], os.environ['TFL_TASK'].replace(':', '-') + '-' + os.environ['TFL_ATTEMPT']), 'w')"
                   ".write(os.readlink('/proc/self/ns/net'))\n"
                   "if os.environ['TFL_ATTEMPT'] == '0':\n"
                   "    if os.environ['TFL_TASK'] == 'chief:0':  # fails once the worker has written its file\n"
                   "        while not os.path.exists(os.path.join(sys.argv[1], 'worker-0-0')): time.sleep(0.05)\n"
                   "        sys.exit(3)\n"
                   "    time.sleep(600)  # the worker: stopped when the chief fails\n")
    out = tmp_path / "out"
    out.mkdir()
    failed = _tfl(["launch", str(job), "--local", "2", "--", str(out)], child_env)
    assert failed.returncode != 0
    (run,) = (Path(child_env["TFL_HOME"]) / "runs").iterdir()
    first = {(out / f"{t}-0").read_text() for t in ("chief-0", "worker-0")}
    assert len(first) == 1 and not _netns_pids(next(iter(first)), child_env["TFL_HOME"])  # gone with the failed attempt
    resumed = _tfl(["resume", run.name], child_env)
    assert resumed.returncode == 0, resumed.stderr
    second = {(out / f"{t}-1").read_text() for t in ("chief-0", "worker-0")}
    # A new namespace (the kernel may give it the freed one's inode number, so that is not compared).
    assert len(second) == 1 and os.readlink("/proc/self/ns/net") not in first | second
    assert json.loads(_tfl(["status", run.name, "--json"], child_env).stdout)["network"] == "private"
    assert not _netns_pids(second.pop(), child_env["TFL_HOME"])


def test_network_private_without_nsenter_names_the_install_not_user_namespaces(tmp_path: Path,
                                                                               child_env: dict[str, str]) -> None:
    """Without nsenter the refusal said to allow user namespaces (sysctl), which would not help."""
    (tmp_path / "job.py").write_text("print('ran')\n")
    (tmp_path / "bin").mkdir()  # a PATH with no nsenter on it
    result = _tfl(["launch", str(tmp_path / "job.py"), "--local", "2", "--network", "private"],
                  {**child_env, "PATH": str(tmp_path / "bin")})
    assert result.returncode == 2
    assert result.stderr == ("tfl: error: --network private: this machine cannot make a network namespace (nsenter not "
                             "found); install nsenter (Debian: apt-get install util-linux), or run with --network "
                             "host\n"), result.stderr
    assert not list((Path(child_env["TFL_HOME"]) / "runs").glob("*/state.json"))  # refused before the run existed


def test_a_port_held_on_this_machine_does_not_refuse_a_private_run(tmp_path: Path, child_env: dict[str, str]) -> None:
    """The launch checked the task ports on this machine's network, so a port held there refused a
    --network private run, whose tasks bind it in a namespace of their own; on the host network (and
    under auto, which may fall back to it: tests/test_lifecycle.py) it still refuses."""
    job = tmp_path / "job.py"
    job.write_text("import json, os, socket\n"
                   "port = int(json.loads(os.environ['TF_CONFIG'])['cluster']['chief'][0].rsplit(':', 1)[1])\n"
                   "socket.socket().bind(('0.0.0.0', port)); print('bound', port)\n")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cluster = tmp_path / "c.json"
        cluster.write_text(json.dumps({"cluster": {"chief": [f"localhost:{port}"]}}))
        private = _tfl(["launch", str(job), "--cluster", str(cluster), "--network", "private"], child_env)
        host = _tfl(["launch", str(job), "--cluster", str(cluster), "--network", "host"], child_env)
    assert private.returncode == 0, private.stderr
    assert f"bound {port}" in private.stdout
    assert host.returncode == 2 and f"port {port} of chief:0 is in use" in host.stderr, host.stderr


def test_a_private_run_resumed_where_no_namespace_can_be_made_is_refused_naming_the_run(tmp_path: Path,
                                                                                       child_env: dict[str, str]) -> None:
    """The refusal said `--network private: …, or run with --network host`: an option the user never gave
    (the launch was `auto`) and one `tfl resume` does not have."""
    (tmp_path / "job.py").write_text("import sys\nsys.exit(3)\n")
    failed = _tfl(["launch", str(tmp_path / "job.py"), "--local", "2"], child_env)
    assert failed.returncode != 0
    (run,) = (Path(child_env["TFL_HOME"]) / "runs").iterdir()
    assert json.loads(_tfl(["status", run.name, "--json"], child_env).stdout)["network"] == "private"
    resumed = _tfl(["resume", run.name], {**child_env, DENY: "1"})
    assert resumed.returncode == 2
    assert resumed.stderr == (f"tfl: error: run {run.name} ran in a network namespace of its own, and this machine cannot make "
                              "one now (unshare: Operation not permitted); allow user namespaces (sysctl "
                              "user.max_user_namespaces) to resume it: a resumed run keeps its network "
                              "(docs/security.md)\n"), resumed.stderr
    assert json.loads((run / "state.json").read_text())["attempt"] == 0  # no attempt started
