"""The agent's file work (private run dirs, the kit check, storage tokens, cleanup), its
answers after a chatty login shell, and a job's leftover child (real processes, no sshd)."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import sys
import tarfile
from pathlib import Path

import pytest

from launcher.describe.hosts import HOST_CACHE
from launcher.engines.ssh.node import agent, agent_files
from launcher.engines.ssh.wire import MARK, kit_data, reply
from tests.procs import pid_alive
from tests.test_ssh_agent import collect, gone, run_request, send, start_task, tagged_frames


def test_the_agent_and_the_launcher_agree_on_the_mark_and_the_placeholder() -> None:
    assert agent.MARK.encode() == MARK and agent_files.CACHE_PLACEHOLDER == HOST_CACHE


def test_an_answer_survives_what_a_login_shell_printed_first() -> None:
    assert reply(b"Welcome!\n\x1b[1mno newline" + MARK + b'{"ok": 1}\n') == {"ok": 1}


def test_a_child_that_outlives_the_job_is_ended_with_the_group(tmp_path: Path) -> None:
    body = """
        import subprocess, sys
        child = subprocess.Popen(["sleep", "60"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("child", child.pid, flush=True)
    """
    agent_proc = start_task(run_request(tmp_path, body))
    controls, output = collect(agent_proc, until=b"\n")
    child = int(output.split()[1])
    frames = tagged_frames(agent_proc)
    while {"exit": 0} not in controls:  # the leader is done: its exit is reported at once...
        kind, ident, payload = next(frames)
        controls += [json.loads(payload)] if kind == b"C" and ident == 1 else []
    assert pid_alive(child) and {"gone": 0} not in controls  # ...but the task is not gone while its group lives
    send(agent_proc, {"id": 1, "signal": int(signal.SIGTERM)})  # the run's teardown
    assert gone([child])
    while {"gone": 0} not in controls:
        kind, ident, payload = next(frames)
        controls += [json.loads(payload)] if kind == b"C" and ident == 1 else []
    assert agent_proc.stdin is not None
    agent_proc.stdin.close()
    assert agent_proc.wait(10) == 0


def test_private_dirs_are_made_0700_and_a_symlink_or_a_strangers_dir_is_refused(tmp_path: Path) -> None:
    made = tmp_path / "cache" / "tfl"
    assert agent_files.dir_problem(str(made), private=True) is None and (made.stat().st_mode & 0o777) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    assert agent_files.dir_problem(str(loose), private=True) is None and (loose.stat().st_mode & 0o777) == 0o700
    link = tmp_path / "link"
    link.symlink_to(loose)
    assert agent_files.dir_problem(str(link), private=True) == {"problem": "symlink", "target": str(loose)}
    (tmp_path / "a-file").write_text("")
    assert agent_files.dir_problem(str(tmp_path / "a-file" / "x"), private=False)["problem"] == "unusable"  # type: ignore[index]
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    strangers = tmp_path / "strangers"
    strangers.mkdir()
    os.chown(strangers, 65534, 65534)
    problem = agent_files.dir_problem(str(strangers), private=True)
    assert problem is not None and problem["problem"] == "owner" and problem["uid"] == 65534
    unpacked = agent_files.unpack({"dirs": [{"path": str(strangers), "private": True, "role": "run dir"},
                                            {"path": str(strangers / "below"), "private": True}], "archives": []})
    assert list(unpacked["dirs"]) == [str(strangers)] and not (strangers / "below").exists()  # nothing made below it



def test_a_private_dirs_missing_parents_are_0700_whatever_the_umask(tmp_path: Path) -> None:
    """A host's missing ~/.cache was made 0777 under a login umask of 000 (0755 under 022): anyone
    could rename ~/.cache/tfl, checked, away and put a dir with their own code in its place."""
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    old = os.umask(0)
    try:
        assert agent_files.dir_problem(str(home / ".cache" / "tfl" / "runs"), private=True) is None
    finally:
        os.umask(old)
    made = [home / ".cache", home / ".cache" / "tfl", home / ".cache" / "tfl" / "runs"]
    assert [oct(p.stat().st_mode & 0o777) for p in [home, *made]] == ["0o755", "0o700", "0o700", "0o700"]

def test_the_kit_imports_from_a_probe_and_a_broken_kit_says_why(tmp_path: Path) -> None:
    before = {n: m for n, m in sys.modules.items() if n.split(".")[0] == "launcher"}
    assert agent_files.kit_probe(kit_data())["ok"]
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in (("launcher/__init__.py", ""), ("launcher/jobkit/__init__.py", "raise ImportError('too old')\n")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text.encode()))
    broken = base64.b64encode(buffer.getvalue()).decode()
    assert agent_files.kit_probe(broken) == {"ok": False, "error": "ImportError: too old"}
    scratch = tmp_path / "kit"
    agent_files.extract([{"dest": str(scratch), "data": broken}])
    found = agent_files.kit_check(str(scratch), full=False)  # tfl launch's quick look: found there, not imported
    assert found["ok"] and found["file"] == str(scratch / "launcher" / "jobkit" / "__init__.py")
    assert {n: m for n, m in sys.modules.items() if n.split(".")[0] == "launcher"} == before  # this process's own, as before


def test_storage_tokens_are_written_read_and_removed(tmp_path: Path) -> None:
    assert agent_files.storage({"dir": str(tmp_path), "write": {".t1": "a"}}) == {"seen": {}}
    assert (tmp_path / ".t1").stat().st_mode & 0o777 == 0o600
    seen = agent_files.storage({"dir": str(tmp_path), "read": {".t1": "a", ".t2": "b"}, "wait": 0.3, "remove": [".t1"]})
    assert seen == {"seen": {".t1": True, ".t2": False}} and not (tmp_path / ".t1").exists()
    missing = agent_files.storage({"dir": str(tmp_path / "not-mounted"), "write": {".t1": "a"}})
    assert missing["error"].startswith("FileNotFoundError")


def test_cleanup_removes_our_dirs_and_leaves_a_symlinks_target_and_a_model_dir(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for sub in ("kit/launcher", "code", "model/checkpoints"):
        (run / sub).mkdir(parents=True)
    (run / "model" / "checkpoints" / "ckpt-1.index").write_text("")
    empty = tmp_path / "empty" / "model" / "backup"  # what a worker's host keeps of a run
    empty.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (run / "progress").symlink_to(target)
    done = agent_files.cleanup({"remove": [str(run / d) for d in ("kit", "code", "progress", "scratch")],
                                "rmdir": [str(run), str(tmp_path / "empty")]})
    assert done == {"removed": [str(run / "kit"), str(run / "code")]}
    assert sorted(p.name for p in run.iterdir()) == ["model", "progress"] and target.is_dir()
    assert (run / "model" / "checkpoints" / "ckpt-1.index").exists() and not (tmp_path / "empty").exists()


def test_a_progress_record_written_within_the_same_tick_as_the_last_is_forwarded_too(tmp_path: Path) -> None:
    """The kit replaces its progress file whole; the kernel's file clock ticks every few ms, so a task's
    last record ("done", "preempted") written right after its last step's can carry the same mtime. Told
    by its mtime alone, it was never forwarded: the launcher kept the step's record for good."""
    path = tmp_path / "chief-0.json"
    sent: list[dict[str, str]] = []
    progress = agent_files.Progress(str(path))

    def replace(record: dict[str, object], mtime_ns: int) -> None:  # as the kit writes it: a new file, renamed over
        (tmp_path / "tmp").write_text(json.dumps(record))
        os.utime(tmp_path / "tmp", ns=(mtime_ns, mtime_ns))
        os.replace(tmp_path / "tmp", path)

    replace({"phase": "train", "global_step": 99}, 1_700_000_000_000_000_000)
    progress.forward(sent.append, now=1.0)
    replace({"phase": "done", "global_step": 100}, 1_700_000_000_000_000_000)  # the same tick
    progress.forward(sent.append, now=1.2, final=True)
    progress.forward(sent.append, now=2.0)  # nothing new: nothing sent again
    assert [json.loads(m["progress"]) for m in sent] == [{"phase": "train", "global_step": 99},
                                                        {"phase": "done", "global_step": 100}]
