"""The network modes and public task addresses (pure): which mode a plan gets, which address is public,
and the one line `tfl doctor` and the launch give for it."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.describe.hosts import SSHTarget
from launcher.engines.preflight import HostTasks, judge
from launcher.errors import UsageError
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.plan.network import choose_network, public_address, public_warnings
from launcher.tasks import TaskId


def _plan(*hosts: str, ssh: bool = False) -> LaunchPlan:
    target = SSHTarget(host="h", port=22, user="u") if ssh else None
    tasks = tuple(TaskLaunch(task=TaskId("worker" if i else "chief", 0 if not i else i - 1), host=h, port=2222,
                             argv=("python", "-u", "job.py"), env={}, cwd=None, log_path="l", progress_path="p",
                             ssh=target) for i, h in enumerate(hosts))
    return LaunchPlan(run_id="r", run_dir="/d", job="job.py", job_args=(), tasks=tasks)


@pytest.mark.parametrize("address, public", [
    ("127.0.0.1", False), ("::1", False), ("10.1.2.3", False), ("172.16.0.9", False), ("192.168.1.5", False),
    ("100.64.3.4", False), ("169.254.1.1", False), ("fd12::1", False), ("fe80::1", False), ("localhost", False),
    ("gpu1.example", False), ("8.8.8.8", True), ("2001:4860::8888", True), ("[2001:4860::8888]", True),
])
def test_public_addresses(address: str, public: bool) -> None:
    assert public_address(address) is public


def test_modes_private_only_when_every_task_runs_here() -> None:
    assert choose_network(_plan("localhost", "localhost"), "auto").network == "auto"
    assert choose_network(_plan("localhost", "localhost"), "private").network == "private"
    assert choose_network(_plan("a", "b", ssh=True), "auto").network == "host"
    with pytest.raises(UsageError, match="firewall"):
        choose_network(_plan("a", "b", ssh=True), "private")
    with pytest.raises(UsageError, match="choose auto, private or host"):
        choose_network(_plan("localhost"), "open")


def test_plans_recorded_before_the_modes_read_as_host() -> None:
    plan = choose_network(_plan("localhost"), "private")
    assert LaunchPlan.from_dict(plan.to_dict()).network == "private"
    old = plan.to_dict()
    del old["network"]
    assert LaunchPlan.from_dict(old).network == "host"


def test_one_line_per_public_host_never_for_the_evaluator() -> None:
    plan = _plan("8.8.8.8", "8.8.8.8", "10.0.0.2", ssh=True)
    evaluator = dataclasses.replace(plan.tasks[0], task=TaskId("evaluator", 0), host="9.9.9.9")
    warnings = public_warnings(dataclasses.replace(plan, tasks=(*plan.tasks, evaluator)))
    assert len(warnings) == 1 and warnings[0].startswith("chief:0, worker:0 listen on public address 8.8.8.8")
    assert "firewall" in warnings[0] and "\n" not in warnings[0]


def test_doctor_warns_about_a_public_host() -> None:
    facts = {"python": "3.11.7", "executable": "/py", "ports": {"2222": None}}
    public = [c for c in judge(HostTasks("8.8.8.8", "/py", None, None, [("chief:0", 2222)]), facts, quick=True)
              if c.name == "network"]
    assert [c.status for c in public] == ["warn"] and "public address 8.8.8.8" in public[0].detail
    private = judge(HostTasks("10.0.0.2", "/py", None, None, [("chief:0", 2222)]), facts, quick=True)
    assert not [c for c in private if c.name == "network"]


def test_a_public_host_whose_ports_the_runs_firewall_fences_is_not_warned_about() -> None:
    """With ``"ssh": {"firewall": true}`` the warning asked for what the file already does (its fix: "firewall
    the ports (\\"ssh\\": {\\"firewall\\": true})"); only the hosts left open are named."""
    plan = _plan("8.8.8.8", "9.9.9.9", ssh=True)
    assert plan.tasks[0].ssh is not None
    fenced = dataclasses.replace(plan.tasks[0], ssh=dataclasses.replace(plan.tasks[0].ssh, firewall=True))
    warnings = public_warnings(dataclasses.replace(plan, tasks=(fenced, plan.tasks[1])))
    assert len(warnings) == 1 and warnings[0].startswith("worker:0 listens on public address 9.9.9.9"), warnings
    facts = {"python": "3.11.7", "executable": "/py", "ports": {"2222": None}}
    target = SSHTarget(host="8.8.8.8", port=22, user="u", firewall=True)
    checks = judge(HostTasks("8.8.8.8", "/py", None, target, [("chief:0", 2222)]), facts, quick=True)
    assert not [c for c in checks if c.name == "network"], checks


@dataclasses.dataclass(frozen=True)
class _Unit:
    kind: str

    def to_dict(self) -> dict[str, str]:
        return {}


@pytest.mark.parametrize("kind", ["slurm", "ray"])
def test_network_private_on_an_engine_unit_names_that_engine_not_the_ssh_firewall(kind: str) -> None:
    """A Slurm or Ray run was told to set ``"ssh": {"firewall": true}``: a field its description does not have."""
    plan = dataclasses.replace(_plan("node1", "node2"), unit=_Unit(kind))
    with pytest.raises(UsageError) as refused:
        choose_network(plan, "private")
    assert "ssh" not in str(refused.value) and f"a {kind.capitalize()} run's tasks" in str(refused.value), refused.value
    assert "leave --network out" in str(refused.value) and "docs/security.md" in str(refused.value)
    assert choose_network(plan, "auto").network == "host"


@pytest.mark.parametrize("backend, fenced, says", [
    ("local", False, "host (the task ports are open to this machine's networks; docs/security.md)"),
    ("ssh", False, "host (the task ports are open to the networks of the hosts they run on; docs/security.md)"),
    ("ssh", True, "host, fenced (the task ports admit only the run's hosts: ssh.firewall; docs/security.md)"),
])
def test_status_says_who_reaches_the_ports_of_a_run_on_other_hosts(backend: str, fenced: bool, says: str) -> None:
    """`tfl status` of every SSH run said its ports were open to *this machine's* networks: untrue of ports on
    other hosts, and of ports the run's firewall fences."""
    from launcher.records.states import RunState
    from launcher.supervise.recording import initial_record
    from launcher.views.report import run_detail
    from launcher.views.status import run_view

    plan = _plan("10.0.0.2", "10.0.0.3", ssh=backend == "ssh")
    if fenced:
        plan = dataclasses.replace(plan, tasks=tuple(dataclasses.replace(t, ssh=dataclasses.replace(t.ssh, firewall=True))
                                                     for t in plan.tasks if t.ssh is not None))
    record = initial_record(choose_network(plan, "auto" if plan.tasks[0].ssh else "host"), created=0.0, max_restarts=0,
                            backend=backend)
    record.state = RunState.SUCCEEDED
    view = run_view(record)
    assert view.network == "host"  # what --json gives: the mode
    assert f"  network: {says}\n" in run_detail(view) + "\n", run_detail(view)
