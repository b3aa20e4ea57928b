"""Tasks as local processes, each the leader of its own session and process group."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from typing import Callable

import psutil

from launcher.backends.base import TaskProcess
from launcher.errors import LaunchError
from launcher.files import open_private
from launcher.plan import TaskLaunch


class LocalBackend:
    concurrent_start = False

    def __init__(self, notify: Callable[[], None] = lambda: None) -> None:
        self._notify = notify

    def start(self, launch: TaskLaunch, attempt: int) -> TaskProcess:
        env = {**os.environ, **launch.env, "TFL_ATTEMPT": str(attempt)}
        if launch.cwd and not os.path.isdir(launch.cwd):
            raise LaunchError(f"{launch.name}: working directory {launch.cwd} does not exist (fix hosts.{launch.host}.workdir)")
        with open_private(launch.log_path) as log:
            if attempt:
                log.write(f"--- tfl: attempt {attempt} of {launch.name} at {time.strftime('%H:%M:%S')} ---\n".encode())
                log.flush()
            try:
                popen = subprocess.Popen(
                    launch.argv, env=env, cwd=launch.cwd, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                )
            except OSError as exc:
                raise LaunchError(f"{launch.name}: cannot run {launch.argv[0]}: {exc.strerror} "
                                  f"(fix hosts.{launch.host}.python or install it)") from None
        try:
            create_time: float | None = psutil.Process(popen.pid).create_time()
        except psutil.Error:
            create_time = None  # already gone; poll() will report its exit code
        proc = TaskProcess(launch=launch, attempt=attempt, pid=popen.pid, create_time=create_time, pgid=popen.pid, handle=popen)
        threading.Thread(target=self._wait, args=(popen,), name=f"wait-{launch.name}", daemon=True).start()
        return proc

    def _wait(self, popen: subprocess.Popen[bytes]) -> None:
        # Exit is an event: the supervisor wakes at once instead of waiting for its next poll.
        popen.wait()
        self._notify()

    def poll(self, proc: TaskProcess) -> int | None:
        code: int | None = proc.handle.poll()
        return code

    def signal(self, proc: TaskProcess, signum: int) -> None:
        if proc.pgid is None:
            return
        try:
            os.killpg(proc.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # the whole group is gone already

    def alive(self, proc: TaskProcess) -> bool:
        if proc.handle.poll() is None:
            return True
        if proc.pgid is None:
            return False
        try:
            os.killpg(proc.pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def close(self) -> None:
        pass

