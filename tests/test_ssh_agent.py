"""The remote agent on its own: started exactly as over SSH, but through local pipes.

What sshd would connect to the agent's stdin/stdout is a pipe here, so losing the
launcher is simply closing stdin (or going quiet), with no sshd involved. A host's tasks
run in one ``tasks`` session of the agent, each task's frames tagged with its id.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from launcher.engines.ssh.wire import BOOTSTRAP, MARK, agent_input, reply
from tests.procs import pid_alive

CHILD_AND_SLEEP = """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("ready", os.getpid(), child.pid, flush=True)
    time.sleep(300)
"""


def start_agent(request: dict[str, Any]) -> subprocess.Popen[bytes]:
    agent = subprocess.Popen([sys.executable, "-u", "-c", BOOTSTRAP], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    assert agent.stdin is not None
    agent.stdin.write(agent_input(request))
    agent.stdin.flush()
    return agent


def start_task(run: dict[str, Any], **session: Any) -> subprocess.Popen[bytes]:
    """An agent whose ``tasks`` session (``session``: its request's fields) runs ``run`` as task 1."""
    agent = start_agent({"mode": "tasks", **session})
    send(agent, {"id": 1, "run": run})
    return agent


def send(agent: subprocess.Popen[bytes], line: dict[str, Any]) -> None:
    assert agent.stdin is not None
    agent.stdin.write(json.dumps(line).encode() + b"\n")
    agent.stdin.flush()


# Agents whose mark was read (the frames follow it): the Popen objects, not their pids. Keyed by pid,
# a later agent of this worker that got an earlier one's pid (pid_max 32768 wraps within a suite
# run) had its mark read as a frame header: a length from the mark's bytes (~1.9e9), a read to the
# agent's end (its heartbeat timeout, 30 s), and no frames.
MARKED: weakref.WeakSet[subprocess.Popen[bytes]] = weakref.WeakSet()


def tagged_frames(agent: subprocess.Popen[bytes]) -> Iterator[tuple[bytes, int, bytes]]:
    """(kind, task id, payload) of each frame; a ping's id is 0."""
    assert agent.stdout is not None
    if agent not in MARKED:
        assert agent.stdout.read(len(MARK)) == MARK
        MARKED.add(agent)
    while header := agent.stdout.read(5):
        payload = agent.stdout.read(int.from_bytes(header[1:], "big"))
        if header[:1] == b"P":
            yield b"P", 0, payload
        else:
            yield header[:1], int.from_bytes(payload[:4], "big"), payload[4:]


def frames(agent: subprocess.Popen[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """Task 1's frames, until it is gone."""
    for kind, ident, payload in tagged_frames(agent):
        if ident == 1:
            yield kind, payload
            if kind == b"C" and "gone" in json.loads(payload):
                return


def run_request(tmp_path: Path, body: str, *args: str, **extra: Any) -> dict[str, Any]:
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(body))
    return {"argv": [sys.executable, "-u", str(job), *args], "env": {"MARK": "m1"},
            "cwd": str(tmp_path), "mkdirs": [str(tmp_path / "run" / "progress")], **extra}


def collect(agent: subprocess.Popen[bytes], until: bytes | None = None) -> tuple[list[dict[str, Any]], bytes]:
    controls, output = [], b""
    for kind, payload in frames(agent):
        if kind == b"C":
            controls.append(json.loads(payload))
        elif kind == b"O":
            output += payload
            if until and until in output:
                break
    return controls, output


def gone(pids: list[int], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_runs_the_job_verbatim_and_reports_pid_output_exit(tmp_path: Path) -> None:
    hostile = ["a b", "it's", '"q"', "x;y", "$(touch pwned)", "`id`", "*", "", "\n", "ü"]
    body = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['MARK'], os.getpgid(0) == os.getpid()])); sys.exit(3)"
    agent = start_task(run_request(tmp_path, body, *hostile))
    controls, output = collect(agent)
    assert controls[0]["pid"] == controls[0]["pgid"] and controls[0]["create_time"] > 0
    assert json.loads(output) == [hostile, "m1", True]  # own process group, env given, args verbatim
    assert controls[-2:] == [{"exit": 3}, {"gone": 3}] and not (tmp_path / "pwned").exists()
    assert (tmp_path / "run" / "progress").is_dir()
    assert agent.stdin is not None
    agent.stdin.close()  # the launcher is done: the agent leaves
    assert agent.wait(10) == 0


def test_stdin_eof_kills_the_whole_group(tmp_path: Path) -> None:
    agent = start_task(run_request(tmp_path, CHILD_AND_SLEEP, grace=1.0))
    _, output = collect(agent, until=b"\n")
    _, leader, child = output.split()
    assert agent.stdin is not None
    agent.stdin.close()  # the launcher (or its connection) is gone
    assert gone([int(leader), int(child)])
    controls, _ = collect(agent)
    assert controls[-2:] == [{"exit": -signal.SIGTERM}, {"gone": -signal.SIGTERM}]
    assert agent.wait(10) == 0


def test_silence_kills_the_job_after_the_heartbeat_timeout(tmp_path: Path) -> None:
    start = time.monotonic()
    agent = start_task(run_request(tmp_path, CHILD_AND_SLEEP, heartbeat_timeout=1.0, grace=1.0), heartbeat_timeout=1.0)
    _, output = collect(agent, until=b"\n")
    _, leader, child = output.split()
    assert gone([int(leader), int(child)], timeout=120) and time.monotonic() - start < 120  # not the 300 s sleep
    assert agent.wait(30) == 0  # silent too long: the agent fenced its task and left


def test_signal_line_reaches_the_group_and_sigkill_follows_an_ignored_term(tmp_path: Path) -> None:
    body = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    agent = start_task(run_request(tmp_path, body))
    collect(agent, until=b"ready")
    for signum in (signal.SIGTERM, signal.SIGKILL):
        send(agent, {"id": 1, "signal": int(signum)})
    controls, _ = collect(agent)
    assert controls[-2:] == [{"exit": -signal.SIGKILL}, {"gone": -signal.SIGKILL}]
    agent.kill()
    agent.wait(10)


def test_progress_file_is_forwarded(tmp_path: Path) -> None:
    progress = tmp_path / "run" / "progress" / "chief-0.json"
    body = f"""
        import json, time
        json.dump({{"epoch": 2, "step": 7}}, open({str(progress)!r}, "w"))
        time.sleep(1.5)
    """
    agent = start_task(run_request(tmp_path, body, progress_file=str(progress)))
    controls, _ = collect(agent)
    assert {"progress": json.dumps({"epoch": 2, "step": 7})} in controls
    agent.kill()
    agent.wait(10)


def test_missing_workdir_is_an_error_frame(tmp_path: Path) -> None:
    agent = start_task({**run_request(tmp_path, "pass"), "cwd": str(tmp_path / "nope"), "mkdirs": []})
    controls, _ = collect(agent)
    assert controls == [{"error": f"working directory {tmp_path / 'nope'} does not exist"}, {"gone": 126}]
    agent.kill()
    agent.wait(10)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def ask(request: dict[str, Any]) -> Any:
    out = subprocess.run([sys.executable, "-u", "-c", BOOTSTRAP], input=agent_input(request), capture_output=True, check=True)
    assert out.stdout.startswith(MARK)
    return reply(out.stdout)


def test_info_and_signal_trust_a_pid_only_with_its_create_time(sleeper: subprocess.Popen[bytes], tmp_path: Path) -> None:
    created = psutil.Process(sleeper.pid).create_time()
    tasks = [{"name": "chief:0", "pid": sleeper.pid, "create_time": created, "progress_path": str(tmp_path / "p.json")},
             {"name": "worker:0", "pid": sleeper.pid, "create_time": created - 100, "progress_path": ""}]
    (tmp_path / "p.json").write_text('{"epoch": 1}')
    info = ask({"mode": "info", "tasks": tasks})
    assert info["chief:0"]["alive"] and info["chief:0"]["rss_mb"] > 0 and info["chief:0"]["progress"] == {"epoch": 1}
    assert info["worker:0"]["alive"] is False  # same pid, other create time: a reused pid, not ours
    assert ask({"mode": "signal", "signal": int(signal.SIGTERM), "tasks": tasks[1:]}) == {"worker:0": "gone"}
    assert sleeper.poll() is None
    assert ask({"mode": "signal", "signal": int(signal.SIGTERM), "tasks": tasks[:1]}) == {"chief:0": "signalled"}
    assert sleeper.wait(10) == -signal.SIGTERM


def test_probe_reports_python_packages_ports_disk(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        facts = ask({"mode": "probe", "ports": [port], "workdir": str(tmp_path / "not" / "yet")})
    assert facts["executable"] == sys.executable and facts["packages"]["psutil"] == psutil.__version__
    assert facts["ports"][str(port)] and facts["disk"]["path"] == str(tmp_path) and facts["disk"]["free_gb"] > 0
    assert os.path.isabs(facts["executable"])


def test_create_time_without_psutil_matches_psutils(sleeper: subprocess.Popen[bytes]) -> None:
    # Agent and status query agree on a host without psutil: both use the /proc formula then.
    code = ("import sys; sys.modules['psutil'] = None; ns = {'__name__': 'agent'};"
            f"exec(open({str(Path(__file__).parents[1] / 'launcher' / 'engines' / 'ssh' / 'node' / 'agent.py')!r}).read(), ns);"
            f"print(ns['create_time']({sleeper.pid}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert abs(float(out.stdout) - psutil.Process(sleeper.pid).create_time()) < 0.01


def test_agent_source_parses_as_python_3_8() -> None:
    # It runs under whatever python the host has; annotations are strings (__future__).
    import ast

    for name in ("agent.py", "agent_tasks.py", "agent_files.py", "agent_firewall.py"):
        source = (Path(__file__).parents[1] / "launcher" / "engines" / "ssh" / "node" / name).read_text()
        ast.parse(source, feature_version=(3, 8))
        assert "from __future__ import annotations" in source, name


def test_one_session_checks_unpacks_then_runs_with_the_shipped_kit_first(tmp_path: Path) -> None:
    """What `tfl launch` sends a pre-started agent: a quick probe, the code and kit, then the run.
    This python has tfl installed (editable): the task must still import the shipped kit."""
    from launcher.engines.ssh.wire import archives, kit_archive

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "data.txt").write_text("shipped")
    (src / "job.py").write_text("from launcher import jobkit\nprint(open('pkg/data.txt').read(), jobkit.__file__, flush=True)\n")
    run_dir = tmp_path / "cache" / "runs" / "r1" / "h"
    dest, kit = run_dir / "code", run_dir / "kit"
    agent = start_agent({})  # the source only, like a pre-started agent
    assert agent.stdin is not None and agent.stdout is not None

    def say(request: dict[str, Any]) -> dict[str, Any]:
        agent.stdin.write((json.dumps(request) + "\n").encode())  # type: ignore[union-attr]
        agent.stdin.flush()  # type: ignore[union-attr]
        return reply(agent.stdout.readline())  # type: ignore[union-attr,no-any-return]

    try:
        facts = say({"mode": "probe", "quick": True, "ports": [], "workdir": str(dest)})
        assert facts["executable"] == sys.executable and "packages" not in facts  # quick: no package scan
        assert facts["tfl_cache"] == os.path.join(os.path.expanduser("~"), ".cache", "tfl")
        dirs = [{"path": str(p), "private": True} for p in (run_dir.parent.parent, run_dir.parent, run_dir)]
        done = say({"mode": "unpack", "dirs": dirs, "kit": str(kit),
                    "archives": [*archives([(str(src), str(dest))]), kit_archive(str(kit))]})
        assert done["dirs"] == {} and done["kit"]["ok"] and done["kit"]["file"] == str(kit / "launcher" / "jobkit" / "__init__.py")
        assert done["packages"]["tf_keras"] is not None
        assert all((p.stat().st_mode & 0o777) == 0o700 for p in (run_dir, dest, kit))
        broken = say({"mode": "unpack", "archives": [{"dest": str(dest), "data": "bm90IGEgdGFyYmFsbA=="}]})
        assert broken["error"].startswith("ReadError")
        assert (dest / "pkg" / "data.txt").read_text() == "shipped"
        send(agent, {"mode": "tasks"})
        send(agent, {"id": 1, "run": {"argv": [sys.executable, "-u", str(dest / "job.py")],
                                      "env": {"PYTHONPATH": str(kit)}, "cwd": str(dest), "mkdirs": []}})
        controls, output = collect(agent)
        assert output == f"shipped {kit / 'launcher' / 'jobkit' / '__init__.py'}\n".encode() and {"exit": 0} in controls
    finally:
        agent.kill()
        agent.wait()


def test_the_agent_pings_only_after_ping_every_seconds_of_silence_its_output_counting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ping is a packet the launcher must handle (most of an idle launcher's CPU at hundreds of
    tasks): the agent pings at the interval its request names, and output sent is as good as a ping.
    The agent's clock is a fake one the test moves; the job is ``cat``, which prints what it is given."""
    from types import SimpleNamespace

    from launcher.engines.ssh.node import agent_tasks as agent

    now = [100.0]
    monkeypatch.setattr(agent, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep))
    read_end, write_end = os.pipe()
    child = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
    assert child.stdin is not None
    commands = SimpleNamespace(heard=1e12)  # the launcher is never silent here
    request = {"ping_every": 3.0, "heartbeat_timeout": 1e9, "grace": 1.0}
    relay = threading.Thread(target=agent.relay, args=(child, agent.Frames(write_end), commands, request), daemon=True)
    seen: list[tuple[bytes, bytes]] = []

    def frame() -> tuple[bytes, bytes]:
        assert select.select([read_end], [], [], 30)[0], ("no frame within 30 s (a hang guard)", seen)
        head = os.read(read_end, 5)
        assert len(head) == 5
        body = os.read(read_end, int.from_bytes(head[1:], "big")) if head[1:] != b"\0\0\0\0" else b""
        seen.append((head[:1], body))
        return seen[-1]

    def say(line: bytes) -> None:
        child.stdin.write(line)  # type: ignore[union-attr]
        child.stdin.flush()  # type: ignore[union-attr]
        assert frame() == (b"O", line)

    def no_ping_after(seconds: float) -> None:
        now[0] += seconds
        time.sleep(0.5)  # the relay loop checks every 0.1 s: a ping due would be written by now
        os.set_blocking(read_end, False)
        try:
            unread = os.read(read_end, 5)
        except BlockingIOError:
            unread = b""  # nothing written since
        finally:
            os.set_blocking(read_end, True)
        assert unread == b"", (unread, seen)

    try:
        relay.start()
        assert frame() == (b"P", b"")  # silent since it started: a ping at once
        say(b"a\n")
        no_ping_after(2.9)
        say(b"b\n")  # output, not a ping: the ping's clock starts again from here
        no_ping_after(2.9)  # 5.8 s after the last ping: the old agent pinged every 2 s
        now[0] += 0.2  # 3.1 s of silence
        assert frame() == (b"P", b"")
        child.stdin.close()
        relay.join(30)
        assert not relay.is_alive() and child.wait(10) == 0
        assert json.loads(frame()[1]) == {"exit": 0}
    finally:
        child.kill()
        child.wait(10)
        os.close(read_end)
        os.close(write_end)
    assert not pid_alive(child.pid)


def test_one_session_runs_a_host_s_tasks_apart_and_its_end_fences_them_all(tmp_path: Path) -> None:
    """Two tasks in one session: each one's output and exit come tagged with its id, a signal goes
    to its task's group only, and stdin's end stops every group left."""
    agent = start_agent({"mode": "tasks"})
    (tmp_path / "b").mkdir()
    send(agent, {"id": 7, "run": run_request(tmp_path, CHILD_AND_SLEEP, grace=1.0)})
    send(agent, {"id": 9, "run": run_request(tmp_path / "b", CHILD_AND_SLEEP, grace=1.0)})
    seen: dict[int, list[Any]] = {7: [], 9: []}
    output: dict[int, bytes] = {7: b"", 9: b""}
    for kind, ident, payload in tagged_frames(agent):
        if kind == b"O":
            output[ident] += payload
        elif kind == b"C":
            seen[ident].append(json.loads(payload))
        if all(out.endswith(b"\n") for out in output.values()):
            break
    ready = {ident: [int(p) for p in out.split()[1:]] for ident, out in output.items()}
    assert seen[7][0]["pid"] == ready[7][0] and seen[9][0]["pid"] == ready[9][0]  # each pid to its own task
    send(agent, {"id": 9, "signal": int(signal.SIGKILL)})
    for kind, ident, payload in tagged_frames(agent):
        if kind == b"C":
            seen[ident].append(json.loads(payload))
            if seen[9][-1:] == [{"gone": -signal.SIGKILL}]:
                break
    assert gone([ready[9][0]]) and all(pid_alive(p) for p in ready[7])  # task 9's group only
    assert seen[7][-1:] != [{"gone": -signal.SIGKILL}]
    assert agent.stdin is not None
    agent.stdin.close()
    assert gone(ready[7] + ready[9][1:])  # the launcher gone: every group left is fenced
    assert agent.wait(15) == 0


def test_a_signal_for_a_task_not_started_yet_reaches_it_once_it_is() -> None:
    from launcher.engines.ssh.node import agent_tasks

    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        session = agent_tasks.Session(agent_tasks.Frames(write_end), {})
        session._signal(3, int(signal.SIGTERM))  # the teardown came before the task's start was known
        assert proc.poll() is None
        session._started(3, proc.pid)
        assert proc.wait(10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
        os.close(read_end)
        os.close(write_end)


def test_a_synced_symlink_out_of_the_directory_is_one_line_before_any_host(tmp_path: Path) -> None:
    """The hosts' unpack (tarfile's "data" filter) refuses such a link host by host, in a line that blamed the
    workdir and the disk; the launch says which link, before it reaches any host. A link inside stays a link."""
    from launcher.engines.ssh.wire import archives
    from launcher.errors import UsageError

    src = tmp_path / "proj"
    (src / "data").mkdir(parents=True)
    (src / "train.py").write_text("")
    (src / "data" / "latest.py").symlink_to("../train.py")  # inside: shipped as it is
    assert len(archives([(str(src), "/remote/code")])) == 1
    for name, target in (("etc", "/etc"), ("up", "../../outside.txt")):
        (src / "data" / name).symlink_to(target)
        with pytest.raises(UsageError) as info:
            archives([(str(src), "/remote/code")])
        assert str(info.value) == (f"--sync {src}: data/{name} is a symlink to {target}, outside the directory, which the hosts "
                                   "refuse to unpack; remove it, or point it inside the directory with a relative path")
        (src / "data" / name).unlink()


def test_a_synced_named_pipe_is_one_line_naming_it_not_the_hosts_unpack_blaming_the_workdir(tmp_path: Path) -> None:
    """A FIFO in DIR (a job's control pipe, a socket-like leftover) went into the tarball, and every host's
    unpack refused it: `could not unpack the code there (SpecialFileError …); check hosts.<h>.workdir and free disk`."""
    from launcher.engines.ssh.wire import archives
    from launcher.errors import UsageError

    src = tmp_path / "proj"
    (src / "run").mkdir(parents=True)
    (src / "train.py").write_text("")
    os.mkfifo(src / "run" / "control")
    with pytest.raises(UsageError) as info:
        archives([(str(src), "/remote/code")])
    assert str(info.value) == (f"--sync {src}: run/control is a named pipe (FIFO), which the hosts refuse to unpack; "
                               "remove it from the directory, or move it out")
    (src / "run" / "control").unlink()
    assert len(archives([(str(src), "/remote/code")])) == 1
