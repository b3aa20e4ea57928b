"""No tracked file keeps a merge's conflict markers (a merge resolved by hand once left them in docs/commands.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_tracked_file_holds_conflict_markers() -> None:
    found = subprocess.run(["git", "grep", "-n", "-I", "-E", r"^(<<<<<<<|>>>>>>>) |^=======$", "--", ".", ":!*.lock"],
                           cwd=ROOT, capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr  # 1: nothing found
    assert found.stdout == "", f"conflict markers left:\n{found.stdout[:2000]}"
