"""What starting a tfl command costs: the modules it must not import, and the cheaper ways
(launcher.cli.coercion, ProcessIdentity.alive, the record loader) giving the same answers as
the costly ones they replace (docs/benchmarks.md §10, §18)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param
from typer.core import _TyperParameter
from typer.main import get_command

from launcher.cli import app
from launcher.cli.coercion import PlainParam
from launcher.describe.spec import parse_cluster
from launcher.plan.build import build_plan
from launcher.records.identity import ProcessIdentity
from launcher.records.states import RunState, TaskState
from launcher.records.store import RunStore
from launcher.supervise.recording import initial_record
from tests.conftest import ROOT

RAW = ["0", "-0", "7", "-3", "007", "1.5", "-2.25", "0.05", "1.", ".5", "1e3", "inf", "abc", "", " 5", "5 ", "+5", "٣",
       3, -1, 2.5, True, "/tmp", "rel/dir", "-", "/no/such/file", b"bytes", ["/tmp", "x"], ("a", "b"), []]


def _outcome(runtime: Any, raw: object, param: Any, ctx: Context) -> tuple[str, Any]:
    try:
        value = runtime.coerce(raw, param=param, ctx=ctx)
    except BadParameter as exc:
        return "error", exc.format_message()
    return type(value).__name__, value


def test_plain_values_coerce_as_typers_own_adapters() -> None:
    """Every parameter of every command that gets the plain coercion: for each raw value, the same
    value (and type) or the same error as the pydantic adapter typer builds for it."""
    group: Any = get_command(app)
    commands = [*group.commands.values(), *group.commands["export"].commands.values()]
    checked = 0
    for command in commands:
        ctx = Context(command)
        for param in command.params:
            if not isinstance(param, _TyperParameter) or not isinstance(param._runtime_param, PlainParam):
                continue
            plain = param._runtime_param
            for raw in RAW:
                typers = build_runtime_param(param.type_descriptor)  # a fresh one each time: plain caches its fallback
                expected = _outcome(typers, raw, param, ctx)
                got = _outcome(plain, raw, param, ctx)
                param._runtime_param = plain
                assert got == expected, (command.name, param.name, raw)
                checked += 1
    names = {(c.name, p.name) for c in commands for p in c.params if isinstance(getattr(p, "_runtime_param", None), PlainParam)}
    assert {("launch", "job"), ("launch", "cluster"), ("launch", "max_restarts"), ("launch", "grace_period"), ("launch", "sync"),
            ("_supervise", "plan_file"), ("_supervise", "config_json"), ("rm", "runs")} <= names
    assert checked >= 30 * len(RAW)


def _modules_after(code: str, home: Path) -> dict[str, Any]:
    """Run ``code`` (CliRunner invocations into ``results``) in a fresh python; its results and the heavy modules it loaded."""
    script = ("import json, sys; from typer.testing import CliRunner; from launcher.cli import app; runner = CliRunner(); "
              f"{code}; heavy = ('typer._adapters', 'pydantic', 'psutil', 'fabric', 'paramiko', 'tensorflow'); "
              "print(json.dumps({'loaded': [m for m in heavy if m in sys.modules], "
              "'results': [[r.exit_code, r.stdout, r.stderr, type(r.exception).__name__] for r in results]}))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "TFL_HOME": str(home)}, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    found: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
    return found


def test_launch_parses_its_options_without_a_type_adapter(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("print('hi')\n")
    (tmp_path / "sync").mkdir()
    args = ["launch", "--local", "3", "--virtual-devices", "3", "--max-restarts", "3", "--grace-period", "2.5", "--stall-timeout", "9",
            "--sync", str(tmp_path / "sync"), "--network", "host", "--dry-run", str(tmp_path / "job.py")]
    found = _modules_after(f"results = [runner.invoke(app, {args!r})]", tmp_path / "home")
    (code, stdout, stderr, _), = found["results"]
    assert code == 0, stderr
    assert "chief:0" in stdout and "worker:1" in stdout and "TFL_VIRTUAL_DEVICES=3" in stdout and "network: host" in stdout
    assert "typer._adapters" not in found["loaded"]  # the cluster's own models load pydantic; typer's parse does not


def test_background_launcher_parses_without_pydantic(tmp_path: Path) -> None:
    """``tfl _supervise PLAN CONFIG`` (the detached launcher's body) reaches its core call without
    pydantic: here the plan file is missing, so the core's read of it fails, after the parse."""
    found = _modules_after(f"results = [runner.invoke(app, ['_supervise', {str(tmp_path / 'none.json')!r}, '{{}}'])]",
                           tmp_path / "home")
    (code, _, _, exception), = found["results"]
    assert code == 1 and exception == "FileNotFoundError"
    assert "pydantic" not in found["loaded"] and "typer._adapters" not in found["loaded"]


@pytest.fixture
def running_ssh_run(tmp_path: Path) -> Any:
    """A recorded SSH run of 12 hosts (more than `tfl status RUN` asks while the launcher lives) whose
    launcher is a live `sleep`. The hosts are loopback addresses with ssh on port 1, where nothing
    listens: a command that asked them by mistake would be refused at once, never reach a host."""
    home = tmp_path / "home"
    hosts = [f"127.0.1.{i + 1}" for i in range(12)]
    spec = parse_cluster({"cluster": {"chief": [f"{hosts[0]}:2222"], "worker": [f"{h}:2222" for h in hosts[1:]]},
                          "hosts": {h: {"ssh": {"user": "u", "port": 1}} for h in hosts}})
    store = RunStore(home)
    plan = build_plan(spec, "/w/job.py", (), run_id="r-ssh", run_dir=str(store.run_dir("r-ssh")), python="python3", cwd="/w")
    record = initial_record(plan, time.time(), 0, "ssh")
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        ident = ProcessIdentity.of(sleeper.pid)
        record.state = RunState.RUNNING
        record.launcher_pid, record.launcher_create_time, record.launcher_start_ticks = ident.pid, ident.create_time, ident.start_ticks
        record.launcher_boot_id, record.launcher_host = ident.boot_id, ident.host
        for task in record.tasks:
            task.state, task.pid, task.create_time = TaskState.RUNNING, 4_000_000, time.time()
        store.create(record)
        yield home, sleeper
    finally:
        sleeper.kill()
        sleeper.wait()
        assert not psutil.pid_exists(sleeper.pid) or psutil.Process(sleeper.pid).status() == psutil.STATUS_ZOMBIE


def test_status_of_a_large_ssh_run_imports_neither_psutil_nor_fabric(running_ssh_run: Any) -> None:
    home, sleeper = running_ssh_run
    code = "results = [runner.invoke(app, ['status', 'r-ssh']), runner.invoke(app, ['status'])]"
    found = _modules_after(code, home)
    (one, _, err, _), (listed, table, _, _) = found["results"]
    assert one == 0 and listed == 0, err
    detail = found["results"][0][1]
    assert "running" in detail.splitlines()[0] and "12/12 tasks alive" in detail
    assert f"as its launcher (pid {sleeper.pid}) knows them" in detail
    assert "r-ssh" in table and "running" in table
    assert found["loaded"] == [], found["loaded"]

    sleeper.kill()
    sleeper.wait()
    # The list (`tfl status RUN` would now ask the hosts): the launcher is gone, /proc says so, no psutil.
    found = _modules_after("results = [runner.invoke(app, ['status'])]", home)
    (listed, table, _, _), = found["results"]
    assert listed == 0 and "lost" in next(line for line in table.splitlines() if "r-ssh" in line)
    assert found["loaded"] == [], found["loaded"]


def test_alive_agrees_with_find() -> None:
    """``alive`` (from /proc) and ``find`` (psutil) on a running child, a zombie, a pid whose start
    differs, one recorded without start ticks, and another machine's."""
    running = subprocess.Popen(["sleep", "600"])
    zombie = subprocess.Popen(["true"])
    try:
        while psutil.Process(zombie.pid).status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.01)
        live, dead = ProcessIdentity.of(running.pid), ProcessIdentity(zombie.pid, None, ProcessIdentity.of(zombie.pid).start_ticks)
        cases = {
            "running": (live, True),
            "zombie": (dead, False),
            "other start": (ProcessIdentity(running.pid, live.create_time, (live.start_ticks or 0) + 1), False),
            "create time only": (ProcessIdentity(running.pid, live.create_time), True),
            "other host": (ProcessIdentity(running.pid, live.create_time, live.start_ticks, live.boot_id, "elsewhere.invalid"), False),
            "no pid": (ProcessIdentity(None, None, None), False),
            "gone": (ProcessIdentity(2**22 + 1, 1.0, 12345), False),  # above pid_max's default: no such process
        }
        for name, (ident, expected) in cases.items():
            assert ident.alive() is expected and (ident.find() is not None) is expected, name
    finally:
        for proc in (running, zombie):
            proc.kill()
            proc.wait()
    assert not psutil.pid_exists(running.pid) and not psutil.pid_exists(zombie.pid)
