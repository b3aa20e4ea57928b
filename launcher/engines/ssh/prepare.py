"""Getting SSH hosts ready for a run, and tidy after it.

``prepare_hosts``: per host one connection and one agent started ahead, which makes the quick
checks, says where the host's per-user tfl dir is (``hosts.HOST_CACHE``), makes the run's private
dirs, unpacks the shipped code and the job kit, imports the kit the way a task will, and then
runs the host's tasks (``session``); with ``ssh.firewall``, a second session installs the run's
nftables table there and holds it. So a host costs one SSH session whatever its tasks (a login
shell and a python start there), and nothing is shipped to a host whose quick checks failed.

``cleanup_hosts``: when the run has ended, one agent request per host removes what the run
shipped there (``RemoteDirs.remove``), unless ``--keep-remote`` kept it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from launcher.engines.parallel import first_error, parallel
from launcher.engines.preflight import Check, HostTasks, host_tasks, judge, judge_setup, probe_request
from launcher.engines.ssh.failures import SSHError
from launcher.engines.ssh.wire import Payload, Tarballs, agent_request, cleanup_request, converse, kit_archive, streamed_archives
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch

if TYPE_CHECKING:
    from launcher.engines.ssh.firewall import Firewalls
    from launcher.engines.ssh.pool import HostPool


def prepare_hosts(plan: LaunchPlan, pool: HostPool, caches: dict[str, str], firewalls: Firewalls) -> list[Check]:
    """Reach every SSH host of the plan at once and get it ready: its checks, or the first
    failure to reach one raises. ``caches`` gets the per-user tfl dir of each host where the run's dirs
    were made (so ``close`` removes them there, also after a refusal that came later); a host
    with ``ssh.firewall`` gets the run's table (``firewall``) last, once all else passed.
    The code's tarballs are built once for the launch and sent to every host (``Tarballs``), from
    temp files that go when the hosts are ready."""
    tarballs = Tarballs()
    try:
        return _prepare_hosts(plan, pool, caches, firewalls, tarballs)
    finally:
        tarballs.close()


def _prepare_hosts(plan: LaunchPlan, pool: HostPool, caches: dict[str, str], firewalls: Firewalls,
                   tarballs: Tarballs) -> list[Check]:
    by_host = tasks_by_host(plan)  # once: a scan of every task per host cost hosts × tasks

    def reach(host: HostTasks) -> list[Check]:
        chan = pool.start_agent_ahead(by_host[host.host][0])
        facts = converse(chan, probe_request(host, quick=True), host.host, host.python)
        checks = judge(host, facts, quick=True)
        if _failed(checks):
            return checks
        cache = facts["tfl_cache"]
        request, payloads = unpack_request(by_host[host.host], cache, tarballs)
        done = converse(chan, request, host.host, host.python, payloads)
        if not done.get("dirs"):  # the run's dirs are made there and are ours: a refusal below still removes them
            caches[host.host] = cache
        if "error" in done:
            raise SSHError(host.host, f"could not unpack the code there ({done['error']}); check hosts.{host.host}.workdir "
                                      "and free disk there, or use --no-sync if the code is already on the host")
        checks += judge_setup(host, done)
        refused = None if _failed(checks) else firewalls.ensure(plan, host.host)  # before any task starts
        if refused is not None:
            checks.append(Check(host.host, "firewall", "fail", refused))
        return checks

    results = parallel(reach, host_tasks(plan))
    first_error(results)
    return [c for r in results if isinstance(r, list) for c in r]


def tasks_by_host(plan: LaunchPlan) -> dict[str, list[TaskLaunch]]:
    """host -> its tasks, in plan order."""
    hosts: dict[str, list[TaskLaunch]] = {}
    for task in plan.tasks:
        hosts.setdefault(task.host, []).append(task)
    return hosts


def unpack_request(host_tasks: list[TaskLaunch], cache: str, tarballs: Tarballs) -> tuple[dict[str, Any], list[Payload]]:
    """The run's dirs on the host of ``host_tasks`` (a configured workdir first, then the run dir,
    parents first), the code shipped there and the job kit; and the code's tarballs, which follow
    the request (``converse``), so that no job dir's size sits in memory."""
    tasks = [t.on_host(cache) for t in host_tasks]
    copies = sorted({copy for task in tasks for copy in task.sync})
    code, payloads = streamed_archives(copies, tarballs)
    dirs = tasks[0].dirs
    if dirs is None:  # a plan recorded by a tfl that shipped no kit
        return {"mode": "unpack", "archives": code}, payloads
    return {"mode": "unpack", "kit": dirs.kit, "archives": [*code, kit_archive(dirs.kit)],
            "dirs": [*({"path": p, "private": False, "role": "workdir"} for p in dirs.checked),
                     *({"path": p, "private": True, "role": "run dir"} for p in dirs.private)]}, payloads


def cleanup_hosts(plan: LaunchPlan, pool: HostPool, hosts: list[str]) -> None:
    """Remove what the run shipped to ``hosts`` (``plan`` on their real paths), all at once.
    Best effort: a host that cannot be reached now keeps its copy."""
    by_host = tasks_by_host(plan)

    def tidy(host: str) -> None:
        tasks = by_host[host]
        request = cleanup_request(tasks)
        if request is not None and tasks[0].ssh is not None:
            agent_request(pool.get(tasks[0].ssh), tasks[0].python, request, timeout=30.0)

    parallel(tidy, hosts)


def _failed(checks: list[Check]) -> bool:
    return any(c.status == "fail" for c in checks)
