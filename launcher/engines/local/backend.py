"""Tasks as local processes, each the leader of its own session and process group, with the
run's private temp dir as their TMPDIR (removed with the run: ``close``, ``tfl stop``, ``tfl rm``)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, Callable

import psutil

from launcher.console import say
from launcher.contract import RUN_DIR, RUN_ID
from launcher.engines.base import Cleanup, Stopped, TaskLive, TaskProcess
from launcher.engines.local.netns import PrivateNetwork, resolve_network
from launcher.engines.preflight import Check, HostTasks, diagnose, host_tasks, probe_request
from launcher.engines.ssh.node import agent_tmp
from launcher.engines.teardown import teardown
from launcher.errors import LaunchError
from launcher.files import open_private
from launcher.plan.launch_plan import LaunchPlan, TaskLaunch
from launcher.records import identity
from launcher.records.states import TaskState
from launcher.records.store import RunRecord
from launcher.tasklog import attempt_banner

# At the run's end, what its tasks left outside their process groups gets SIGTERM, this long, then SIGKILL.
LEFTOVER_GRACE = 2.0


class Leader:
    """A task's process, which leads its process group, kept *unreaped* after it exits until
    its group is empty: a pid is not reused while its zombie exists, so neither is the
    group's number, and ``killpg`` can never reach an unrelated group that took it over
    (pids wrap around at pid_max, 32768 by default). Exit codes are read with ``WNOWAIT``."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    @property
    def reaped(self) -> bool:
        return self.popen.returncode is not None

    def exit_code(self) -> int | None:
        """Its exit code (negative: killed by that signal) once it has exited, else None."""
        if self.popen.returncode is not None:
            return self.popen.returncode
        try:
            info = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped behind our back (never by tfl): Popen knows the code
            return self.popen.wait()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def reap(self) -> None:
        self.popen.wait()


class LocalBackend:
    name = "local"
    concurrent_start = False

    def __init__(self, notify: Callable[[], None] = lambda: None) -> None:
        self._notify = notify
        self._kits: set[str] = set()  # job kit copies made for this run (tasks under another python than tfl's)
        self._network: PrivateNetwork | None = None  # the run's namespace (``--network private``/auto)
        self._marker: tuple[str, str | None] | None = None  # the run's TFL_RUN_ID and TFL_RUN_DIR, once a task started
        self._attempt: int | None = None  # the attempt of the last task started
        self._tmp: dict[str | None, str] = {}  # the run's private temp dir, by the parent it was made in
        self._run_id = ""

    # --- before a run -------------------------------------------------------------------
    def probe(self, hosts: Sequence[HostTasks], *, quick: bool) -> list[Check]:
        return diagnose(hosts, lambda h: ([], self._facts(h, quick)), quick=quick)

    def prepare(self, plan: LaunchPlan) -> list[Check]:
        checks = self.probe(host_tasks(plan), quick=True)
        if plan.network != "private":  # ``auto`` may yet run on this machine's network (``resolve``)
            return checks
        # In the run's own namespace (or no run: ``resolve`` refuses) what holds a port here is no conflict.
        return [c for c in checks if not c.name.startswith("port ")]

    def resolve(self, plan: LaunchPlan) -> LaunchPlan:
        """Every path is this machine's already; the network is made here (``netns``), and the
        run's private temp dir (each task's TMPDIR: what a SIGKILLed task leaves goes with the run)."""
        plan, self._network = resolve_network(plan, say)
        try:
            return self._private_tmp(plan)
        except BaseException:
            self.close()
            raise

    def _private_tmp(self, plan: LaunchPlan) -> LaunchPlan:
        self._run_id, tasks = plan.run_id, []
        for launch in plan.tasks:
            parent = agent_tmp.parent_of(launch.env, plan.run_id)
            if parent not in self._tmp:
                try:
                    self._tmp[parent] = agent_tmp.make(plan.run_id, parent)
                except OSError as exc:
                    given = f"TMPDIR in env or hosts.{launch.host}.env" if parent else "the TMPDIR you run tfl with"
                    raise LaunchError(f"{launch.name}: cannot make the run's private temp dir in "
                                      f"{parent or tempfile.gettempdir()}: {exc.strerror or exc} (fix {given})") from None
            tasks.append(dataclasses.replace(launch, env=agent_tmp.with_tmp(launch.env, self._tmp[parent])))
        return dataclasses.replace(plan, tasks=tuple(tasks))

    @staticmethod
    def _facts(h: HostTasks, quick: bool) -> dict[str, Any] | None:
        """The agent's own probe: in this process for the quick checks (no python to start),
        under the host's python for the full ones (its packages are what counts). The agent is
        the one place host facts are gathered, whatever the backend."""
        from launcher.engines.ssh.node import agent
        from launcher.engines.ssh.wire import BOOTSTRAP, MARK, agent_input, kit_data, python_failure, reply

        if quick:
            facts = agent.probe(probe_request(h, quick=True))
            facts["executable"] = shutil.which(h.python) or h.python
            # found as the tasks' Popen will look them up: a launch is refused before its run exists
            facts["found"] = {"python": _runnable(h.python, h.workdir, os.environ.get("PATH")),
                              "workdir": not h.workdir or os.path.isdir(h.workdir)}
            for port, held in facts["ports"].items():
                if held is not None:
                    facts["ports"][port] = held + _port_owner(int(port))
            return facts
        request = probe_request(h)
        if h.python != sys.executable:  # its tasks get the kit on their path: does it import there?
            request["kit"] = kit_data()
        try:
            out = subprocess.run([h.python, "-u", "-c", BOOTSTRAP], input=agent_input(request),
                                 capture_output=True, timeout=60)
        except (FileNotFoundError, PermissionError):
            raise LaunchError(f"{h.host}: {python_failure(h.python, 127, b'no such file', h.host)}") from None
        if out.returncode != 0 or MARK not in out.stdout:  # exit 0 without the answer: not a python
            raise LaunchError(f"{h.host}: {python_failure(h.python, out.returncode, out.stderr, h.host)}")
        result: dict[str, Any] = reply(out.stdout)
        result["found"] = {"workdir": not h.workdir or os.path.isdir(h.workdir)}  # as the quick checks: launch refuses it
        return result

    # --- a live run ---------------------------------------------------------------------
    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        env = {**os.environ, **launch.env, "TFL_ATTEMPT": str(attempt)}
        if self._attempt is not None and attempt != self._attempt:
            # the first task of the next attempt: the last one's tasks are all torn down, so what carries
            # the marker now is what they left, which would meet this attempt (its ports, its files)
            self._end_leftovers(f" before attempt {attempt}")
        self._attempt = attempt
        if RUN_ID in launch.env:
            self._marker = (launch.env[RUN_ID], launch.env.get(RUN_DIR))
        if launch.cwd and not os.path.isdir(launch.cwd):
            raise LaunchError(f"{launch.name}: working directory {launch.cwd} does not exist (fix hosts.{launch.host}.workdir)")
        if launch.kit is not None and launch.kit not in self._kits:
            self._copy_kit(launch.kit)
        if self._network and not _runnable(launch.argv[0], launch.cwd, env.get("PATH")):
            # nsenter would start and fail to exec it: a task failure in the log instead of this one line
            raise LaunchError(f"{launch.name}: cannot run {launch.argv[0]}: No such file or directory "
                              f"(fix hosts.{launch.host}.python or install it)")
        with open_private(launch.log_path) as log:
            if attempt:
                log.write(attempt_banner(launch.name, attempt).encode())
                log.flush()
            try:
                popen = subprocess.Popen(
                    self._network.enter(launch.argv) if self._network else launch.argv, env=env, cwd=launch.cwd,
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
            except OSError as exc:
                raise LaunchError(f"{launch.name}: cannot run {launch.argv[0]}: {exc.strerror} "
                                  f"(fix hosts.{launch.host}.python or install it)") from None
        try:
            create_time: float | None = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            create_time = None  # already gone; poll() will report its exit code
        proc = TaskProcess(launch=launch, attempt=attempt, pid=popen.pid, create_time=create_time, pgid=popen.pid,
                           handle=Leader(popen), start_ticks=identity.start_ticks(popen.pid))
        threading.Thread(target=self._wait, args=(popen.pid,), name=f"wait-{launch.name}", daemon=True).start()
        return proc

    def _copy_kit(self, kit: str) -> None:
        """The job kit (at this launcher's version) where the plan put it on the task's PYTHONPATH,
        as an SSH host gets it: another python may not have tfl installed."""
        from launcher.engines.ssh.node.agent_files import extract
        from launcher.engines.ssh.wire import kit_archive

        try:
            extract([kit_archive(kit)])  # the agent's own unpacking, as for an SSH host's kit
        except OSError as exc:
            raise LaunchError(f"cannot copy the job kit to {kit}: {exc.strerror or exc}") from None
        self._kits.add(kit)

    def _wait(self, pid: int) -> None:
        # Exit is an event: the supervisor wakes at once instead of waiting for its next poll.
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # WNOWAIT: see Leader
        except ChildProcessError:
            pass
        self._notify()

    def poll(self, proc: TaskProcess) -> int | None:
        leader: Leader = proc.handle
        return leader.exit_code()

    def signal(self, proc: TaskProcess, signum: int) -> None:
        leader: Leader = proc.handle
        if leader.reaped or proc.pid is None:
            return  # its group was empty when it was reaped, and the number may be another's by now
        try:
            os.killpg(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already

    def alive(self, proc: TaskProcess) -> bool:
        leader: Leader = proc.handle
        if leader.exit_code() is None:
            return True
        if leader.reaped or proc.pid is None:
            return False
        if identity.group_members(proc.pid, leader=proc.pid):
            return True  # the leader exited, a child it started lives on in the group
        leader.reap()  # the group is empty: only now may its number go
        return False

    def close(self) -> None:
        self._end_leftovers()
        if self._network is not None:
            self._network.close()
        tmp, self._tmp = self._tmp, {}
        for parent in tmp:  # the tasks' groups and leftovers are gone: nothing writes there any more
            agent_tmp.remove(self._run_id, parent)

    def _end_leftovers(self, when: str = "") -> None:
        """A process a task started in a session or process group of its own (a daemon's double
        fork and setsid) outlives the task's group: found by the run's marker, as ``tfl stop``
        finds it, and ended with its attempt (``start``) or the run. Once per marker: ``close``
        may be called again."""
        marker, self._marker = self._marker, None
        if marker is None:
            return
        left = identity.marked_processes(marker[0], {}, marker[1])
        if left:
            say(f"tfl: ending {len(left)} process(es) the tasks left outside their process groups "
                 f"(pid {', '.join(str(p.pid) for p in left)}){when}")
            teardown(left, signal=identity.signal_group, alive=identity.is_running, grace=LEFTOVER_GRACE, kill_wait=5.0)

    # --- a recorded run -----------------------------------------------------------------
    def inspect(self, record: RunRecord, *, ask: bool) -> dict[str, TaskLive]:
        if identity.launcher_identity(record).elsewhere:
            return {}  # its tasks ran on the launcher's machine: only there can they be seen
        found = {t.task: identity.task_identity(record, t).find() for t in record.tasks}
        if ask:  # cpu % is measured over an interval: prime every process, then read
            for proc in found.values():
                identity.cpu_percent(proc)
            time.sleep(0.1)
        live = {}
        for task in record.tasks:
            proc = found[task.task]
            gone = task.state == TaskState.RUNNING and proc is None  # recorded as running, vanished
            live[task.task] = TaskLive(
                alive=proc is not None, state="gone" if gone else None,
                cpu_percent=identity.cpu_percent(proc) if ask and proc else None, rss_mb=identity.rss_mb(proc),
                uptime_s=round(time.time() - task.create_time, 1) if proc and task.create_time else None)
        return live

    def stop_recorded(self, record: RunRecord, grace: float) -> Stopped:
        """Every process of the run: the recorded tasks (pid and create time) and anything
        carrying its ``TFL_RUN_ID`` marker, by process group."""
        known = {p.pid: p for t in record.tasks if (p := identity.task_identity(record, t).find())}
        found = identity.marked_processes(record.run_id, known, record.run_dir)
        teardown(found, signal=identity.signal_group, alive=identity.is_running, grace=grace, kill_wait=5.0)
        _remove_recorded_tmp(record)  # its launcher, killed with -9, could not
        return Stopped(len(found))

    def clean_recorded(self, record: RunRecord) -> Cleanup:
        _remove_recorded_tmp(record)  # left only where no stop followed a launcher killed with -9
        return Cleanup()  # the run's other files all lie in its run dir, which the run store removes


def _remove_recorded_tmp(record: RunRecord) -> None:
    """Remove the run's private temp dirs on this machine (where the recorded plan's TMPDIRs lie)."""
    if identity.launcher_identity(record).elsewhere:
        return  # made on the launcher's machine: only there can they be removed
    envs = [t.get("env") or {} for t in (record.plan or {}).get("tasks") or []]
    for parent in {agent_tmp.parent_of(env, record.run_id) for env in envs if agent_tmp.VARS[0] in env}:  # none: older
        agent_tmp.remove(record.run_id, parent)


def _port_owner(port: int) -> str:
    try:
        for conn in psutil.net_connections("tcp"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                return f", by pid {conn.pid} ({psutil.Process(conn.pid).name()})"
    except (psutil.Error, OSError):
        pass
    return ""


def _runnable(program: str, cwd: str | None, path: str | None) -> bool:
    """Whether exec would find ``program`` as the task's Popen looks it up (a relative path from its cwd)."""
    if "/" in program:
        full = os.path.join(cwd or ".", program)
        return os.path.isfile(full) and os.access(full, os.X_OK)
    return shutil.which(program, path=path) is not None
