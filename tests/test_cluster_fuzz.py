"""Property-based fuzzing of the cluster file (issue 13).

Whatever the file holds, ``tfl validate FILE`` and ``tfl launch JOB --cluster FILE --dry-run``
never print a traceback; a refusal is exit 2 with exactly one stderr line that names the
file and a field (or the file's own problem) and says what to do; a file one command accepts
the other accepts too, and its plan could really be spawned (env names and values that
``execve`` takes).

Inputs: valid cluster files mutated a few times (any field replaced by random JSON, text
edited with the characters that broke validation before, keys added or dropped), arbitrary
JSON, and arbitrary bytes. The CLI runs in-process through typer's CliRunner.
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import pytest
import typer.main
import typer.testing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from launcher.cli import app
from launcher.describe.spec import load_cluster
from launcher.plan.build import build_plan
from tests.conftest import ROOT

JOB = str(ROOT / "jobs" / "mnist.py")
BASES: list[dict[str, Any]] = [
    {"cluster": {"chief": ["localhost:23456"], "worker": ["127.0.0.1:23457"], "evaluator": ["[::1]:23458"]},
     "env": {"A": "1"}, "hosts": {"localhost": {"python": "/usr/bin/python3", "workdir": "/tmp", "env": {"B_2": "x=y"}}}},
    {"cluster": {"chief": ["gpu1:2222"], "worker": ["gpu2.example.com:2222", "[fe80::1%eth0]:2223"]},
     "ssh": {"user": "me", "port": 22, "identity_file": "~/.ssh/id_ed25519", "connect_timeout": 5, "known_hosts": "/k"},
     "hosts": {"gpu1": {"ssh": {"port": 2200, "user": "first.last"}, "gpus": 2, "share_gpus": False, "gpu_memory_limit_mb": 1000},
               "gpu2.example.com": {"gpus": [0, 1], "env": {"PATH": "/opt/bin"}}},
     "devices": {"chief:0": {"gpus": [0, 1]}, "worker:0": {"gpus": 2, "gpu_memory_limit_mb": 500}}},
]
# The characters that got through before, or that a one-line message must escape.
NASTY = ["\n", "\r", "\x00", "\t", " ", "=", ":", "+", "-", "%", "[", "]", "\\", '"', "٣", "２", "²", "\u2028", "\ud800", "é", "0"]
FIX_WORDS = re.compile(r"\b(should|must|write|give|use|remove|add|save|keep|expected|move|lower|set|list|check|leave|fix)\b")
FILE_PROBLEMS = ("not valid JSON", "is not UTF-8 text", "nests objects/lists", "appears twice", "the file must hold")
FIELDS = ("cluster", "env", "hosts", "ssh", "devices")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

runner = CliRunner()
COMMAND = typer.main.get_command(app)


def invoke(args: list[str]) -> Result:
    """``runner.invoke(app, args)`` with the click command built once: typer's CliRunner builds it
    from the app again on every call: about 0.04 s of an example's 0.05 s of CPU, for hundreds of
    examples. It is what ``tfl``'s entry point builds from the app (typer's ``get_command``)."""
    with mock.patch.object(typer.testing, "_get_command", lambda _: COMMAND):
        return runner.invoke(app, args)


json_leaf = (st.none() | st.booleans() | st.integers() | st.integers(-3, 70000) | st.floats()
             | st.text(max_size=12) | st.sampled_from(NASTY))
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                          max_leaves=12)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One file, rewritten for every example (hypothesis takes no function-scoped fixture)."""
    yield tmp_path_factory.mktemp("fuzz")


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in the document, containers included."""
    found = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            found += paths(value, (*prefix, index))
    return found


def get(doc: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def put(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    get(doc, path[:-1])[path[-1]] = value
    return doc


def mutate(data: st.DataObject, doc: Any) -> Any:
    """One change somewhere below the top (a whole new document is test_arbitrary_json's)."""
    path = data.draw(st.sampled_from(paths(doc)[1:]))
    target = get(doc, path)
    kind = data.draw(st.sampled_from(["replace", "edit", "edit", "add_key", "drop"]))
    if kind == "edit" and isinstance(target, str):
        at = data.draw(st.integers(0, len(target)))
        char = data.draw(st.sampled_from(NASTY) | st.characters())
        return put(doc, path, target[:at] + char + target[at:])
    if kind == "edit" and isinstance(target, int) and not isinstance(target, bool):
        return put(doc, path, data.draw(st.sampled_from([-1, 0, 1, 65535, 65536, 2**63, 10**30, True, 1.5, str(target), None])))
    if kind == "add_key" and isinstance(target, dict):
        key = data.draw(st.sampled_from([*FIELDS, "python", "gpus", "port", "user", "chief:0", "localhost"]) | st.text(max_size=6))
        target[key] = data.draw(json_value)
        return doc
    if kind == "drop":
        parent = get(doc, path[:-1])
        del parent[path[-1]]
        return doc
    return put(doc, path, data.draw(json_value))


def encode(data: st.DataObject, doc: Any) -> bytes:
    text = json.dumps(doc, ensure_ascii=data.draw(st.booleans()))
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate becomes bytes that are not UTF-8


def check(file: Path) -> str:
    """The property, for one file on disk; returns the outcome (for --hypothesis-show-statistics)."""
    results = [invoke(["validate", str(file)]), invoke(["launch", JOB, "--cluster", str(file), "--dry-run"])]
    for result in results:
        assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
        assert "Traceback" not in result.output
        assert result.exit_code in (0, 2), result.output
        if result.exit_code == 2:
            assert_one_line_refusal(result.stderr, file)
    assert results[0].exit_code == results[1].exit_code, [r.output[-500:] for r in results]
    if results[0].exit_code == 0:
        assert_spawnable(file)
    return "accepted" if results[0].exit_code == 0 else "refused: " + results[0].stderr.split(": ", 3)[3][:60]


def assert_one_line_refusal(stderr: str, file: Path) -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1 and stderr.endswith("\n"), stderr
    prefix = f"tfl: error: {file}: "
    assert lines[0].startswith(prefix), lines[0]
    reason = lines[0][len(prefix):]
    named = reason.startswith(FIELDS) or any(p in reason for p in FILE_PROBLEMS) or ": unknown key;" in reason
    assert named, reason
    assert FIX_WORDS.search(reason), reason


def assert_spawnable(file: Path) -> None:
    plan = build_plan(load_cluster(file), JOB, (), run_id="r", run_dir="/r", python=sys.executable, cwd="/")
    for task in plan.tasks:
        for key, value in task.env.items():
            assert ENV_NAME.fullmatch(key) and "\x00" not in value, (key, value)
            os.fsencode(value)  # what execve gets
        assert all(arg and "\x00" not in arg for arg in task.argv)


def fuzz(examples: int) -> Any:
    """``examples`` (times TFL_FUZZ_SCALE, e.g. 20 for a long hunt; the inner loop, ``-m "not slow"``,
    runs a quarter of them: tests/conftest.py); repeatable under CI."""
    scale = float(os.environ.get("TFL_FUZZ_SCALE", "1"))
    return settings(max_examples=max(1, int(examples * scale)), deadline=None, database=None,
                    derandomize=bool(os.environ.get("CI")), suppress_health_check=[HealthCheck.too_slow])


def test_bases_are_valid(workdir: Path) -> None:
    for base in BASES:
        path = workdir / "base.json"
        path.write_text(json.dumps(base))
        assert invoke(["validate", str(path)]).exit_code == 0
        check(path)


@fuzz(120)
@given(data=st.data())
def test_mutated_cluster_files(workdir: Path, data: st.DataObject) -> None:
    doc = copy.deepcopy(data.draw(st.sampled_from(BASES)))
    for _ in range(data.draw(st.integers(1, 3))):
        doc = mutate(data, doc)
    path = workdir / "mutated.json"
    path.write_bytes(encode(data, doc))
    event(check(path))


@fuzz(40)
@given(data=st.data(), doc=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), json_value) | json_value)
def test_arbitrary_json(workdir: Path, data: st.DataObject, doc: Any) -> None:
    path = workdir / "arbitrary.json"
    path.write_bytes(encode(data, doc))
    event(check(path))


def damaged(blob: bytes, at: int, byte: int) -> bytes:
    at %= len(blob)
    return blob[:at] + bytes([byte]) + blob[at + 1:]


valid_bytes = st.sampled_from([json.dumps(b).encode() for b in BASES])
deep = st.builds(lambda n, kind: kind[:1] * n + kind[1:] * n, st.integers(0, 100_000), st.sampled_from([b"[]", b'{"a":}']))


@fuzz(50)
@given(blob=st.binary(max_size=300) | st.builds(damaged, valid_bytes, st.integers(0, 10_000), st.integers(0, 255)) | deep)
def test_arbitrary_bytes(workdir: Path, blob: bytes) -> None:
    path = workdir / "bytes.json"
    path.write_bytes(blob)
    event(check(path))


nasty_text = st.lists(st.sampled_from(NASTY) | st.characters() | st.sampled_from("aZ_9./~"), max_size=8).map("".join)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def utf8(text: str) -> bool:
    try:
        text.encode()
        return True
    except UnicodeEncodeError:
        return False


@fuzz(60)
@given(env=st.dictionaries(st.sampled_from(["A", "_X", "PATH", "B_2"]) | nasty_text, nasty_text, max_size=3),
       python=st.sampled_from(["/usr/bin/python3", "python3", "~/venv/bin/python", "/opt/py thon/é"]) | nasty_text,
       user=st.sampled_from(["me", "first.last", "a_b-c"]) | nasty_text)
def test_text_fields_follow_their_rule(workdir: Path, env: dict[str, str], python: str, user: str) -> None:
    """Accepted exactly when every env name, env value, path and user name keeps its rule."""
    doc = {"cluster": {"chief": ["gpu1:2222"]}, "env": env, "hosts": {"gpu1": {"python": python, "ssh": {"user": user}}}}
    path = workdir / "text.json"
    path.write_bytes(json.dumps(doc).encode())
    outcome = check(path)
    valid = (all(ENV_NAME.fullmatch(k) and not k.startswith("TFL_") and k != "TF_CONFIG" for k in env)
             and all("\x00" not in v and utf8(v) for v in env.values())
             and python != "" and not CONTROL.search(python) and utf8(python) and bool(USER.fullmatch(user)))
    assert (outcome == "accepted") == valid, (outcome, doc)
    event(outcome if valid else "refused")
