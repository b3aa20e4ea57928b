"""`tfl status RUN` at scale (issue 29 item 5): a summary for a large run, every task with --all,
a bounded wait for hosts asked (a silent one is named, status returns anyway), and a large
run whose launcher is alive answered from what the launcher knows, no host asked."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from launcher.engines.base import NO_ANSWER
from launcher.engines.ssh import recorded
from launcher.records.store import RunStore
from launcher.views.report import SHOW_ALL_UP_TO, run_detail
from launcher.views.status import RunView, TaskView, run_view
from tests.sshd import Sshd
from tests.test_ssh import start_sleepers


def task(i: int, state: str = "running", step: int | None = None, exit_code: int | None = None) -> TaskView:
    progress = None if step is None else {"epoch": 1, "epochs": 1, "step": step, "steps_per_epoch": 100, "global_step": step}
    return TaskView(task=f"worker:{i}", host=f"198.18.0.{i + 2}", state=state, attempt=0, pid=1000 + i,
                    alive=state == "running", cpu_percent=None, rss_mb=None, uptime_s=60, exit_code=exit_code,
                    progress=progress)


def run_of(tasks: list[TaskView], silent: list[str] | None = None) -> RunView:
    return RunView(run_id="r9", job="/x/job.py", state="running", alive=sum(t.alive for t in tasks), total=len(tasks),
                   started=0.0, duration_s=10, restarts=0, restart_reasons=[], message=None, tasks=tasks,
                   silent_hosts=silent or [])


def test_a_large_run_shows_counts_the_tasks_in_trouble_and_the_slowest_and_all_of_them_with_every() -> None:
    tasks = [task(i, step=50 + i) for i in range(40)]
    tasks[7] = task(7, state="failed", exit_code=3)
    tasks[12] = task(12, state=NO_ANSWER)
    tasks[30] = task(30, step=2)  # the slowest
    text = run_detail(run_of(tasks, silent=[tasks[12].host]))
    assert "tasks: 38 running, 1 failed, 1 no answer" in text
    assert "1 host(s) did not answer in time: 198.18.0.14" in text
    trouble = text.split("failed or not answering (2):")[1].split("slowest")[0]
    assert "worker:7 " in trouble and "worker:12 " in trouble and "worker:8 " not in trouble
    slowest = text.split("slowest (5 of 38 with progress):")[1].splitlines()
    assert slowest[2].split()[0] == "worker:30" and slowest[3].split()[0] == "worker:0"  # step 2, then step 50
    assert "`tfl status r9 --all` shows all 40 tasks" in text
    assert sum(line.startswith("worker:") for line in text.splitlines()) == 2 + 5
    every = run_detail(run_of(tasks), every=True)
    assert sum(line.startswith("worker:") for line in every.splitlines()) == 40 and "--all` shows" not in every


def test_a_small_run_shows_every_task_as_before() -> None:
    tasks = [task(i) for i in range(SHOW_ALL_UP_TO)]
    text = run_detail(run_of(tasks))
    assert sum(line.startswith("worker:") for line in text.splitlines()) == SHOW_ALL_UP_TO and "tasks:" not in text


def test_asking_hosts_waits_a_bounded_time_and_leaves_out_those_that_did_not_answer() -> None:
    never = threading.Event()

    def ask(host: str) -> dict[str, str]:
        if host == "silent":
            never.wait(60)
        if host == "broken":
            raise OSError("refused")
        return {"host": host}

    started = time.monotonic()
    answers = recorded.ask_within(ask, ["a", "silent", "broken", "b"], wait=0.5, workers=2)
    took = time.monotonic() - started
    never.set()
    assert set(answers) == {"a", "broken", "b"} and answers["a"] == {"host": "a"}
    assert isinstance(answers["broken"], OSError)
    assert 0.5 <= took < 5  # the wait, not the silent host's 60 s (a hang guard above it)


@pytest.fixture
def silent_port() -> Iterator[tuple[str, int]]:
    """A port on 127.0.0.3 whose connections are taken (the kernel's backlog) and never answered:
    what a host whose sshd hangs looks like."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.3", 0))
        sock.listen(64)
        yield "127.0.0.3", sock.getsockname()[1]


def test_a_host_that_does_not_answer_is_named_and_status_returns_promptly(
        sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str], silent_port: tuple[str, int]) -> None:
    launcher, run = start_sleepers(sshd, tmp_path, tfl_home, child_env)
    try:
        record = RunStore(tfl_home).load(run)
        for launch in record.plan["tasks"]:  # the worker's host now hangs after the TCP handshake
            if launch["host"] == silent_port[0]:  # and would keep the asker waiting 60 s for its banner
                launch["ssh"].update(port=silent_port[1], connect_timeout=60)
        started = time.monotonic()
        view = run_view(record, measure=True)
        took = time.monotonic() - started
        states = {t.task: t.state for t in view.tasks}
        assert states == {"chief:0": "running", "worker:0": NO_ANSWER} and view.silent_hosts == ["127.0.0.3"]
        assert view.tasks[0].rss_mb and not view.tasks[1].rss_mb  # the chief's host answered, the worker's did not
        assert [t.alive for t in view.tasks] == [True, True]  # as its live launcher knows
        assert recorded.STATUS_WAIT <= took < recorded.STATUS_WAIT + 20  # the wait (+ fabric's import), not the host's 60 s
        assert "1 host(s) did not answer in time: 127.0.0.3" in run_detail(view)
    finally:
        launcher.terminate()
        launcher.wait(30)


def test_a_large_run_whose_launcher_is_alive_is_answered_from_its_record_without_asking_a_host(
        sshd: Sshd, tmp_path: Path, tfl_home: Path, child_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    launcher, run = start_sleepers(sshd, tmp_path, tfl_home, child_env)
    try:
        monkeypatch.setattr(recorded, "ASK_UP_TO", 1)  # two hosts count as many
        accepted = sshd.log().count("Accepted publickey")
        view = run_view(RunStore(tfl_home).load(run), measure=True)
        assert [(t.state, t.alive, t.rss_mb) for t in view.tasks] == [("running", True, None)] * 2
        assert view.from_launcher and all(t.uptime_s is not None for t in view.tasks)
        assert sshd.log().count("Accepted publickey") == accepted  # no host asked
        assert f"its launcher (pid {launcher.pid}) knows them" in run_detail(view)
        launcher.terminate()
        launcher.wait(30)
        after = run_view(RunStore(tfl_home).load(run), measure=True)  # ended: no task shown running
        assert after.alive == 0 and not after.from_launcher and all(t.state != "running" for t in after.tasks)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(30)
