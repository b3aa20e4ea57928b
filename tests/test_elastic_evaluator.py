"""Elastic runs: the evaluator moves to a surviving host the cluster file allows
(``elastic.evaluator_moves_to``) while its own host is lost, and back when it returns. The
planner here; on the bed (``tests.netbed``), a cut evaluator host's evaluator runs again on
the host it moved to.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.describe.ports import free_port
from launcher.describe.spec import parse_cluster
from launcher.errors import ClusterFileError
from launcher.plan.resize import elastic_options, resize_plan
from tests.netbed import NetBed
from tests.procs import tfl_processes
from tests.test_elastic import STORAGE, plan, tf_config
from tests.test_elastic_policy import make
from tests.test_ssh import only_run, wait_for, write_job

# The evaluator shares h2 with worker:1 (its port 1002 taken there by worker:1 too, on h1).
SHARED = {"chief": ["h0:1000"], "worker": ["h1:1002", "h2:1001"], "evaluator": ["h2:1002"]}


# --- the planner ---------------------------------------------------------------------------
def test_the_evaluator_moves_to_the_first_listed_surviving_host_on_a_port_no_task_uses_there() -> None:
    full = plan(SHARED, storage=STORAGE)
    resize = resize_plan(full, {"h2"}, ("h2", "h1", "h0"))
    assert [(t.name, t.host, t.port) for t in resize.plan.tasks] == [
        ("chief:0", "h0", 1000), ("worker:0", "h1", 1002), ("evaluator:0", "h1", 1003)]
    assert resize.dropped == ("worker:1",)
    cluster = {"chief": ["h0:1000"], "worker": ["h1:1002"]}
    assert tf_config(resize.plan, "evaluator:0") == {"cluster": {**cluster, "evaluator": ["h1:1003"]},
                                                     "task": {"type": "evaluator", "index": 0}}
    moved = resize.plan.tasks[2]
    assert moved.env["TFL_TASK"] == "evaluator:0" and moved.env["TFL_PROGRESS_FILE"].endswith("/evaluator-0.json")
    # Its own files for the whole run, whichever host it runs on.
    home = next(t for t in full.tasks if t.name == "evaluator:0")
    assert (moved.log_path, moved.progress_path) == (home.log_path, home.progress_path)
    assert "TFL_GLOBAL_BATCH" not in moved.env
    assert resize.notes[-1] == "evaluator:0 moves from h2 to h1:1003 while h2 is lost"


def test_any_takes_the_first_surviving_training_host_and_keeps_a_free_port() -> None:
    resize = resize_plan(plan(SHARED, storage=STORAGE), {"h2", "h0"}, "any")
    assert [(t.name, t.host, t.port) for t in resize.plan.tasks] == [("chief:0", "h1", 1002), ("evaluator:0", "h1", 1003)]
    resize = resize_plan(plan(SHARED, storage=STORAGE), {"h2"}, "any")
    assert [(t.name, t.host, t.port) for t in resize.plan.tasks][-1] == ("evaluator:0", "h0", 1002)


def test_the_moved_evaluator_runs_as_the_hosts_training_task_does() -> None:
    hosts = {"h1": {"python": "/opt/h1/python", "env": {"WHERE": "h1"}}, "h2": {"env": {"WHERE": "h2"}}}
    full = plan(SHARED, storage=STORAGE, hosts=hosts)
    moved = resize_plan(full, {"h2"}, ["h1"]).plan.tasks[-1]
    worker = next(t for t in full.tasks if t.host == "h1")
    assert moved.python == "/opt/h1/python" and moved.env["WHERE"] == "h1"
    assert (moved.argv, moved.cwd, moved.ssh, moved.sync, moved.dirs) == (
        worker.argv, worker.cwd, worker.ssh, worker.sync, worker.dirs)


def test_it_goes_back_home_when_its_host_returns() -> None:
    full = plan(SHARED, storage=STORAGE)
    assert resize_plan(full, set(), ["h1"]).plan == full
    home = resize_plan(full, {"h0"}, ["h1"])
    assert [(t.name, t.host, t.port) for t in home.plan.tasks][-1] == ("evaluator:0", "h2", 1002)
    assert not any("evaluator" in note for note in home.notes)


def test_without_a_surviving_allowed_host_it_is_left_out_and_says_why() -> None:
    resize = resize_plan(plan(SHARED, storage=STORAGE), {"h2", "h1"}, ["h1"])
    assert [t.name for t in resize.plan.tasks] == ["chief:0"] and "evaluator:0" in resize.dropped
    assert resize.notes[-1] == ("the evaluator is left out while h2 is lost (training goes on without it; no host "
                                "of elastic.evaluator_moves_to survives)")
    assert "evaluator" not in tf_config(resize.plan, "chief:0")["cluster"]


# --- the cluster file ------------------------------------------------------------------------
def spec(moves_to: Any, cluster: dict[str, list[str]] = SHARED) -> Any:
    return parse_cluster({"cluster": cluster, "storage": STORAGE,
                          "elastic": {"min_tasks": 2, "global_batch": 6, "evaluator_moves_to": moves_to}})


def test_the_cluster_file_names_hosts_or_any_and_the_supervisor_gets_them() -> None:
    assert elastic_options(spec(["h1", "h0"]), None, None, None)["evaluator_moves_to"] == ("h1", "h0")
    assert elastic_options(spec("any"), None, None, None)["evaluator_moves_to"] == "any"
    assert elastic_options(parse_cluster({"cluster": SHARED}), None, None, None)["evaluator_moves_to"] == ()


@pytest.mark.parametrize(("moves_to", "cluster", "message"), [
    ("anywhere", SHARED, 'elastic.evaluator_moves_to: is "anywhere"; give "any" (any surviving host) or a list'),
    (3, SHARED, 'elastic.evaluator_moves_to: is 3; give "any"'),
    (["h9"], SHARED, "elastic.evaluator_moves_to names h9, where no training task runs (they run on: h0, h1, h2); "
                     'name one of those hosts, or "any"'),
    (["h1"], {"chief": ["h0:1"], "worker": ["h1:2"]}, "elastic.evaluator_moves_to: the cluster has no evaluator"),
])
def test_a_bad_evaluator_moves_to_is_one_line_naming_the_field(moves_to: Any, cluster: dict[str, list[str]],
                                                                message: str) -> None:
    with pytest.raises(ClusterFileError) as err:
        spec(moves_to, cluster)
    assert message in str(err.value) and "\n" not in str(err.value)


# --- on the bed ------------------------------------------------------------------------------
# Each task binds its own address from TF_CONFIG, which only works on the host that has that
# address: "at" says where the task really runs. The chief keeps a step checkpoint in the shared
# model dir and the evaluator waits for the chief's "done" file, so it outlives training. The
# training tasks hold before their last step until the test writes "release" there: the run
# cannot end before the evaluator has moved, however slow the machine.
WHERE = """
    import json, os, signal, socket, sys, time
    TOTAL = {total}
    task, config = os.environ["TFL_TASK"], json.loads(os.environ["TF_CONFIG"])
    me = config["cluster"][config["task"]["type"]][config["task"]["index"]]
    host, port = me.rsplit(":", 1)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    print("at", task, me, flush=True)
    model = os.environ["TFL_MODEL_DIR"]
    os.makedirs(model, exist_ok=True)
    ckpt, done, release = (os.path.join(model, name) for name in ("step.json", "done", "release"))
    step = json.load(open(ckpt))["step"] if os.path.exists(ckpt) else 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(170))
    while task.startswith("evaluator") and not os.path.exists(done):
        time.sleep(0.2)
    while step < TOTAL and not task.startswith("evaluator"):
        time.sleep(0.1)
        if step + 1 == TOTAL and not os.path.exists(release):
            continue
        step += 1
        if task == "chief:0" and step % 5 == 0:
            with open(ckpt + ".tmp", "w") as f:
                json.dump({{"step": step}}, f)
            os.replace(ckpt + ".tmp", ckpt)
    if task == "chief:0":
        open(done, "w").close()
"""
AT = re.compile(r"at (evaluator:0) (\S+)")


@pytest.mark.ssh
def test_a_cut_evaluator_host_its_evaluator_runs_on_the_host_it_may_move_to(
        netbed: NetBed, tmp_path: Path, tfl_home: Path, child_env: dict[str, str]) -> None:
    h1, h2, h3 = netbed.addresses
    port = free_port()
    tasks = {"chief": [f"{h1}:{free_port()}"], "worker": [f"{h2}:{port}", f"{h3}:{free_port()}"],
             "evaluator": [f"{h3}:{port}"]}  # its port is worker:0's on h2: it moves to another one there
    (tmp_path / "shared").mkdir()
    spec = netbed.cluster_file(tmp_path / "cluster.json", tasks, sys.executable, ssh={"fence_after": 6},
                               storage={"path": str(tmp_path / "shared")},
                               elastic={"min_tasks": 2, "global_batch": 6, "evaluator_moves_to": [h2]})
    job = write_job(tmp_path / "src", WHERE.format(total=40))
    launcher = subprocess.Popen([sys.executable, "-m", "launcher", "launch", str(job), "--cluster", str(spec),
                                 "--probe-interval", "600", "--grace-period", "10"],
                                env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tfl_home / "runs"

    def evaluator_at() -> list[str]:
        return [m[2] for f in log.glob("*/logs/evaluator-0.log") for m in AT.finditer(f.read_text())]

    try:
        wait_for(lambda: evaluator_at() == [f"{h3}:{port}"] and launcher.poll() is None, timeout=120)
        netbed.cut(h3)
        wait_for(lambda: len(evaluator_at()) == 2, timeout=120)
        (next((tmp_path / "shared").glob("*/model")) / "release").touch()
        out, err = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
        netbed.join(h3)
    assert launcher.returncode == 0, err[-3000:]
    assert evaluator_at() == [f"{h3}:{port}", f"{h2}:{port + 1}"], err[-3000:]  # it ran there: it bound h2's address
    rec = json.loads((log / only_run(tfl_home) / "state.json").read_text())
    assert f"evaluator:0 moves from {h3} to {h2}:{port + 1} while {h3} is lost" in rec["resizes"][0]["notes"]
    assert {t["task"]: t["host"] for t in rec["tasks"]}["evaluator:0"] == h2
    assert f"evaluator:0 moves from {h3} to {h2}:{port + 1}" in err
    assert tfl_processes(run_id=only_run(tfl_home)) == []


# --- the supervisor's policy -------------------------------------------------------------------
def test_the_supervisor_moves_the_evaluator_away_and_back_and_says_so(tmp_path: Path) -> None:
    cluster = {"chief": ["h0:1000"], "worker": ["h1:1001", "h2:1002"], "evaluator": ["h2:1003"]}
    sup, hosts, _, said = make(tmp_path, cluster=cluster, script={"down": {"h2": (10.0, 30.0)}},
                               evaluator_moves_to=("h1",))
    record = sup.run()
    assert record.exit_code == 0
    assert [hosts.attempts()[a] for a in (1, 2)] == [
        [("chief:0", "h0"), ("worker:0", "h1"), ("evaluator:0", "h1")],
        [("chief:0", "h0"), ("worker:0", "h1"), ("worker:1", "h2"), ("evaluator:0", "h2")]]
    assert hosts.started[-1][3]["cluster"]["evaluator"] == ["h2:1003"]
    assert record.resizes[0].notes == ["evaluator:0 moves from h2 to h1:1003 while h2 is lost"]
    assert record.resizes[1].notes == ["evaluator:0 moves back to h2:1003"]
    assert said[0].endswith("; evaluator:0 moves from h2 to h1:1003 while h2 is lost")
    assert said[1].endswith("(taken back at an agreed checkpoint); evaluator:0 moves back to h2:1003")
