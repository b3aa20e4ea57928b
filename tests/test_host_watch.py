"""HostWatch on its own: fake tasks, a fake probe and clock (the bed tests show it for real)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from launcher.engines.ssh.backend import ping_every, pings_due
from launcher.engines.ssh.watch import SILENT_AFTER, HostWatch


@dataclass
class FakeTask:
    host: str
    heard: float
    heard_wall: float
    port: int = 22
    lost: list[tuple[str, float]] = field(default_factory=list)

    def running(self) -> bool:
        return not self.lost

    def declare_lost(self, cause: str, since: float) -> None:
        self.lost.append((cause, since))


def settle() -> None:
    for thread in [t for t in threading.enumerate() if t.name.startswith("probe-")]:
        thread.join(5)


def test_a_silent_task_whose_host_does_not_answer_loses_every_task_of_that_host_only() -> None:
    now = [100.0]
    asked: list[str] = []
    woken = threading.Event()
    watch = HostWatch(woken.set, probe=lambda host, port: asked.append(host) or host != "b", clock=lambda: now[0],
                      wall=lambda: 5000.0)
    a, b1, b2 = FakeTask("a", 100.0, 4990.0), FakeTask("b", 100.0, 4993.0), FakeTask("b", 99.0, 4994.0)
    watch.check([a, b1, b2])
    settle()
    assert asked == [] and not b1.lost  # nobody silent yet
    now[0] = 100.0 + SILENT_AFTER + 0.5
    a.heard = now[0]
    watch.check([a, b1, b2])
    settle()
    assert asked == ["b"] and woken.is_set() and not a.lost
    (cause, since), = b1.lost
    assert b2.lost == [(cause, since)] and since == 4994.0  # the host's last word, from any of its tasks
    assert cause.startswith("host b unreachable since ") and "(no answer for 6 s" in cause
    assert watch.lost("b") is not None and watch.lost("a") is None


def test_a_host_that_answers_is_not_lost_and_not_asked_again_at_once() -> None:
    now = [100.0]
    asked: list[str] = []
    watch = HostWatch(lambda: None, probe=lambda host, port: asked.append(host) or True, clock=lambda: now[0])
    task = FakeTask("a", 90.0, time.time())
    watch.check([task])
    settle()
    watch.check([task])
    settle()
    assert asked == ["a"] and not task.lost
    now[0] += SILENT_AFTER
    watch.check([task])
    settle()
    assert asked == ["a", "a"] and watch.lost("a") is None


def test_a_connection_closed_without_an_exit_is_confirmed_against_the_host() -> None:
    up = {"a": True, "b": False}
    watch = HostWatch(lambda: None, probe=lambda host, port: up[host])
    a, b = FakeTask("a", 0.0, 10.0), FakeTask("b", 0.0, 20.0)
    watch.confirm(a)
    watch.confirm(b)
    assert not a.lost and b.lost and b.lost[0][1] == 20.0


@dataclass
class PingedTask:
    ping_every: float
    ping_due: float = 0.0
    sent: list[float] = field(default_factory=list)


def test_the_launcher_pings_each_agent_four_times_per_fence_and_every_2_s_at_most() -> None:
    """The pinger's ticks (``watch.CHECK_EVERY``, 1 s) over a minute: an agent whose fence is 5 s is
    pinged every 2 s, as always; a longer fence less often, yet at least three times per fence."""
    tasks = {fence: PingedTask(ping_every(fence)) for fence in (5.0, 10.0, 30.0)}
    for tick in range(61):
        for task in pings_due(list(tasks.values()), float(tick)):
            task.sent.append(float(tick))
    for fence, task in tasks.items():
        gaps = {b - a for a, b in zip(task.sent, task.sent[1:], strict=False)}
        assert min(gaps) >= 2.0 and max(gaps) <= max(2.0, fence / 3), (fence, task.sent)
    assert [len(t.sent) for t in tasks.values()] == [31, 21, 8]  # every 2 s would be 31 each


def test_an_agent_pings_within_the_watch_s_silence_and_the_channel_s_timeout() -> None:
    """The agents' pings are an idle launcher's main cost, so they come seldom (every 3.3 s at the
    users' 5 s of silence, not every 2 s), yet a live agent is never taken for silent: a ping may be
    a third of the silence late before its host is even asked, and the channel's 30 s timeout sees
    several. The run request carries the interval to the agent."""
    from launcher.engines.ssh.backend import HEARTBEAT_TIMEOUT, SSHBackend, agent_ping_every
    from launcher.plan.launch_plan import TaskLaunch
    from launcher.tasks import TaskId

    assert agent_ping_every(5.0) == 5.0 / 1.5 and agent_ping_every(3.0) == 2.0  # the users' watch; the test beds'
    assert agent_ping_every(SILENT_AFTER) * 1.5 <= SILENT_AFTER and agent_ping_every(60.0) == HEARTBEAT_TIMEOUT / 4
    launch = TaskLaunch(task=TaskId.parse("worker:0"), host="h", port=2222, argv=("python", "job.py"), env={}, cwd="/w",
                        log_path="/l", progress_path="/p")
    assert SSHBackend._request(launch, 0)["ping_every"] == agent_ping_every()
