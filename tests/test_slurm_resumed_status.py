"""`tfl status` of a resumed Slurm run names the run's earlier jobs, not only its latest.

Each `tfl resume` of a Slurm run submits a new job in the same run dir; the record keeps only the
latest job's id, so the status of a resumed run named that job alone, and the jobs of the attempts
before (the one that failed, for `sacct -j`) were nowhere in tfl's views. Against a fake squeue.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher.cli import app
from launcher.records.store import RunStore
from tests.test_slurm_status import RUN, fake_squeue, slurm_run

runner = CliRunner()


def _started_jobs(run_dir: str, *ids: str) -> None:
    """What Slurm leaves of each job that started: its batch output (``--output=…/batch-%j.out``)."""
    root = Path(run_dir) / "slurm"
    root.mkdir(parents=True, exist_ok=True)
    for job_id in ids:
        (root / f"batch-{job_id}.out").write_text("")


def test_a_resumed_run_names_its_earlier_jobs(tfl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_squeue(tmp_path, monkeypatch, "7|RUNNING|None|n[1-2]")
    record = slurm_run(RunStore(tfl_home))
    _started_jobs(record.run_dir, "5", "7", "3")  # attempts 0 and 1 in jobs 3 and 5; the run goes on in job 7
    (Path(record.run_dir) / "slurm" / "batch.out").write_text("")  # a run inside an allocation: no job id of its own
    one = runner.invoke(app, ["status", RUN])
    assert one.exit_code == 0, one.output
    assert "  slurm: job 7, state RUNNING, nodes n[1-2], earlier jobs 3 5\n" in one.stdout, one.stdout
    as_json = runner.invoke(app, ["status", RUN, "--json"])
    assert json.loads(as_json.stdout)["backend_state"]["earlier jobs"] == "3 5"


def test_a_run_of_one_job_names_no_earlier_ones(tfl_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_squeue(tmp_path, monkeypatch, "7|RUNNING|None|n[1-2]")
    record = slurm_run(RunStore(tfl_home))
    _started_jobs(record.run_dir, "7")
    one = runner.invoke(app, ["status", RUN])
    assert one.exit_code == 0, one.output
    assert "  slurm: job 7, state RUNNING, nodes n[1-2]\n" in one.stdout and "earlier" not in one.stdout, one.stdout
