"""The checks people use, run by the suite (so by CI): ruff, mypy strict, the import contracts
of pyproject.toml (docs/architecture.md's layers), and the size limit of a module. A change
that breaks one fails here with the offending file, line or import named."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests import mypy_background
from tests.procs import pid_alive

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MAX_MODULE_LINES = 400


def _tool(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    exe = BIN / name if (BIN / name).exists() else shutil.which(name)
    if exe is None:
        pytest.fail(f"{name} is not installed in this environment; run `uv sync` (it is in the dev group)")
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff() -> None:
    done = _tool("ruff", "check", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_mypy_strict(pytestconfig: pytest.Config) -> None:
    """mypy's result from the run the session started in the background (tests/mypy_background.py),
    or, where none was started (``-k``, a marker expression), from mypy run here."""
    directory = mypy_background.result_dir(pytestconfig)
    if directory is None:
        done = _tool("mypy")
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        return
    result = mypy_background.wait_for_result(directory, timeout=600)
    assert result.returncode == 0, result.output[-6000:]
    reaped_at = (directory / "returncode").stat().st_mtime
    assert not pid_alive(result.pid) or psutil.Process(result.pid).create_time() > reaped_at, \
        f"the background mypy (pid {result.pid}) outlived its result"


def test_import_contracts() -> None:
    """The stages are layers (an import that climbs them fails here), each engine's node side is stdlib only,
    the job kit imports only the contract, engines only through their registry, no cycle."""
    done = _tool("lint-imports", "--no-cache")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and done.stdout.count("KEPT") >= 5, done.stdout[-2000:]
    assert "The stages are layers" in done.stdout, done.stdout[-2000:]


def test_no_module_of_the_launcher_is_over_the_size_limit() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in (ROOT / "launcher").rglob("*.py")}
    assert {p: n for p, n in sizes.items() if n > MAX_MODULE_LINES} == {}, f"split these (at most {MAX_MODULE_LINES} lines)"
