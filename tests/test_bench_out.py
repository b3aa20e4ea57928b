"""Where `python -m bench` writes its report: docs/benchmarks.md for a full run, but a quick run
(a few repetitions, a stand-in job: docs/development.md's smoke run) without --out prints it, and
never replaces the full report's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

import bench.__main__ as bench_main
from bench.common import Section


def _one_section(*_: object) -> list[Section]:
    return [Section(1, "CLI latency", "a target", ["what", "value"], [["it", "1.0 s"]], "met", headline="1.0 s")]


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The bench run as from a checkout at tmp_path whose docs/benchmarks.md holds a full report,
    its `cli` phase a stand-in (what is measured is not the subject here)."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "launcher").mkdir()  # the bench compiles the checkout's launcher/ first
    (tmp_path / "docs" / "benchmarks.md").write_text("the full report\n")
    monkeypatch.setattr(bench_main, "ROOT", tmp_path)
    monkeypatch.setitem(bench_main.RUNNERS, "cli", _one_section)
    return tmp_path


def test_a_quick_run_without_out_prints_its_report_and_leaves_the_full_one(
    checkout: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_main.main(["--quick", "--only", "cli"]) == 0
    assert (checkout / "docs" / "benchmarks.md").read_text() == "the full report\n"
    out, err = capsys.readouterr()
    assert out.startswith("# tfl benchmarks\n") and "Quick mode" in out and "| it | 1.0 s |" in out
    assert "printed the quick report" in err


def test_a_quick_run_writes_where_out_says_and_a_full_run_to_the_docs(checkout: Path, tmp_path: Path) -> None:
    assert bench_main.main(["--quick", "--only", "cli", "--out", str(tmp_path / "b.md")]) == 0
    assert "Quick mode" in (tmp_path / "b.md").read_text()
    assert bench_main.main(["--only", "cli"]) == 0
    assert "| it | 1.0 s |" in (checkout / "docs" / "benchmarks.md").read_text()
