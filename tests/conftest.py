from __future__ import annotations

import compileall
import os
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests import mypy_background
from tests.jobkit_helpers import fashion_shards  # noqa: F401  (session fixture: Fashion-MNIST as PNG in 3 TFRecord shards)
from tests.netbed import netbed  # noqa: F401  (a bed of hosts with networks of their own, per test)
from tests.procs import assert_none_left
from tests.ray_cluster import ray_cluster  # noqa: F401  (module fixture: a private five-node Ray cluster on loopback)
from tests.slurm_cluster import slurm_cluster  # noqa: F401  (session fixture: a private two-node Slurm cluster)
from tests.sshd import sshd  # noqa: F401  (session fixture: a real sshd on 127.0.0.2 and 127.0.0.3)

ROOT = Path(__file__).resolve().parent.parent


# pytest-xdist workers for `-n auto` (pyproject's addopts), per core, at most MAX_WORKERS. The inner
# loop's tests mostly wait (sshd, the netns bed, Slurm noticing a lost node, a grace period): two a
# core overlap their waits. The full suite adds the real-TensorFlow trainings, which compute: one
# more than the cores. Measured on the 2-core machine: docs/development.md#keeping-the-suite-fast.
WORKERS_PER_CORE_INNER = 2
MAX_WORKERS = 4  # the per-worker resources (ports, beds, Slurm job-id blocks, netns names) were checked up to here


def pytest_configure(config: pytest.Config) -> None:
    """The project's own modules compiled once, by the first process (the xdist workers find the
    ``.pyc`` there): where PYTHONDONTWRITEBYTECODE=1 is set, as on this team's machines, Python
    never writes them, and each of the suite's thousand-odd ``tfl`` processes compiled every
    launcher module it imports again (~0.2 s of CPU each; docs/development.md).

    The inner loop (``-m "not slow"``) fuzzes the cluster file with a quarter of the examples
    (tests/test_cluster_fuzz.py); the full suite, CI's, with all of them. TFL_FUZZ_SCALE set by
    hand wins.

    mypy strict starts here in the background when the run holds its test (tests/mypy_background.py)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started as a background job of a non-interactive shell (`cmd &` in a script, nohup), this
        # process and every child would ignore SIGINT, which no child can then trap or take: the
        # tests of Ctrl-C and of tfl's stop (SIGINT to a batch script) would hang. A handler here
        # becomes SIG_DFL in each child at exec.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        # Likewise under nohup, for SIGHUP: every launcher the tests start would keep ignoring it
        # (as tfl honours nohup), and test_sighup_without_nohup_still_stops_the_run fail. A handler
        # that does nothing keeps this process as nohup asked; each child starts with SIG_DFL.
        signal.signal(signal.SIGHUP, lambda signum, frame: None)
    if not hasattr(config, "workerinput"):
        mypy = Path(sys.executable).parent / "mypy"
        if mypy.exists() and mypy_background.wanted(config):
            mypy_background.start(config, mypy)
        for package in ("launcher", "jobs", "bench", "tests"):
            compileall.compile_dir(ROOT / package, quiet=1, workers=1)
    if "not slow" in (config.option.markexpr or ""):
        os.environ.setdefault("TFL_FUZZ_SCALE", "0.25")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Each xdist worker learns where the background mypy's result will be."""
    directory = mypy_background.result_dir(node.config)
    if directory is not None:
        node.workerinput[mypy_background.KEY] = str(directory)


def pytest_unconfigure(config: pytest.Config) -> None:
    mypy_background.stop(config)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: none (the tests run in this process, quick to start) when the command line names
    one test file, or tests of one file (`pytest tests/test_spec.py`); with ``-m "not slow"``
    two a core (4 on CI's 2 cores); otherwise one more than the cores (3); never over MAX_WORKERS."""
    files = {str(arg).split("::", 1)[0] for arg in config.args}
    if len(files) == 1 and os.path.isfile(next(iter(files))):
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # the CPUs we may use
    return workers(cores, inner_loop="not slow" in (config.option.markexpr or ""))


def workers(cores: int, inner_loop: bool) -> int:
    return min(MAX_WORKERS, cores * WORKERS_PER_CORE_INNER if inner_loop else cores + 1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The suite runs on several pytest-xdist workers (``-n auto --dist loadgroup``:
    pyproject's addopts), which share no fixture. The tests that share a module-scoped fixture (a Ray
    cluster, a Slurm cluster of the module's own, a training run whose outcome several tests
    read) go to one worker together, so it is made once: module scope says "costly, shared".
    Session-scoped fixtures (the loopback sshd, the Slurm cluster) are made once per worker
    that needs one; each picks free ports and a private dir, so several live side by side.

    The groups go first: each is long (minutes for a whole module), and one that started last
    would leave the other workers idle at the end. For the same reason the rest go longest kind
    first (``_expected_cost``), file order within a kind: the scheduler hands out tests in this
    order as workers free up, and the quick ones fill the end."""
    grouped = []
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for defs in fixtures.name2fixturedefs.values() for d in defs} if fixtures else set()
        if "module" in scopes:
            grouped.append(item)
    if getattr(config.option, "loadgroup", False):  # on an xdist worker (--dist loadgroup): the scheduler reads the ids
        for item in grouped:
            _in_group(item, item.nodeid.split("::", 1)[0])
    first = set(map(id, grouped))
    items[:] = grouped + sorted((item for item in items if id(item) not in first), key=_expected_cost)


LONG_FIXTURES = {"netbed", "slurm_cluster"}  # a bed of namespaces with sshds; a Slurm cluster (seconds to start, real failures)


def _expected_cost(item: pytest.Item) -> int:
    """A rank, longest first: real TensorFlow (``slow``), the netns bed and Slurm (real waits: a
    cut host, a lost node) together, so that trainings that compute and tests that wait share
    the workers; then the loopback sshd; the rest (most take well under a second); last
    test_mypy_strict, which only collects the result of the mypy the session started in the
    background (tests/mypy_background.py): the later it asks, the less it waits.
    Order only: a test's outcome never depends on it."""
    if item.name == "test_mypy_strict":
        return 3
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("slow") or item.get_closest_marker("slurm") or LONG_FIXTURES & fixtures:
        return 0
    if item.get_closest_marker("ssh") or "sshd" in fixtures:
        return 1
    return 2


def _in_group(item: pytest.Item, group: str) -> None:
    """What ``pytest.mark.xdist_group(group)`` would do: loadgroup's scheduler reads a test's
    group from the "@group" suffix of its id, which pytest-xdist 3.8 can no longer write under
    pytest 9.2's structured ids (pytest-dev/pytest-xdist#1386: the mark is silently ignored)."""
    if hasattr(item, "_id"):  # pytest >= 9.2
        item._id = type(item._id).parse(f"{item.nodeid}@{group}")
    else:
        item._nodeid = f"{item.nodeid}@{group}"


BED_WATCH = {"TFL_TEST_SILENT_AFTER": "3", "TFL_TEST_PROBE_TIMEOUT": "2"}


@pytest.fixture(autouse=True)
def _bed_watch(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the netns bed, the launchers the test starts watch their hosts with shorter waits
    (launcher/engines/ssh/watch.py): silence after 3 s instead of 5 (agents ping every 2 s), and
    2 s for the sshd port's answer instead of 4 (a bed host's kernel answers in milliseconds;
    a cut one never). A lost host is then named ~4 s sooner; what is asserted is unchanged.
    Autouse, so it is set before ``child_env`` copies ``os.environ``."""
    if "netbed" in request.fixturenames:
        for name, value in BED_WATCH.items():
            monkeypatch.setenv(name, value)


@pytest.fixture
def tfl_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private run store; afterwards, proof that no task of its runs is alive."""
    home = tmp_path / "tfl-home"
    monkeypatch.setenv("TFL_HOME", str(home))
    yield home
    assert_none_left(str(home))


@pytest.fixture
def tfl_cmd() -> list[str]:
    """Run the CLI as a real process (for signals and live output)."""
    return [sys.executable, "-m", "launcher"]


@pytest.fixture
def child_env(tfl_home: Path) -> dict[str, str]:
    return {**os.environ, "TFL_HOME": str(tfl_home)}
