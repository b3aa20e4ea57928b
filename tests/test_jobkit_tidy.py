"""A task that leaves with `os._exit` (the kit's way: finish.py, notice.py) still removes
autograph's generated modules from its temp dir, which autograph's own `atexit` handler
would have removed; and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.contract import PREEMPTED_EXIT_CODE, TEARDOWN_SIGNAL


def task_env(tmp: Path) -> dict[str, str]:
    """TMPDIR private, and bytecode written (as by default: this team sets PYTHONDONTWRITEBYTECODE)."""
    return {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "TMPDIR": str(tmp)}


# A generated module as autograph loads one (loader.load_source), one with the prefix elsewhere,
# and one in the temp dir under another name; then the kit's exit.
TASK = """
import importlib.util, sys, tempfile
def load(path):
    name = path.rsplit("/", 1)[-1][:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); sys.modules[name] = module
with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="__autograph_generated_file", delete=False) as f:
    f.write("x = 1\\n")
load(f.name)
load(sys.argv[2])
load(sys.argv[3])
from launcher.jobkit import finish, notice
finish._leave() if sys.argv[1] == "finish" else notice.leave_now(int(sys.argv[1]))
"""


@pytest.mark.parametrize("how", ["finish", str(PREEMPTED_EXIT_CODE)])
def test_the_kits_exit_removes_autographs_files_and_only_those(tmp_path: Path, how: str) -> None:
    tmp = tmp_path / "tmp"
    elsewhere = tmp_path / "elsewhere"
    tmp.mkdir(mode=0o700)
    elsewhere.mkdir()
    not_in_tmp = elsewhere / "__autograph_generated_fileabc.py"
    other_name = tmp / "mine.py"
    for path in (not_in_tmp, other_name):
        path.write_text("y = 2\n")
    done = subprocess.run([sys.executable, "-c", TASK, how, str(not_in_tmp), str(other_name)], capture_output=True,
                          text=True, timeout=120, env=task_env(tmp))
    assert done.returncode == (0 if how == "finish" else PREEMPTED_EXIT_CODE), done.stderr
    left = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
    assert left == ["__pycache__", f"__pycache__/mine.{sys.implementation.cache_tag}.pyc", "mine.py"]  # only ours gone
    assert not_in_tmp.exists()


# A task blocked in a C call (as in a collective) that a signal ends as its default action would.
BLOCKED = """
import importlib.util, os, sys, tempfile
from launcher.jobkit import notice
from launcher.jobkit.context import TaskContext
with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="__autograph_generated_file", delete=False) as f:
    f.write("x = 1\\n")
name = f.name.rsplit("/", 1)[-1][:-3]
spec = importlib.util.spec_from_file_location(name, f.name)
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module); sys.modules[name] = module
context = TaskContext(task_type=sys.argv[1], task_index=0, cluster={"chief": ["a:1"], "worker": ["b:1"]})
notice.exit_on_notice(context, "before training began")
print("ready", flush=True)
os.read(os.pipe()[0], 1)
"""


@pytest.mark.parametrize(("kind", "signum"), [("chief", signal.Signals[TEARDOWN_SIGNAL]), ("evaluator", signal.SIGTERM),
                                              ("evaluator", signal.Signals[TEARDOWN_SIGNAL])])
def test_a_task_ended_by_a_signal_removes_them_too(tmp_path: Path, kind: str, signum: signal.Signals) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    task = subprocess.Popen([sys.executable, "-c", BLOCKED, kind], stdout=subprocess.PIPE, text=True,
                            env=task_env(tmp))
    try:
        assert task.stdout is not None and task.stdout.readline().strip() == "ready"
        assert len(list(tmp.glob("__pycache__/__autograph_generated_file*.pyc"))) == 1
        task.send_signal(signum)
        task.communicate(timeout=60)
    finally:
        if task.poll() is None:
            task.kill()
            task.communicate()
    assert task.returncode == -signum  # still ended by the signal itself
    assert not list(tmp.iterdir())


def test_a_task_that_ends_the_normal_way_leaves_no_bytecode_either(tmp_path: Path) -> None:
    """autograph's own atexit handler removes the source only."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    normal = BLOCKED.replace("os.read(os.pipe()[0], 1)", "import atexit, os\natexit.register(os.remove, f.name)  # autograph's")
    done = subprocess.run([sys.executable, "-c", normal, "evaluator"], capture_output=True, text=True, timeout=120,
                          env=task_env(tmp))
    assert done.returncode == 0, done.stderr
    assert not list(tmp.iterdir())


def test_the_teardown_ends_a_task_whose_wakeup_fd_was_taken_over(tmp_path: Path) -> None:
    """An asyncio loop (or anything else) may set its own wakeup fd: the notice thread then never hears
    of a signal, and the main thread's handler must end the task itself, not swallow the teardown."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o700)
    taken = BLOCKED.replace('print("ready", flush=True)', 'import signal\nsignal.set_wakeup_fd(-1)\nprint("ready", flush=True)')
    taken = taken.replace("os.read(os.pipe()[0], 1)", "import time\nwhile True:\n    time.sleep(0.05)")
    task = subprocess.Popen([sys.executable, "-c", taken, "chief"], stdout=subprocess.PIPE, text=True, env=task_env(tmp))
    try:
        assert task.stdout is not None and task.stdout.readline().strip() == "ready"
        task.send_signal(signal.Signals[TEARDOWN_SIGNAL])
        task.communicate(timeout=60)
    finally:
        if task.poll() is None:
            task.kill()
            task.communicate()
    assert task.returncode == -signal.Signals[TEARDOWN_SIGNAL]
    assert not list(tmp.iterdir())
