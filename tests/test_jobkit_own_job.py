"""docs/jobkit.md's "Your own job": the kit's shared options need nothing a job without data
files cannot give, say their defaults, and the page's job, as printed there, trains under
`tfl launch --local 2` with the chief alone writing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.jobkit import job_arguments
from tests.conftest import ROOT

JOBKIT_PAGE = ROOT / "docs" / "jobkit.md"


def own_job_snippet() -> str:
    section = JOBKIT_PAGE.read_text(encoding="utf-8").split("## Your own job", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return str(code)


def test_the_shared_options_need_no_data_help_and_say_their_defaults() -> None:
    parser = job_arguments("a job that makes its own data", batch_size=32)  # no data_help: the page's job gives none
    assert parser.parse_args([]).batch_size == 32
    undocumented = [action.option_strings[0] for action in parser._actions
                    if action.option_strings != ["-h", "--help"] and "default" not in (action.help or "")]
    assert undocumented == []


@pytest.mark.slow
def test_the_pages_own_job_trains_and_only_the_chief_writes(tmp_path: Path, child_env: dict[str, str], tfl_home: Path) -> None:
    job = tmp_path / "myjob.py"  # outside the repository, as a user's would be
    job.write_text(own_job_snippet(), encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "launcher", "launch", str(job), "--local", "2", "--",
                             "--epochs", "2", "--steps-per-epoch", "10"],
                            env=child_env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = list((tfl_home / "runs").iterdir())
    for task in ("chief-0", "worker-0"):
        assert re.search(r"^epoch 2/2 loss=", (run / "logs" / f"{task}.log").read_text(), re.M), task
    model = run / "model"
    assert sorted(p.name for p in (model / "checkpoints").glob("*.index")) == ["ckpt-1.index", "ckpt-2.index"]
    assert (model / "training_done.json").exists()
    assert not any((run / "scratch").rglob("*"))  # the worker wrote to a scratch dir, removed at the end
