"""RayBackend: a run's tasks as Ray actors, one per bundle of one placement group.

``prepare`` connects to the cluster and makes the placement group (ready, or one error);
``resolve`` makes one actor per bundle, has each bind a port on its node and fills every
task's host, port and TF_CONFIG into the plan that runs and is recorded. ``start`` asks the
task's actor to release its port and start the job script (TF_CONFIG in its environment);
a relay thread brings its output and progress to the task's files here. A new attempt of
the group (``--max-restarts``) first makes again the actors that died with their node, takes
new ports for every task and rebuilds their TF_CONFIG. Nothing here is Ray's
restart policy: actors never restart (``max_restarts=0``); the supervisor decides.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Sequence
from typing import Callable

from launcher import contract
from launcher.engines.base import Cleanup, Stopped, TaskLive, TaskProcess
from launcher.engines.preflight import Check, HostTasks
from launcher.engines.ray import recorded
from launcher.engines.ray.connect import LAUNCH_FIX, RECORDED_FIX, connect, disconnect, kit_dir, runtime_env
from launcher.engines.ray.group import CALL_TIMEOUT, RayGroup
from launcher.engines.ray.plan import RayUnit, with_addresses
from launcher.engines.ray.relay import Relay
from launcher.engines.teardown import teardown
from launcher.errors import LaunchError
from launcher.files import open_private
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.records.store import RunRecord
from launcher.tasklog import attempt_banner
from launcher.tasks import TaskId

GRACE = 10.0  # seconds a task gets to leave before SIGKILL when the group starts again on new ports


class RayBackend:
    name = "ray"
    concurrent_start = True  # each start is a round trip to an actor

    def __init__(self, notify: Callable[[], None] = lambda: None) -> None:
        self._notify = notify
        self._group: RayGroup | None = None
        self._plan: LaunchPlan | None = None
        self._attempt = 0
        self._lock = threading.Lock()
        self._relays: list[Relay] = []
        self._procs: dict[TaskId, TaskProcess] = {}  # each task's latest start
        self._ports_retried: set[int] = set()  # attempts whose ports were taken once already

    # --- before a run -------------------------------------------------------------------
    def probe(self, hosts: Sequence[HostTasks], *, quick: bool) -> list[Check]:
        return []  # Ray places the tasks: prepare asks the cluster itself (connect, placement group)

    def prepare(self, plan: LaunchPlan) -> list[Check]:
        unit = plan.unit
        assert isinstance(unit, RayUnit)
        kit = kit_dir()
        try:
            # a plan whose tasks have their nodes is a recorded run's (`tfl resume`)
            fix = RECORDED_FIX.format(run=plan.run_id) if unit.nodes else LAUNCH_FIX
            ray = connect(unit.address, runtime_env(unit.working_dir, kit), fix)
        finally:  # ray.init has uploaded it to the cluster: nothing stays here, even if this launcher is killed
            shutil.rmtree(kit, ignore_errors=True)
        self._group = RayGroup(ray, plan)
        self._group.create()
        return []

    def resolve(self, plan: LaunchPlan) -> LaunchPlan:
        group = self._need_group()
        group.plan = plan
        tasks = [t.task for t in plan.tasks]
        group.ensure_actors(tasks)
        self._plan = group.plan = with_addresses(plan, group.reserve(tasks))
        return self._plan

    def _need_group(self) -> RayGroup:
        if self._group is None:
            raise LaunchError("ray: the run's placement group is gone (the backend was closed)")
        return self._group

    # --- a live run ---------------------------------------------------------------------
    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        group = self._need_group()
        with self._lock:
            if attempt != self._attempt:
                self._new_attempt(group, attempt)
        previous = self._procs.get(launch.task)
        if previous is not None:  # the same actor starts it again: its last attempt's relay ends first
            previous.handle.finish()
        proc = self._start(group, launch.task, attempt, attempt_banner(launch.name, attempt) if attempt else "")
        self._procs[launch.task] = proc
        return proc

    def _start(self, group: RayGroup, task: TaskId, attempt: int, banner: str) -> TaskProcess:
        """Have the task's actor release its port and start the job; a relay follows it."""
        current = next(t for t in group.plan.tasks if t.task == task)
        ray, actor = group.ray, group.actors[task]
        env = {**current.env, contract.ATTEMPT: str(attempt)}
        if banner:
            with open_private(current.log_path) as log:
                log.write(banner.encode())
        try:
            started = ray.get(actor.start.remote(list(current.argv), env, attempt), timeout=CALL_TIMEOUT)
        except ray.exceptions.RayError as exc:
            raise LaunchError(f"{current.name}: its Ray actor could not start the job: {str(exc).strip().splitlines()[0]}") from None
        relay = Relay(ray, actor, current.log_path, current.progress_path, self._notify,
                      offset=int(started["offset"])).start(current.name)
        self._relays.append(relay)
        pid = int(started["pid"])
        return TaskProcess(launch=current, attempt=attempt, pid=pid, create_time=None, pgid=pid, handle=relay,
                           host=current.host)

    def _new_attempt(self, group: RayGroup, attempt: int) -> None:
        """Attempt ``attempt`` of the group (the supervisor restarts every task, the evaluator too):
        actors lost with their node made again, new ports on every node, TF_CONFIG rebuilt."""
        tasks = [t.task for t in group.plan.tasks]
        # An actor made on a lost node's bundle before Ray has declared the node dead is cancelled
        # once it does: make it again (its bundle is placed anew) until the group's timeout.
        deadline = time.monotonic() + group.unit.ready_timeout + CALL_TIMEOUT
        while True:
            group.ensure_actors(tasks)
            try:
                reported = group.reserve(tasks)
                break
            except LaunchError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
        group.plan = with_addresses(group.plan, reported)
        self._attempt = attempt

    def poll(self, proc: TaskProcess) -> int | None:
        relay: Relay = proc.handle
        if relay.address_in_use and proc.launch.task.is_training and proc.attempt not in self._ports_retried:
            self._ports_retried.add(proc.attempt)
            self._retry_ports(proc)
            return None
        if relay.exit_code is not None and relay.ended_by:
            proc.ended_by = relay.ended_by
        return relay.exit_code

    def _retry_ports(self, failed: TaskProcess) -> None:
        """A task's port was taken between its actor's release and TensorFlow's bind: the training
        group of this attempt starts again on new ports, once, and says so in every task's log."""
        group = self._need_group()
        procs = [p for p in self._procs.values() if p.attempt == failed.attempt and p.launch.task.is_training]
        teardown(procs, signal=self.signal, alive=self.alive, grace=GRACE, kill_wait=GRACE)
        for p in procs:
            p.handle.finish()
        training = [p.launch.task for p in procs]
        group.plan = with_addresses(group.plan, group.reserve(training))
        note = (f"--- tfl: port {failed.launch.port} of {failed.launch.name} on {failed.launch.host} was taken before "
                "TensorFlow bound it; the training group starts again on new ports (once) ---\n")
        for p in procs:
            fresh = self._start(group, p.launch.task, p.attempt, note)
            p.launch, p.handle, p.pid, p.pgid = fresh.launch, fresh.handle, fresh.pid, fresh.pgid

    def signal(self, proc: TaskProcess, signum: int) -> None:
        relay: Relay = proc.handle
        try:
            relay.ray.get(relay.actor.signal.remote(signum), timeout=CALL_TIMEOUT)
        except relay.ray.exceptions.RayError:
            pass  # the actor is gone, and its task with it

    def alive(self, proc: TaskProcess) -> bool:
        relay: Relay = proc.handle
        if relay.ended_by:  # its actor died: its process died with it (PR_SET_PDEATHSIG)
            return False
        try:
            return bool(relay.ray.get(relay.actor.alive.remote(), timeout=CALL_TIMEOUT))
        except relay.ray.exceptions.RayError:
            return False

    def close(self) -> None:
        for relay in self._relays:
            relay.stop()
        self._relays.clear()
        if self._group is not None:
            self._group.remove()
            self._group = None
        disconnect()

    # --- a recorded run -----------------------------------------------------------------
    def inspect(self, record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
        return recorded.inspect(record, ask=ask)

    def stop_recorded(self, record: RunRecord, grace: float) -> Stopped:
        return recorded.stop(record, grace)

    def clean_recorded(self, record: RunRecord) -> Cleanup:
        return recorded.clean(record)


