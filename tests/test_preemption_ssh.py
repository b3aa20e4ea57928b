"""A preemption over SSH: SIGTERM to a remote task's agent (its sshd session going away).

Real sshd on loopback hosts, real agents. The agent passes the notice to its task, which
saves and exits PREEMPTED_EXIT_CODE (the tiny job of ``test_preemption_lifecycle`` behaves
as the job kit does); the agent reports that code, and the group restarts as a preemption,
not a failure, with --max-restarts 0.
"""

from __future__ import annotations

import re
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest

from launcher.describe.ports import free_port
from launcher.describe.spec import load_cluster
from launcher.plan.run_options import SupervisorConfig
from launcher.records.states import RunState
from launcher.records.store import RunStore
from launcher.runs import launch as core
from tests.procs import tfl_processes
from tests.sshd import Sshd, cluster_file
from tests.test_preemption_lifecycle import SAVER

pytestmark = pytest.mark.ssh


def sigterm_the_agent_of(run_dir: Path, task: str, sent: list[int]) -> None:
    """Once ``task`` has trained a few steps, SIGTERM its agent (not the task itself)."""
    log = run_dir / "logs" / f"{task.replace(':', '-')}.log"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and f"start {task} attempt 0" in log.read_text():
            time.sleep(0.5)
            (job,) = [p for p in tfl_processes(run_id=run_dir.name) if p.environ().get("TFL_TASK") == task]
            agent = job.parent()
            assert agent is not None and "tfl-agent" in " ".join(agent.cmdline())
            agent.send_signal(signal.SIGTERM)
            sent.append(agent.pid)
            return
        time.sleep(0.05)


def test_sigterm_to_a_remote_agent_is_a_preemption(sshd: Sshd, tmp_path: Path, tfl_home: Path) -> None:
    job = tmp_path / "src" / "saver.py"
    job.parent.mkdir()
    job.write_text(textwrap.dedent(SAVER))
    workdirs = {"127.0.0.2": tfl_home / "hosts" / "a", "127.0.0.3": tfl_home / "hosts" / "b"}
    for workdir in workdirs.values():
        workdir.mkdir(parents=True)
    tasks = {"chief": [f"127.0.0.2:{free_port()}"], "worker": [f"127.0.0.3:{free_port()}"]}
    store = RunStore(tfl_home)
    plan = core.make_plan(str(job), ("100",), load_cluster(cluster_file(tmp_path / "c.json", sshd, tasks, workdirs)), store)
    sent: list[int] = []
    signaller = threading.Thread(target=sigterm_the_agent_of, args=(Path(plan.run_dir), "worker:0", sent))
    signaller.start()
    try:
        record = core.execute(core.prepare(plan), store, SupervisorConfig(max_restarts=0, grace_period=5.0), None)
    finally:
        signaller.join()
    assert sent, "the worker never started"
    logs = {t: (Path(plan.run_dir) / "logs" / f"{t}.log").read_text() for t in ("chief-0", "worker-0")}
    assert record.state == RunState.SUCCEEDED, f"{record.message}; {logs}"
    assert [r.kind for r in record.restarts] == ["preemption"]
    assert re.search(r"worker:0 on 127\.0\.0\.3: preempted: saved the agreed checkpoint at step \d+", record.restarts[0].reason)
    resumed = re.search(r"start worker:0 attempt 1 step (\d+)", logs["worker-0"])
    assert resumed and int(resumed.group(1)) > 0 and "done worker:0 at step 100" in logs["worker-0"]
    assert tfl_processes(run_id=plan.run_id) == []
