"""`tfl tensorboard`: a real TensorBoard on a free loopback port answers, serves the run's
curves, and is gone when the command ends (Ctrl-C, or the command killed)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.describe.ports import free_port
from launcher.records.states import RunState
from launcher.records.store import RunRecord, RunStore, TaskRecord
from launcher.views.tensorboard import NO_TF_MAIN, model_dir_of
from tests.conftest import ROOT
from tests.procs import pid_alive

runner = CliRunner()
# One scalar in an event file, written by TensorBoard's own writer without TensorFlow.
WRITE_EVENTS = NO_TF_MAIN.split("from tensorboard.main")[0] + """
import time
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
writer = EventFileWriter(sys.argv[1])
writer.add_event(Event(wall_time=time.time(), step=1, summary=Summary(value=[Summary.Value(tag="epoch_loss", simple_value=0.5)])))
writer.close()
"""


def task(name: str, env: dict[str, str], ssh: dict[str, Any] | None = None, cwd: str = "/work") -> dict[str, Any]:
    return {"task": name, "host": ssh["host"] if ssh else "localhost", "port": 1, "argv": ["/opt/py", "job.py"], "env": env,
            "cwd": cwd, "log_path": "l", "progress_path": "p", "ssh": ssh, "sync": []}


def add_run(store: RunStore, run_id: str, tasks: list[dict[str, Any]], job_args: list[str] | None = None) -> RunRecord:
    run_dir = store.run_dir(run_id)
    record = RunRecord(run_id=run_id, job="job.py", job_args=job_args or [], run_dir=str(run_dir), created=time.time(),
                       state=RunState.SUCCEEDED, ended=time.time(),
                       tasks=[TaskRecord(task="chief:0", host="localhost", backend="local", log_path="l", progress_path="p")],
                       plan={"run_id": run_id, "run_dir": str(run_dir), "job": "job.py", "job_args": [], "tasks": tasks})
    store.create(record)
    return record


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.status, answer.read()


def test_model_dir_rules(tfl_home: Path) -> None:
    store = RunStore(tfl_home)
    here = add_run(store, "here", [task("chief:0", {"TFL_RUN_DIR": "/runs/here"}), task("worker:0", {"TFL_RUN_DIR": "/x"})])
    assert model_dir_of(here).path == "/runs/here/model" and model_dir_of(here).host is None
    shared = add_run(store, "shared", [task("worker:0", {"TFL_RUN_DIR": "/r", "TFL_MODEL_DIR": "/nfs/models/shared"})])
    assert model_dir_of(shared).path == "/nfs/models/shared"
    given = add_run(store, "given", [task("chief:0", {"TFL_RUN_DIR": "/r"}, cwd="/work")], job_args=["--model-dir", "out/m"])
    assert model_dir_of(given).path == "/work/out/m"
    remote = model_dir_of(add_run(store, "remote", [task("chief:0", {"TFL_RUN_DIR": "/srv/w/tfl-runs/remote"},
                                                         ssh={"host": "gpu1", "port": 2222, "user": "train"})]))
    assert (remote.path, remote.host, remote.python) == ("/srv/w/tfl-runs/remote/model", "gpu1", "/opt/py")


def test_a_model_dir_on_another_host_says_how_to_reach_it(tfl_home: Path) -> None:
    add_run(RunStore(tfl_home), "remote", [task("chief:0", {"TFL_RUN_DIR": "/srv/w/tfl-runs/remote"},
                                                ssh={"host": "gpu1", "port": 2222, "user": "train", "identity_file": "/k"})])
    result = runner.invoke(app, ["tensorboard", "remote", "--port", "6010"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[1] == ("  ssh -t -p 2222 -i /k -L 6010:127.0.0.1:6010 train@gpu1 'd=$(mktemp -d "
                                             '"${TMPDIR:-/tmp}/tensorboard-tmp-XXXXXXXX") && trap "rm -rf -- \\"\\$d\\"" EXIT && '
                                             'trap "exit 129" HUP INT TERM && TMPDIR=$d /opt/py -m tensorboard.main '
                                             "--logdir /srv/w/tfl-runs/remote/model --port 6010 --host 127.0.0.1'")


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_the_remote_tensorboard_gets_a_private_temp_dir_that_goes_with_it(tfl_home: Path, tmp_path: Path,
                                                                          shell: str) -> None:
    """The hint's remote command, run by a POSIX login shell as sshd would: TensorBoard there must not write its
    pid and port into the fixed, shared /tmp/.tensorboard-info either. A stand-in python says what it was given."""
    seen = tmp_path / "seen"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nprintf "%s %s\\n" "$TMPDIR" "$(stat -c %a "$TMPDIR")" > {seen}\n')
    python.chmod(0o700)
    chief = task("chief:0", {"TFL_RUN_DIR": "/srv/w/tfl-runs/remote"}, ssh={"host": "gpu1", "port": 22})
    add_run(RunStore(tfl_home), "remote", [{**chief, "argv": [str(python), "job.py"]}])
    result = runner.invoke(app, ["tensorboard", "remote"])
    assert result.exit_code == 0, result.output
    remote = shlex.split(result.stdout.splitlines()[1])[-1]  # what ssh hands the host's login shell
    base = tmp_path / "host-tmp"  # the host's own TMPDIR
    base.mkdir()
    done = subprocess.run([shell, "-c", remote], env={**os.environ, "TMPDIR": str(base)}, timeout=30)
    assert done.returncode == 0
    tmpdir, mode = seen.read_text().split()
    assert Path(tmpdir).parent == base and Path(tmpdir).name.startswith("tensorboard-tmp-") and mode == "700"
    assert list(base.iterdir()) == []  # removed when TensorBoard ended


def test_a_busy_port_is_one_line(tfl_home: Path) -> None:
    add_run(RunStore(tfl_home), "here", [task("chief:0", {"TFL_RUN_DIR": str(tfl_home / "runs" / "here")})])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["tensorboard", "--port", str(port)])
    assert result.exit_code == 2 and result.stderr == f"tfl: error: --port {port}: 127.0.0.1:{port} is in use; give another port or leave --port out\n"


@pytest.mark.parametrize("port", ["0", "-5", "70000"])
def test_a_port_out_of_range_is_refused_before_anything_starts(tfl_home: Path, port: str) -> None:
    """--port 0 used to wait 120 s for TensorBoard on port 0 (it listened elsewhere), and a port
    past 65535 or below 0 ended in bind()'s OverflowError traceback."""
    add_run(RunStore(tfl_home), "here", [task("chief:0", {"TFL_RUN_DIR": str(tfl_home / "runs" / "here")})])
    start = time.monotonic()
    result = runner.invoke(app, ["tensorboard", "--port", port])
    assert result.exit_code == 2 and "Invalid value for '--port'" in result.stderr, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("end", ["ctrl-c", "kill -9"])
def test_real_tensorboard_serves_the_run_and_goes_with_the_command(tfl_home: Path, child_env: dict[str, str], end: str) -> None:
    run_dir = tfl_home / "runs" / "r-1"
    add_run(RunStore(tfl_home), "r-1", [task("chief:0", {"TFL_RUN_DIR": str(run_dir)})])
    subprocess.run([sys.executable, "-c", WRITE_EVENTS, str(run_dir / "model" / "tensorboard" / "train")], check=True, timeout=120)
    port = free_port()
    tfl = subprocess.Popen([sys.executable, "-m", "launcher", "tensorboard", "--port", str(port)], env=child_env, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = tfl.stdout.readline()  # type: ignore[union-attr]
        if first != f"TensorBoard for run r-1: http://127.0.0.1:{port}/\n":
            tfl.kill()
            pytest.fail(f"{first}{tfl.stderr.read()}")  # type: ignore[union-attr]
        (board,) = psutil.Process(tfl.pid).children()
        assert get(f"http://127.0.0.1:{port}/")[0] == 200
        tags = _wait_for_tags(port)
        assert tags == {"tensorboard/train": ["epoch_loss"]}
        tfl.send_signal(signal.SIGINT if end == "ctrl-c" else signal.SIGKILL)
        code = tfl.wait(timeout=30)
        assert code == (0 if end == "ctrl-c" else -signal.SIGKILL)
        deadline = time.monotonic() + 15
        while pid_alive(board.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(board.pid), "TensorBoard outlived tfl tensorboard"
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0
    finally:
        tfl.kill()
        tfl.wait()


def _wait_for_tags(port: int, timeout: float = 60.0) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    while True:
        tags = json.loads(get(f"http://127.0.0.1:{port}/data/plugin/scalars/tags")[1])
        if tags or time.monotonic() > deadline:
            return {run: sorted(t) for run, t in tags.items()}
        time.sleep(0.2)


def test_tensorboards_log_is_0600_whatever_the_umask(tfl_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tensorboard.log was opened with open(..., "ab"): 0644 under the usual umask 022, the one file
    of a run dir others could read (docs/commands.md: tfl's files in it are 0600, whatever the umask)."""
    run_dir = tfl_home / "runs" / "here"
    add_run(RunStore(tfl_home), "here", [task("chief:0", {"TFL_RUN_DIR": str(run_dir)})])
    monkeypatch.setattr(sys, "executable", "/bin/true")  # a TensorBoard that exits at once: the log is made all the same
    old = os.umask(0o022)
    try:
        result = runner.invoke(app, ["tensorboard", "here", "--port", str(free_port())])
    finally:
        os.umask(old)
    assert result.exit_code != 0 and "TensorBoard exited with code 0 before it served" in result.stderr, result.output
    assert stat.S_IMODE((run_dir / "tensorboard.log").stat().st_mode) == 0o600


# A stand-in for TensorBoard: listens on its --port for a moment, then exits (serve reports that exit).
LISTEN_A_MOMENT = ("import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[sys.argv.index('--port') + 1]))); "
                   "s.listen(); time.sleep(1.5)")


@pytest.mark.parametrize("events", [False, True])
def test_a_run_with_no_event_files_yet_says_so(tfl_home: Path, monkeypatch: pytest.MonkeyPatch, events: bool) -> None:
    """A run with no event files (not trained yet, a job that writes none) got an empty TensorBoard
    and no word why; it is said under the URL now, and only then."""
    run_dir = tfl_home / "runs" / "here"
    add_run(RunStore(tfl_home), "here", [task("chief:0", {"TFL_RUN_DIR": str(run_dir)})])
    if events:
        subprocess.run([sys.executable, "-c", WRITE_EVENTS, str(run_dir / "model" / "tensorboard" / "train")], check=True,
                       timeout=120)
    monkeypatch.setattr("launcher.views.tensorboard.NO_TF_MAIN", LISTEN_A_MOMENT)
    result = runner.invoke(app, ["tensorboard", "here", "--port", str(free_port())])
    assert "TensorBoard exited with code 0" in result.stderr, result.output
    note = f"  no event files under {run_dir / 'model'} yet: TensorBoard shows them as the job writes them"
    assert (note in result.stdout.splitlines()) is not events, result.stdout


def test_tensorboards_temp_files_stay_in_a_private_dir_that_goes_with_it(tfl_home: Path, child_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    """TensorBoard wrote its pid, port and logdir into $TMPDIR/.tensorboard-info (/tmp/...), a fixed dir
    it makes 0777 without the sticky bit: any user could swap its files or, made first, make it fail."""
    run_dir = tfl_home / "runs" / "r-1"
    add_run(RunStore(tfl_home), "r-1", [task("chief:0", {"TFL_RUN_DIR": str(run_dir)})])
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    port = free_port()
    tfl = subprocess.Popen([sys.executable, "-m", "launcher", "tensorboard", "--port", str(port)],
                           env={**child_env, "TMPDIR": str(shared_tmp)}, cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        first = tfl.stdout.readline()  # type: ignore[union-attr]
        assert first == f"TensorBoard for run r-1: http://127.0.0.1:{port}/\n", first + tfl.stderr.read()  # type: ignore[union-attr]
        (board,) = psutil.Process(tfl.pid).children()
        private = Path(board.environ()["TMPDIR"])
        assert private.parent == run_dir and stat.S_IMODE(private.stat().st_mode) == 0o700
        info = private / ".tensorboard-info" / f"pid-{board.pid}.info"
        deadline = time.monotonic() + 60  # a hang guard: TensorBoard writes it as it starts serving
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert info.exists() and json.loads(info.read_text())["port"] == port
        assert list(shared_tmp.iterdir()) == []
        tfl.send_signal(signal.SIGINT)
        assert tfl.wait(timeout=30) == 0
        board.wait(timeout=15)
        assert not private.exists() and list(shared_tmp.iterdir()) == []
    finally:
        tfl.kill()
        tfl.wait()


# A stand-in for TensorBoard that finds its --port taken: it fails to bind and exits 1, as TensorBoard does.
PORT_TAKEN = "import socket, sys; socket.socket().bind(('127.0.0.1', int(sys.argv[sys.argv.index('--port') + 1])))"


def test_a_port_taken_between_its_pick_and_tensorboards_bind_is_not_said_as_served(tfl_home: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The port is picked free, then another program takes it before TensorBoard binds it (a second
    `tfl tensorboard` picks 6006 in the seconds before the first one's TensorBoard listens). That program
    answered the readiness check: its URL was said as this run's TensorBoard, then TensorBoard's exit."""
    run_dir = tfl_home / "runs" / "here"
    add_run(RunStore(tfl_home), "here", [task("chief:0", {"TFL_RUN_DIR": str(run_dir)})])
    monkeypatch.setattr("launcher.views.tensorboard.NO_TF_MAIN", PORT_TAKEN)
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        monkeypatch.setattr("launcher.views.tensorboard.free_port", lambda wanted: port)  # free when it was looked at
        result = runner.invoke(app, ["tensorboard", "here"])
    assert "http://" not in result.stdout, result.output
    assert result.stderr.startswith("tfl: error: TensorBoard exited with code 1 before it served: "), result.output
    assert "Address already in use" in result.stderr


def test_where_proc_does_not_tell_who_listens_an_answer_on_the_port_is_taken(tfl_home: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandbox whose /proc hides the sockets: readiness falls back to whatever answers on the port."""
    run_dir = tfl_home / "runs" / "here"
    add_run(RunStore(tfl_home), "here", [task("chief:0", {"TFL_RUN_DIR": str(run_dir)})])
    monkeypatch.setattr("launcher.views.tensorboard.NO_TF_MAIN", LISTEN_A_MOMENT)

    def hidden(self: psutil.Process, kind: str = "inet") -> list[Any]:
        raise psutil.AccessDenied(self.pid)

    monkeypatch.setattr(psutil.Process, "net_connections", hidden)
    port = free_port()
    result = runner.invoke(app, ["tensorboard", "here", "--port", str(port)])
    assert result.stdout.startswith(f"TensorBoard for run here: http://127.0.0.1:{port}/\n"), result.output
    assert "TensorBoard exited with code 0" in result.stderr  # the stand-in's own end, after it served
