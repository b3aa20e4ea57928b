"""Where a run's task ports can be reached from (pure): the ``--network`` modes and public addresses.

TensorFlow's server listens on every interface and runs what it is sent (docs/security.md).
``--network``:
- ``auto`` (default): private when every task runs on this machine and this machine can make
  a network namespace; else ``host``, said in one line;
- ``private``: the tasks in a network namespace of their own, or the launch is refused;
- ``host``: the tasks on this machine's network, as before tfl had modes.
The plan records the mode the run got (the local backend's ``resolve`` turns ``auto`` into
``private`` or ``host``), so ``tfl status RUN`` and ``tfl resume`` read it from the record.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from typing import TYPE_CHECKING

from launcher.errors import UsageError

if TYPE_CHECKING:
    from launcher.plan.launch_plan import LaunchPlan

MODES = ("auto", "private", "host")


def all_here(plan: LaunchPlan) -> bool:
    """Every task runs on this machine as a process tfl starts (no SSH host, no engine unit)."""
    return plan.unit is None and all(t.ssh is None for t in plan.tasks)


def choose_network(plan: LaunchPlan, requested: str) -> LaunchPlan:
    """The plan with the mode it asks for: ``private`` only when every task runs here."""
    if requested not in MODES:
        raise UsageError(f"--network {requested}: choose auto, private or host")
    if all_here(plan):
        return dataclasses.replace(plan, network=requested)
    if requested == "private" and plan.unit is not None:  # Slurm, Ray: the nodes' network, no ssh block
        raise UsageError(f"--network private needs every task on this machine (--local N, or hosts named localhost); "
                         f"a {plan.unit.kind.capitalize()} run's tasks use its nodes' network: leave --network out, and "
                         f"keep that network private (docs/security.md, \"Runs on other machines\")")
    if requested == "private":
        raise UsageError("--network private needs every task on this machine (--local N, or hosts named localhost); "
                         "for SSH hosts set \"ssh\": {\"firewall\": true} in the cluster file (docs/security.md)")
    return dataclasses.replace(plan, network="host")


def public_address(host: str) -> bool:
    """Whether a task address can be reached from the internet: anything but loopback,
    private (RFC 1918), shared (RFC 6598), link-local and unique-local addresses. A name is
    not resolved here: only what the cluster file spells is judged."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if address.is_loopback or address.is_link_local or address.is_private:
        return False
    return not (isinstance(address, ipaddress.IPv4Address) and address in ipaddress.ip_network("100.64.0.0/10"))


def public_warning(host: str, tasks: list[str]) -> str:
    """The one line ``tfl doctor`` and the launch preflight give for a public task address."""
    return (f"{', '.join(tasks)} listen{'s' if len(tasks) == 1 else ''} on public address {host}: TensorFlow runs "
            f"whatever reaches its port; put the hosts on a private network or firewall the ports "
            f"(\"ssh\": {{\"firewall\": true}}; docs/security.md)")


def public_warnings(plan: LaunchPlan) -> list[str]:
    """One line per host of the plan whose task address is public (``public_address``) and whose
    ports the run's firewall does not fence (``ssh.firewall``: the warning's own fix, applied)."""
    hosts: dict[str, list[str]] = {}
    for t in plan.tasks:
        fenced = t.ssh is not None and t.ssh.firewall
        if t.task.is_training and public_address(t.host) and not fenced:  # the evaluator starts no server
            hosts.setdefault(t.host, []).append(t.name)
    return [public_warning(host, tasks) for host, tasks in hosts.items()]
