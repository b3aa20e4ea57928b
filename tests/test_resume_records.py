"""Records across versions and `tfl resume`'s pure parts: no processes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from launcher.plan.run_options import SupervisorConfig
from launcher.records.states import RunState
from launcher.records.store import RECORD_VERSION, RestartRecord, RunRecord, RunStore
from launcher.runs.resume import refusal, resume_config


def record(tmp_path: Path, **fields: object) -> RunRecord:
    return RunRecord(run_id="r", job="/job.py", job_args=[], run_dir=str(tmp_path / "runs" / "r"), created=1.0,
                     **fields)  # type: ignore[arg-type]


def test_a_version_2_record_is_read_and_saved_in_this_version(tmp_path: Path) -> None:
    old = dataclasses.asdict(record(tmp_path, state=RunState.STOPPED, max_restarts=2, grace_period=7.0,
                                    restarts=[RestartRecord(attempt=1, time=2.0, reason="worker:0: exit code 1")]))
    del old["config"]  # the fields version 3 added
    for key in ("min_tasks", "lost_hosts", "resizes"):  # and version 4 (elastic runs)
        del old[key]
    for restart in old["restarts"]:
        del restart["kind"]
    old["version"] = 2
    store = RunStore(tmp_path)
    (tmp_path / "runs" / "r").mkdir(parents=True)
    (tmp_path / "runs" / "r" / "state.json").write_text(json.dumps(old))
    loaded = store.load("r")
    assert loaded.version == 2 and loaded.restarts[0].kind == "failure" and loaded.config == {}
    assert (loaded.min_tasks, loaded.lost_hosts, loaded.resizes) == (None, {}, [])
    # A record from before tfl kept its options: resume takes what the record has.
    assert resume_config(loaded) == SupervisorConfig(max_restarts=2, grace_period=7.0)
    assert resume_config(loaded, {"max_restarts": 5, "grace_period": None}).max_restarts == 5
    store.save(loaded)
    assert json.loads((tmp_path / "runs" / "r" / "state.json").read_text())["version"] == RECORD_VERSION == 5


def test_resume_keeps_the_runs_own_options_and_ignores_unknown_ones(tmp_path: Path) -> None:
    config = dataclasses.asdict(SupervisorConfig(max_restarts=1, max_preemptions=4, stall_timeout=60.0))
    got = resume_config(record(tmp_path, config={**config, "an_option_of_a_newer_tfl": 1}), {"max_preemptions": 9})
    assert (got.max_restarts, got.max_preemptions, got.stall_timeout) == (1, 9, 60.0)


def test_refusals_that_need_no_backend(tmp_path: Path) -> None:
    done = record(tmp_path, state=RunState.SUCCEEDED, plan={"tasks": []})
    assert refusal(done) == "run r succeeded: there is nothing to resume (launch the job again for a new run)"
    never = record(tmp_path, state=RunState.FAILED)
    assert refusal(never) == "run r has no recorded plan (it never started): launch the job again"


def test_resuming_a_lost_run_says_it_was_lost_not_running(tmp_path: Path) -> None:
    """A run whose launcher was killed with -9 shows as `lost` in `tfl status`; its resume used to
    record "resumed by `tfl resume` (the run was running)"."""
    import sys

    from launcher.describe.spec import parse_cluster
    from launcher.plan.build import build_plan
    from launcher.runs.resume import claim
    from launcher.supervise.supervisor import initial_record

    store = RunStore(tmp_path)
    plan = build_plan(parse_cluster({"cluster": {"chief": ["localhost:1"]}}), "/job.py", (), run_id="r",
                      run_dir=str(store.run_dir("r")), python=sys.executable, cwd=str(tmp_path))
    lost = initial_record(plan, created=1.0, max_restarts=0, backend="local")
    lost.state, lost.launcher_pid = RunState.RUNNING, 2**22 + 1  # no such pid: the launcher is gone
    store.create(lost)
    claimed = claim(store, "r", SupervisorConfig())
    assert claimed.restarts[-1].reason == "resumed by `tfl resume` (the run was lost: its launcher was gone)"
