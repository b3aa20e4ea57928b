"""``tfl doctor``: find the usual multi-host problems before a single task starts.

Every check of every host, all hosts at once: the backend that would run the cluster
gathers each host's facts, ``launcher.engines.preflight.judge`` turns them into checks (the same
judge ``tfl launch`` uses for its quick subset).
"""

from __future__ import annotations

from launcher.describe.hosts import RemoteOptions
from launcher.describe.spec import ClusterSpec
from launcher.engines import registry
from launcher.engines.preflight import Check, cluster_hosts


def doctor(spec: ClusterSpec, *, accept_new_host_keys: bool = False) -> list[Check]:
    options = RemoteOptions(ship_code=True, accept_new_host_keys=accept_new_host_keys)
    hosts = cluster_hosts(spec, options)
    backend = registry.get(registry.name_for((h.host, h.target is not None) for h in hosts))
    try:
        return backend.probe(hosts, quick=False)
    finally:
        backend.close()
