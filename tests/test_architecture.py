"""The checks people use, run by the suite (so by CI): ruff, mypy strict, the import contracts
of pyproject.toml (docs/architecture.md's layers), and the size limit of a module. A change
that breaks one fails here with the offending file, line or import named."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_mypy_strict() -> None:
    done = _tool("mypy")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


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
