"""`tfl rm RUN` (and `tfl prune`) while `tfl tensorboard RUN` serves it removed the run dir under TensorBoard, whose
private temp dir and log are in it: the run is now kept, with the TensorBoard named, until it stops."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import psutil
from typer.testing import CliRunner

from launcher.cli import app
from launcher.describe.ports import free_port
from launcher.records.store import RunStore
from tests.conftest import ROOT
from tests.procs import pid_alive
from tests.test_tensorboard import add_run, task

runner = CliRunner()


def test_a_run_tensorboard_serves_is_kept_until_it_stops(tfl_home: Path, child_env: dict[str, str]) -> None:
    store = RunStore(tfl_home)
    run_dir = tfl_home / "runs" / "r-1"
    add_run(store, "r-1", [task("chief:0", {"TFL_RUN_DIR": str(run_dir)})])
    add_run(store, "r-2", [task("chief:0", {"TFL_RUN_DIR": str(tfl_home / "runs" / "r-2")})])
    port = free_port()
    tfl = subprocess.Popen([sys.executable, "-m", "launcher", "tensorboard", "r-1", "--port", str(port)], env=child_env,
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    board = None
    try:
        first = tfl.stdout.readline()  # type: ignore[union-attr]
        assert first == f"TensorBoard for run r-1: http://127.0.0.1:{port}/\n", first + tfl.stderr.read()  # type: ignore[union-attr]
        (board,) = psutil.Process(tfl.pid).children()
        why = (f"kept r-1: `tfl tensorboard r-1` serves its model dir (TensorBoard pid {board.pid}); stop it first "
               "(Ctrl-C in its terminal), then remove the run")
        kept = runner.invoke(app, ["rm", "r-1"])
        assert kept.exit_code == 1 and why in kept.stdout.splitlines(), kept.output
        pruned = runner.invoke(app, ["prune", "--keep", "0"])  # the other run goes; this one stays
        assert pruned.exit_code == 0 and why in pruned.stdout.splitlines(), pruned.output
        assert pruned.stdout.startswith("removed r-2") and not (tfl_home / "runs" / "r-2").exists()
        assert run_dir.is_dir() and board.is_running() and tfl.poll() is None
        tfl.send_signal(signal.SIGINT)
        assert tfl.wait(timeout=30) == 0
        board.wait(timeout=15)
        removed = runner.invoke(app, ["rm", "r-1"])
        assert removed.exit_code == 0 and removed.stdout.startswith("removed r-1"), removed.output
        assert not run_dir.exists()
    finally:
        tfl.kill()
        tfl.wait()
        if board is not None and pid_alive(board.pid):
            board.kill()
