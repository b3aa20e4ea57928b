"""``tfl doctor``: judging a host's facts (pure), then real hosts behind the test sshd."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.describe.ports import free_port
from launcher.engines.preflight import HostTasks, judge
from tests.sshd import NOWHERE, Sshd, cluster_file

runner = CliRunner()
HOST = HostTasks("gpu1", "/opt/py", "/srv/w", None, [("chief:0", 2000), ("worker:0", 2001)])


def facts(**packages: str | None) -> dict[str, Any]:
    return {"python": "3.11.7", "executable": "/opt/py", "ports": {"2000": None, "2001": "Address already in use"},
            "packages": {"tensorflow": "2.17.1", "tf_keras": "2.17.0", "keras": "3.6.0", "psutil": "6.0", **packages},
            "disk": {"path": "/srv", "free_gb": 120.0}, "gpus": ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"]}


def by_name(checks: list[Any]) -> dict[str, Any]:
    return {c.name: c for c in checks}


def test_a_healthy_host_passes_and_a_busy_port_fails_with_the_fix() -> None:
    checks = by_name(judge(HOST, facts()))
    assert checks["python"].status == "ok" and checks["port 2000"].status == "ok"
    assert checks["port 2001"].status == "fail"
    assert checks["port 2001"].detail == ("port 2001 of worker:0 is in use (Address already in use); "
                                          "stop what holds it or give worker:0 another port in the cluster file")
    assert checks["packages"].status == "ok" and "tf_keras in use" in checks["packages"].detail
    assert checks["gpus"].detail == "1 visible: GPU 0: NVIDIA H100 80GB HBM3" and checks["disk"].status == "ok"


def test_keras_3_without_tf_keras_fails_with_the_install_command() -> None:
    check = by_name(judge(HOST, facts(tf_keras=None)))["packages"]
    assert check.status == "fail" and "Keras 3 would be used" in check.detail
    assert check.detail.endswith("fix: /opt/py -m pip install 'tf_keras~=2.17.0'")
    unset = HostTasks("h", "/opt/py", None, None, legacy_keras=False)
    assert "TF_USE_LEGACY_KERAS=1" in by_name(judge(unset, facts()))["packages"].detail
    old = by_name(judge(HOST, facts(tensorflow="2.15.0", tf_keras=None, keras="2.15.0")))["packages"]
    assert old.status == "ok"  # TensorFlow before 2.16 ships Keras 2 itself
    missing = by_name(judge(HOST, facts(tensorflow=None)))["packages"]
    assert missing.status == "fail" and missing.detail.endswith("fix: /opt/py -m pip install tensorflow")


def test_the_job_kit_must_import_from_the_shipped_copy_under_python_3_10() -> None:
    ok = by_name(judge(HOST, {**facts(), "kit": {"ok": True, "file": "/k/launcher/jobkit/__init__.py", "python": "3.11.7"}}))
    assert ok["job kit"].status == "ok"
    for kit, said in (({"ok": True, "python": "3.8.10"}, "(Python 3.8.10 is older than 3.10)"),
                      ({"ok": False, "file": "/usr/lib/launcher/jobkit/__init__.py", "python": "3.11.7"},
                       "(`launcher.jobkit` came from /usr/lib/launcher/jobkit/__init__.py, not from the shipped copy)"),
                      ({"ok": False, "error": "SyntaxError: invalid syntax (context.py, line 3)"},
                       "(SyntaxError: invalid syntax (context.py, line 3))")):
        check = by_name(judge(HOST, {**facts(), "kit": kit}))["job kit"]
        assert check.status == "fail" and check.detail == (
            f"the shipped job kit does not import under /opt/py {said}; every task would fail at `from launcher import "
            "jobkit`: set hosts.gpu1.python to a Python >= 3.10")


def test_disk_gpus_psutil_and_the_quick_subset() -> None:
    low = facts()
    low.update(disk={"path": "/srv", "free_gb": 0.4}, gpus=[])
    low["packages"]["psutil"] = None
    checks = by_name(judge(HOST, low))
    assert checks["disk"].status == "fail" and "hosts.gpu1.workdir" in checks["disk"].detail
    assert checks["gpus"].status == "warn" and checks["psutil"].status == "warn"
    quick = {k: v for k, v in facts().items() if k in ("python", "executable", "ports")}
    assert set(by_name(judge(HOST, quick, quick=True))) == {"python", "port 2000", "port 2001"}
    with_kit = {**quick, "kit": {"ok": True}, "packages": facts()["packages"]}  # a quick probe ships the kit too
    assert set(by_name(judge(HOST, with_kit, quick=True))) == {"python", "port 2000", "port 2001", "job kit", "packages"}


def doctor(cluster: Path, *extra: str) -> tuple[int, list[dict[str, str]]]:
    result = runner.invoke(app, ["doctor", "--cluster", str(cluster), "--json", *extra])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.ssh
def test_doctor_checks_every_host_and_guards_host_keys(sshd: Sshd, tmp_path: Path) -> None:
    known = sshd.known_hosts_for(("127.0.0.2",), tmp_path / "known_hosts")
    tasks = {"chief": [f"127.0.0.2:{free_port()}"], "worker": [f"127.0.0.3:{free_port()}", f"{NOWHERE}:{free_port()}"]}
    workdirs = {h: tmp_path / h for h in ("127.0.0.2", "127.0.0.3")}
    cluster = cluster_file(tmp_path / "c.json", sshd, tasks, workdirs, ssh={"known_hosts": str(known)})
    code, checks = doctor(cluster)
    assert code == 1
    status = {(c["host"], c["name"]): c for c in checks}
    assert {n for h, n in status if h == "127.0.0.2" and status[(h, n)]["status"] == "ok"} >= {
        "ssh", "python", "packages", "disk", "gpus", f"port {tasks['chief'][0].split(':')[1]}"}
    unknown = status[("127.0.0.3", "ssh")]
    assert unknown["status"] == "fail" and f"ssh-keyscan -p {sshd.port} 127.0.0.3 >> {known}" in unknown["detail"]
    assert status[(NOWHERE, "ssh")]["detail"].startswith("connection refused")
    assert known.read_text().count("\n") == 1  # refusing wrote nothing

    code, checks = doctor(cluster, "--accept-new-host-keys")
    assert {(c["host"], c["status"]) for c in checks if c["name"] == "ssh"} == {
        ("127.0.0.2", "ok"), ("127.0.0.3", "ok"), (NOWHERE, "fail")}
    assert f"[127.0.0.3]:{sshd.port} {sshd.host_key_line}" in known.read_text()

    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    forged = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    known.write_text(f"[127.0.0.2]:{sshd.port} {forged}\n")
    code, checks = doctor(cluster, "--accept-new-host-keys")  # a *changed* key is never accepted
    changed = next(c for c in checks if c["host"] == "127.0.0.2" and c["name"] == "ssh")
    assert changed["status"] == "fail" and changed["detail"].startswith(f"HOST KEY CHANGED for [127.0.0.2]:{sshd.port}")
    assert f"ssh-keygen -R '[127.0.0.2]:{sshd.port}' -f {known}" in changed["detail"]


def test_a_host_whose_probe_fails_is_named_not_shown_as_a_question_mark(tmp_path: Path) -> None:
    """A local python that does not exist: the row and the summary said `?` instead of the host."""
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": {"chief": [f"localhost:{free_port()}"]},
                                   "hosts": {"localhost": {"python": str(tmp_path / "no-python")}}}))
    result = runner.invoke(app, ["doctor", "--cluster", str(cluster)])
    assert result.exit_code == 1, result.output
    row, summary = result.stdout.splitlines()
    assert row.startswith("localhost  FAIL  preflight: localhost: python ") and "not found" in row
    assert summary == "doctor: 1 of 1 host(s) have problems (localhost)"


def test_the_quick_checks_fail_a_python_or_working_dir_not_found() -> None:
    """A launch's quick checks: a local python or workdir that does not exist used to pass them, so
    the run started and failed (`--detach` said it was supervised in the background, exit 0)."""
    checks = by_name(judge(HOST, {**facts(), "found": {"python": False, "workdir": False}}, quick=True))
    assert checks["python"].status == "fail" and checks["python"].detail == (
        "python '/opt/py' not found (no such file); set hosts.gpu1.python to a python that has tensorflow")
    assert checks["working dir"].status == "fail" and checks["working dir"].detail == (
        "working dir /srv/w does not exist; fix: set hosts.gpu1.workdir to a directory there")
    fine = by_name(judge(HOST, {**facts(), "found": {"python": True, "workdir": True}}, quick=True))
    assert fine["python"].status == "ok" and "working dir" not in fine


def test_a_detached_launch_refuses_a_working_dir_that_does_not_exist(tmp_path: Path, tfl_home: Path) -> None:
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": {"chief": [f"localhost:{free_port()}"]},
                                   "hosts": {"localhost": {"workdir": str(tmp_path / "nowhere")}}}))
    (tmp_path / "job.py").write_text("print('ran')\n")
    result = runner.invoke(app, ["launch", str(tmp_path / "job.py"), "--cluster", str(cluster), "--detach"])
    assert result.exit_code == 2, result.output
    assert result.stderr == (f"tfl: error: localhost: working dir {tmp_path / 'nowhere'} does not exist; fix: set "
                             "hosts.localhost.workdir to a directory there\n")
    assert not list((tfl_home / "runs").glob("*/state.json"))


def test_a_local_python_that_is_no_python_is_named_with_the_fix_not_a_json_error(tmp_path: Path) -> None:
    """A python that exits 0 without the agent's answer (here /bin/true) was reported as
    `preflight: Expecting value: line 1 column 1 (char 0)`: neither the python nor the fix."""
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": {"chief": [f"localhost:{free_port()}"]},
                                   "hosts": {"localhost": {"python": "/bin/true"}}}))
    result = runner.invoke(app, ["doctor", "--cluster", str(cluster)])
    assert result.exit_code == 1, result.output
    row, _ = result.stdout.splitlines()
    assert row == ("localhost  FAIL  preflight: localhost: the tfl agent failed under '/bin/true' (it ended without "
                   "the agent's answer: is it a python?); set hosts.localhost.python to a Python >= 3.8")


def test_doctor_fails_a_local_working_dir_that_launch_would_refuse(tmp_path: Path) -> None:
    """Only the launch's quick checks looked for the working dir: doctor said `all 1 host(s) ready`
    (and `disk: ... free at /`) for a cluster that `tfl launch` then refused."""
    cluster = tmp_path / "c.json"
    cluster.write_text(json.dumps({"cluster": {"chief": [f"localhost:{free_port()}"]},
                                   "hosts": {"localhost": {"workdir": str(tmp_path / "nowhere")}}}))
    result = runner.invoke(app, ["doctor", "--cluster", str(cluster)])
    assert result.exit_code == 1, result.output
    assert (f"localhost  FAIL  working dir: working dir {tmp_path / 'nowhere'} does not exist; fix: set "
            "hosts.localhost.workdir to a directory there") in result.stdout.splitlines()
    assert result.stdout.splitlines()[-1] == "doctor: 1 of 1 host(s) have problems (localhost)"
