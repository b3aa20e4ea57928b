"""The CLI through typer's CliRunner: exit codes, messages, nothing written on a dry run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from launcher.cli import app
from tests.conftest import ROOT

runner = CliRunner()


def test_validate_ok_and_bad(tmp_path: Path) -> None:
    ok = runner.invoke(app, ["validate", str(ROOT / "cluster.example.json")])
    assert ok.exit_code == 0
    assert ok.stdout.splitlines()[:3] == ["chief:0\tlocalhost:23456", "worker:0\tlocalhost:23457", "evaluator:0\tlocalhost:23458"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"cluster": {"chief": ["a:1", "b:1"]}}))
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"tfl: error: {bad}: cluster.chief: has 2 entries; at most one chief is allowed (move the others to cluster.worker)"
    assert "Traceback" not in result.output


def test_schema_is_json_schema() -> None:
    result = runner.invoke(app, ["schema"])
    schema = json.loads(result.stdout)
    assert result.exit_code == 0 and schema["required"] == ["cluster"] and "Topology" in schema["$defs"]


def test_dry_run_prints_plan_and_writes_nothing(tfl_home: Path) -> None:
    result = runner.invoke(app, ["launch", str(ROOT / "jobs" / "mnist.py"), "--local", "2", "--evaluator", "--dry-run", "--", "--epochs", "1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("TF_CONFIG=") == 3 and "--epochs 1" in result.stdout
    assert '"type": "evaluator"' in result.stdout
    assert not tfl_home.exists()


def test_status_on_empty_store(tfl_home: Path) -> None:
    assert runner.invoke(app, ["status"]).stdout.startswith("no runs yet")
    assert json.loads(runner.invoke(app, ["status", "--json"]).stdout) == []
    missing = runner.invoke(app, ["status", "nope"])
    assert missing.exit_code == 2 and "run 'nope' not found" in missing.stderr


def test_launch_usage_errors(tfl_home: Path) -> None:
    cases = [
        (["launch", "jobs/mnist.py"], "give exactly one of --cluster FILE, --local N (e.g. --local 2) or --slurm"),
        (["launch", "jobs/mnist.py", "--local", "2", "--cluster", "c.json"], "give exactly one of"),
        (["launch", "nope.py", "--local", "2"], "nope.py: no such job script"),
        (["launch", "jobs/mnist.py", "--cluster", "nope.json"], "nope.json: no such file"),
        (["launch", "jobs/mnist.py", "--local", "2", "--retry-on", "sometimes"], "--retry-on sometimes: choose 'any' or 'preemption'"),
        (["logs", "--task", "ps:0"], "no runs yet"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.output)


def test_common_commands_import_neither_tensorflow_nor_fabric(tmp_path: Path) -> None:
    """Nor pydantic's schema machinery, nor Ray (also for a Ray run in the list): `tfl status` must stay near
    the bare imports (docs/benchmarks.md §1)."""
    code = ("import sys; from typer.testing import CliRunner; from launcher.cli import app; "
            "from launcher.records.store import RunRecord, RunStore, TaskRecord; "
            "store = RunStore(); run = store.run_dir('r1'); "
            "store.create(RunRecord(run_id='r1', job='j.py', job_args=[], run_dir=str(run), created=1.0, "
            "tasks=[TaskRecord(task='chief:0', host='localhost', backend='local', log_path='l', progress_path='p')])); "
            "store.create(RunRecord(run_id='r2', job='j.py', job_args=[], run_dir=str(store.run_dir('r2')), created=2.0, backend='ray', "
            "tasks=[TaskRecord(task='chief:0', host='127.0.0.1', backend='ray', log_path='l', progress_path='p')])); "
            "results = [CliRunner().invoke(app, args) for args in (['status'], ['status', 'r1'], ['status', '--json'], ['--help'])]; "
            "assert all(r.exit_code == 0 for r in results), [r.output for r in results]; "
            "assert 'r1' in results[0].stdout and 'r2' in results[0].stdout and 'chief:0' in results[1].stdout; "
            "print([m for m in ('tensorflow', 'fabric', 'paramiko', 'typer._adapters', 'pydantic._internal._generate_schema', 'ray') "
            "if m in sys.modules])")
    env = {**os.environ, "TFL_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_status_takes_one_run(tfl_home: Path) -> None:
    result = runner.invoke(app, ["status", "a", "b"])
    assert result.exit_code == 2 and "status takes one RUN, got 2: a b" in result.stderr
    assert "Usage: tfl status [OPTIONS] [RUN]" in runner.invoke(app, ["status", "--help"]).stdout
    assert runner.invoke(app, ["status", "--bogus"]).exit_code == 2


def test_bad_cluster_files_get_one_line_never_a_traceback(tfl_home: Path, tmp_path: Path) -> None:
    """Issue 13: a RecursionError and a UnicodeDecodeError escaped; an '=' in an env name passed
    validate and the dry run, then crashed the launch."""
    cases = {
        "deep.json": (b'{"cluster": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nests objects/lists more than 64 levels deep"),
        "latin1.json": (b'{"cluster": {"chief": ["h\xe9:1"]}}', "is not UTF-8 text (byte 0xe9 at offset 25); save it as UTF-8"),
        "env.json": (json.dumps({"cluster": {"chief": ["localhost:5"]}, "env": {"A=B": "1"}}).encode(),
                     "env: key 'A=B' is not an environment variable name"),
    }
    for name, (content, message) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        for args in (["validate", str(path)], ["launch", str(ROOT / "jobs" / "mnist.py"), "--cluster", str(path), "--dry-run"]):
            result = runner.invoke(app, args)
            assert result.exit_code == 2, (args, result.output[-300:])
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith(f"tfl: error: {path}: ") and message in lines[0], lines
            assert "Traceback" not in result.output
    assert not tfl_home.exists()


def test_validate_refuses_what_the_file_alone_decides_in_one_line_naming_the_field(tmp_path: Path) -> None:
    """Refused by the launch before issue 26, accepted by validate: the same refusal now, naming the file's field."""
    two = {"chief": ["localhost:23456"], "worker": ["localhost:23457"]}
    three = {"chief": ["localhost:23456"], "worker": ["localhost:23457", "localhost:23458"]}
    cases = [
        ({"cluster": two, "elastic": {"min_tasks": 5}},
         "elastic.min_tasks 5: the cluster has 2 training tasks (the chief included); give elastic.min_tasks 2 or less"),
        ({"cluster": three, "elastic": {"min_tasks": 2, "global_batch": 10}},
         "elastic.global_batch 10 cannot be split over 3 training tasks"),
        ({"slurm": {"nodes": 2, "requeue": True}, "elastic": {"min_tasks": 1, "global_batch": 4}},
         "elastic.min_tasks with the slurm block's \"requeue\": true"),
    ]
    for number, (description, start) in enumerate(cases):
        path = tmp_path / f"c{number}.json"
        path.write_text(json.dumps(description))
        result = runner.invoke(app, ["validate", str(path)])
        assert result.exit_code == 2 and result.stdout == "", (description, result.output)
        assert result.stderr.startswith(f"tfl: error: {start}") and result.stderr.count("\n") == 1, result.stderr
    # What the command line can still give is left to the launch: --global-batch for this one.
    path = tmp_path / "later.json"
    path.write_text(json.dumps({"cluster": three, "elastic": {"min_tasks": 2}}))
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0


def test_a_job_option_before_the_double_dash_says_where_it_goes(tmp_path: Path) -> None:
    """`tfl launch jobs/mnist.py --local 2 --epochs 2` said only "No such option: --epochs
    (Possible options: --detach)": nothing about the `--` that the job's own options follow."""
    job = tmp_path / "job.py"
    job.write_text("print('hi')\n")
    for command in (["launch", str(job), "--local", "2", "--epochs", "2"],
                    ["export", "k8s", str(job), "--local", "2", "--image", "x", "--epochs", "2"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert "No such option: --epochs" in result.stderr
        assert "give it after `--`, e.g. `" in result.stderr and " JOB --local 2 -- --epochs …`" in result.stderr
    typo = runner.invoke(app, ["launch", str(job), "--local", "2", "--evalutor"])
    assert "(Possible options: --evaluator, --evaluator-timeout, --network); if it is the job's" in typo.stderr
