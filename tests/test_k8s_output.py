"""Where `tfl export k8s` puts the manifests: stdout, `-o FILE`, and `-o -` (stdout, as for kubectl)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from launcher.cli import app


def test_dash_output_prints_for_a_pipe_and_writes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tfl export k8s … -o - | kubectl apply -f -` wrote a file named '-' and left the pipe empty
    (kubectl: "no objects passed to apply"), then told the user to `kubectl apply -f -`."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["export", "k8s", "jobs/mnist.py", "--local", "2", "--image", "img:1",
                                      "--name", "m1", "-o", "-"])
    assert result.exit_code == 0, result.output
    assert [d["kind"] for d in yaml.safe_load_all(result.stdout)] == ["ConfigMap", "JobSet", "NetworkPolicy"]
    assert result.stderr == "" and list(tmp_path.iterdir()) == []


def test_a_file_named_dash_in_a_directory_is_still_a_file(tmp_path: Path) -> None:
    out = tmp_path / "-"
    result = CliRunner().invoke(app, ["export", "k8s", "jobs/mnist.py", "--local", "2", "--image", "img:1",
                                      "--name", "m1", "-o", str(out)])
    assert result.exit_code == 0 and result.stdout == "", result.output
    assert [d["kind"] for d in yaml.safe_load_all(out.read_text())] == ["ConfigMap", "JobSet", "NetworkPolicy"]
