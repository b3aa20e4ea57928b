"""The Ray test cluster leaves nothing in the temp dir, also when a process starts a second one.

Ray writes a session's spill dir (``object_spilling_config``) into the ``_system_config`` dict a head
is given. That dict was the module-level ``TEST_SYSTEM_CONFIG``, so the next cluster of the same
process (another Ray test module on the same pytest worker, test_ray_cluster_gone's own cluster)
took the first one's session dir, long removed, for its spill dir: its head's check of the spill
storage and its nodes' removal made that dir again, and an empty
``/tmp/tfl-ray-XXXX/t/session_…`` was left after the suite, every Ray process proven gone.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests.ray_cluster import ENV, TEST_SYSTEM_CONFIG, made_again, start_ray_cluster, stop_ray_cluster

pytestmark = pytest.mark.ray


def test_a_second_cluster_leaves_the_first_ones_dir_removed() -> None:
    saved, config = dict(os.environ), dict(TEST_SYSTEM_CONFIG)
    os.environ.update(ENV)  # before Ray is imported, as the ray_cluster fixture does
    roots: list[str] = []
    try:
        if os.environ.get("CI") != "true":
            pytest.importorskip("ray")
        for _ in range(2):
            found = start_ray_cluster(nodes=1, system_config=TEST_SYSTEM_CONFIG)  # the head alone
            roots.append(found.root)
            assert stop_ray_cluster(found) == []
        back = [root for root in roots if os.path.exists(root)]
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
        os.environ.clear()
        os.environ.update(saved)
    assert back == [], f"dirs of stopped clusters made again: {back}"
    assert TEST_SYSTEM_CONFIG == config, TEST_SYSTEM_CONFIG
    assert made_again() == []
