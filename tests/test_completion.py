"""Shell completion through typer's own mechanism: the script it shows, and run ids for RUN."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

TFL = Path(sys.executable).parent / "tfl"  # the console script a shell completes


@pytest.fixture
def runs(tfl_home: Path) -> dict[str, str]:
    for name in ("mnist-20261122-101500-ab12", "mnist-20261122-111500-cd34", "reuters-20261122-121500-ef56"):
        (tfl_home / "runs" / name).mkdir(parents=True)
    return {**os.environ, "TFL_HOME": str(tfl_home), "PATH": f"{TFL.parent}{os.pathsep}{os.environ['PATH']}"}


def complete(env: dict[str, str], shell: str, line: str) -> list[str]:
    """What tfl answers a shell asking to complete ``line`` (the protocol typer's scripts use)."""
    words = line.split(" ")
    extra = ({"COMP_WORDS": line, "COMP_CWORD": str(len(words) - 1)} if shell == "bash"
             else {"_TYPER_COMPLETE_ARGS": line})
    out = subprocess.run([sys.executable, "-m", "launcher"], env={**env, "_TFL_COMPLETE": f"complete_{shell}", **extra},
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line]


def test_run_ids_complete_for_status_logs_and_stop(runs: dict[str, str]) -> None:
    assert complete(runs, "bash", "tfl status mn") == ["mnist-20261122-101500-ab12", "mnist-20261122-111500-cd34"]
    assert complete(runs, "bash", "tfl status ") == sorted(os.listdir(Path(runs["TFL_HOME"]) / "runs"))
    assert complete(runs, "bash", "tfl status mnist-20261122-1015") == ["mnist-20261122-101500-ab12"]
    assert complete(runs, "bash", "tfl status mnist-20261122-101500-ab12 ") == []  # status takes one RUN
    assert complete(runs, "bash", "tfl logs re") == ["reuters-20261122-121500-ef56"]
    assert complete(runs, "bash", "tfl stop mnist-20261122-11") == ["mnist-20261122-111500-cd34"]
    assert complete(runs, "bash", "tfl status --a") == ["--all"]
    assert complete(runs, "bash", "tfl sta") == ["status"]
    zsh = complete(runs, "zsh", "tfl status re")
    assert len(zsh) == 1 and '"reuters-20261122-121500-ef56"' in zsh[0]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_the_shown_bash_script_completes_run_ids(runs: dict[str, str]) -> None:
    """`tfl --show-completion` (typer's, the shell detected) sourced in a real bash completes a run id."""
    script = ('eval "$(tfl --show-completion)"; COMP_WORDS=(tfl logs reu); COMP_CWORD=2; '
              '_tfl_completion tfl; printf "%s\\n" "${COMPREPLY[@]}"')
    out = subprocess.run(["bash", "-c", script], env=runs, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["reuters-20261122-121500-ef56"]


def test_install_completion_writes_the_shell_rc(runs: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "user-home"
    home.mkdir()
    out = subprocess.run(["bash", "-c", "tfl --install-completion"], env={**runs, "HOME": str(home)},
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "bash completion installed in" in out.stdout
    assert "tfl" in (home / ".bashrc").read_text()
    assert "_TFL_COMPLETE=complete_bash" in next((home / ".bash_completions").iterdir()).read_text()
