"""Remote tasks in the plan are pure data: settings merge, paths, shipping, round trip."""

from __future__ import annotations

import json
import subprocess
import sys

from launcher.describe.hosts import HOST_CACHE, RemoteDirs, RemoteOptions, SSHTarget, ssh_target
from launcher.describe.spec import parse_cluster
from launcher.engines.registry import name_for_plan
from launcher.plan.build import build_plan, render_plan
from launcher.plan.launch_plan import LaunchPlan
from tests.conftest import ROOT

SPEC = parse_cluster({
    "cluster": {"chief": ["h1:1000"], "worker": ["h2:1001"]},
    "env": {"DECLARED": "yes", "PYTHONPATH": "/mine"},
    "ssh": {"user": "train", "port": 2222, "identity_file": "~/.ssh/tfl", "known_hosts": "/etc/kh"},
    "hosts": {"h2": {"python": "/opt/py", "workdir": "/srv/w", "ssh": {"port": 22, "user": "other"}}},
})


def plan(**options: object) -> LaunchPlan:
    return build_plan(SPEC, "/src/proj/jobs/job.py", ("--x", "a b"), run_id="r1", run_dir="/runs/r1",
                      python="/venv/python", cwd="/here", remote=RemoteOptions(**options))  # type: ignore[arg-type]


def test_per_host_ssh_settings_override_the_defaults() -> None:
    assert ssh_target(SPEC, "h1") == SSHTarget("h1", 2222, "train", "~/.ssh/tfl", 10.0, "/etc/kh")
    h2 = ssh_target(SPEC, "h2", accept_new_host_keys=True)
    assert (h2.port, h2.user, h2.identity_file, h2.accept_new_host_keys) == (22, "other", "~/.ssh/tfl", True)
    assert h2.address == "h2" and ssh_target(SPEC, "h1").address == "[h1]:2222"


R1 = f"{HOST_CACHE}/runs/r1/h1"  # h1's run dir: private, in its login user's cache
R2 = f"{HOST_CACHE}/runs/r1/h2"


def test_shipped_job_runs_from_the_host_workdir() -> None:
    chief, worker = plan(ship_code=True).tasks
    assert name_for_plan(plan(ship_code=True)) == "ssh" and chief.cwd == f"{R1}/code"
    assert chief.argv == ("/venv/python", "-u", f"{R1}/code/job.py", "--x", "a b")
    assert chief.sync == (("/src/proj/jobs/job.py", f"{R1}/code/job.py"),)
    assert worker.argv[:3] == ("/opt/py", "-u", "/srv/w/job.py") and worker.cwd == "/srv/w"
    assert worker.env["TFL_RUN_DIR"] == R2 and worker.env["TFL_PROGRESS_FILE"] == f"{R2}/progress/worker-0.json"
    assert worker.progress_path == "/runs/r1/progress/worker-0.json"  # the local mirror
    assert worker.log_path == "/runs/r1/logs/worker-0.log" and worker.env["DECLARED"] == "yes"
    # Names and paths only: no key material ever lands in the plan (or the run record).
    assert worker.ssh == SSHTarget(**{"host": "h2", "port": 22, "user": "other", "identity_file": "~/.ssh/tfl", "connect_timeout": 10.0,
                                      "known_hosts": "/etc/kh", "accept_new_host_keys": False})


def test_the_job_kit_ships_first_on_the_path_into_private_dirs_removed_at_the_end() -> None:
    chief, worker = plan(ship_code=True).tasks
    assert chief.env["PYTHONPATH"] == f"{R1}/kit:/mine"  # the kit before the cluster file's own entries
    assert chief.dirs == RemoteDirs(private=(HOST_CACHE, f"{HOST_CACHE}/runs", f"{HOST_CACHE}/runs/r1", R1), checked=(),
                                    kit=f"{R1}/kit", remove=(f"{R1}/kit", f"{R1}/progress", f"{R1}/scratch", f"{R1}/code"),
                                    rmdir=(R1, f"{HOST_CACHE}/runs/r1"))
    assert worker.dirs is not None and worker.dirs.checked == ("/srv/w",)  # its own workdir, which the code goes into
    assert f"{R2}/code" not in worker.dirs.remove  # the user's workdir keeps its copy
    kept = plan(ship_code=True, keep_remote=True).tasks[0].dirs
    assert kept is not None and kept.remove == kept.rmdir == () and kept.kit == f"{R1}/kit"
    no_sync = plan(ship_code=False).tasks[0]
    assert no_sync.dirs is not None and no_sync.dirs.kit == f"{R1}/kit" and no_sync.sync == ()  # the kit ships anyway


def test_on_hosts_fills_in_each_hosts_dir_everywhere_but_in_the_jobs_arguments() -> None:
    spec = parse_cluster({"cluster": {"chief": ["h1:1000"], "worker": ["h2:1001"]}})
    p = build_plan(spec, "/j.py", (HOST_CACHE,), run_id="r1", run_dir="/runs/r1", python="/py", cwd="/c",
                   remote=RemoteOptions(ship_code=True))
    chief, worker = p.on_hosts({"h1": "/home/a/.cache/tfl", "h2": "/u/b/.cache/tfl"}).tasks
    assert chief.argv == ("/py", "-u", "/home/a/.cache/tfl/runs/r1/h1/code/j.py", HOST_CACHE)
    assert worker.env["TFL_RUN_DIR"] == "/u/b/.cache/tfl/runs/r1/h2" and worker.cwd == "/u/b/.cache/tfl/runs/r1/h2/code"
    assert chief.dirs is not None and chief.dirs.private[0] == "/home/a/.cache/tfl" and chief.dirs.kit.startswith("/home/a/")
    assert not any(HOST_CACHE in v for t in (chief, worker) for v in (*t.env.values(), t.cwd, *t.sync[0]))


def test_shared_storage_names_each_tasks_model_dir() -> None:
    spec = parse_cluster({"cluster": {"chief": ["h1:1000"], "worker": ["h2:1001"]}, "storage": {"path": "/mnt/shared/tfl/"}})
    p = build_plan(spec, "/j.py", (), run_id="r1", run_dir="/runs/r1", python="/py", cwd="/c")
    assert {t.env["TFL_MODEL_DIR"] for t in p.tasks} == {"/mnt/shared/tfl/r1/model"}
    assert "TFL_MODEL_DIR" not in plan().tasks[0].env


def test_a_synced_dir_holding_the_job_keeps_its_layout() -> None:
    chief = plan(ship_code=True, sync_dirs=("/src/proj",)).tasks[0]
    assert chief.argv[2] == f"{R1}/code/jobs/job.py" and chief.sync == (("/src/proj", f"{R1}/code"),)
    other = plan(ship_code=True, sync_dirs=("/data/x",)).tasks[0]
    assert other.sync == (("/src/proj/jobs/job.py", f"{R1}/code/job.py"), ("/data/x", f"{R1}/code"))


def test_no_sync_keeps_this_machines_paths() -> None:
    chief, worker = plan(ship_code=False).tasks
    assert chief.argv[2] == "/src/proj/jobs/job.py" and chief.cwd == "/here" and chief.sync == ()
    assert chief.env["TFL_RUN_DIR"] == R1  # the run dir is the host's private one all the same


def test_tf_config_travels_in_env_only_and_plan_round_trips() -> None:
    p = plan(ship_code=True, sync_dirs=("/src/proj",), accept_new_host_keys=True)
    for task in p.tasks:
        assert json.loads(task.env["TF_CONFIG"])["task"]["type"] in ("chief", "worker")
        assert not any("cluster" in arg for arg in task.argv)
    assert LaunchPlan.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    text = render_plan(p)
    assert "ssh: train@h1:2222, key ~/.ssh/tfl, known_hosts /etc/kh, accepting new host keys" in text
    assert f"ship: /src/proj -> {R1}/code" in text and f"ship: the job kit -> {R1}/kit" in text
    assert f"{HOST_CACHE}: each remote host's $XDG_CACHE_HOME/tfl or ~/.cache/tfl" in text


def test_localhost_marked_as_ssh_goes_over_ssh() -> None:
    spec = parse_cluster({"cluster": {"chief": ["localhost:1"]}, "hosts": {"localhost": {"ssh": {"port": 2200}}}})
    p = build_plan(spec, "/j.py", (), run_id="r", run_dir="/r", python="p", cwd="/c")
    task = p.tasks[0]
    assert name_for_plan(p) == "ssh" and task.ssh is not None and task.ssh.port == 2200


def test_status_and_help_never_import_fabric_or_tensorflow(tmp_path: object) -> None:
    code = ("import sys; from typer.testing import CliRunner; from launcher.cli import app; r = CliRunner();"
            "r.invoke(app, ['--help']); r.invoke(app, ['status']); r.invoke(app, ['launch', '--help']);"
            "print(sorted(m for m in ('fabric', 'paramiko', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={"TFL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True)
    assert out.stdout.strip() == "[]"
