"""``tfl doctor``: find the usual multi-host problems before a single task starts.

Per host, all hosts at once: reachable and authenticated (SSH hosts), python found,
tensorflow / tf_keras / keras versions (Keras 3 breaks under MultiWorkerMirroredStrategy,
so tf_keras and TF_USE_LEGACY_KERAS=1 are required), each task's port free, free disk in
the working dir, GPUs visible. The facts come from the agent's ``probe`` request (one
SSH exec per host; a local subprocess for local hosts); judging them is pure (``judge``).
``tfl launch`` runs the quick subset (reach, python, ports) on its SSH hosts first.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from launcher.errors import LaunchError
from launcher.plan import LaunchPlan
from launcher.remoteplan import SSHTarget
from launcher.sshconn import BOOTSTRAP, SSHError, agent_input, agent_request, connect, parallel, python_failure

MIN_FREE_GB, LOW_FREE_GB = 1.0, 5.0


@dataclass(frozen=True)
class Check:
    host: str
    name: str  # "ssh", "python", "packages", "port 23456", "disk", "gpus"
    status: str  # "ok" | "warn" | "fail"
    detail: str  # one line; for a failure it ends with the fix


@dataclass
class HostTasks:
    """What one host must offer: its python, working dir, and the ports of its tasks."""

    host: str
    python: str
    workdir: str | None
    target: SSHTarget | None  # None: a local host
    ports: list[tuple[str, int]] = field(default_factory=list)  # (task, port)
    legacy_keras: bool = True  # TF_USE_LEGACY_KERAS=1 in the tasks' environment


def host_tasks(plan: LaunchPlan, *, ssh_only: bool = False) -> list[HostTasks]:
    hosts: dict[str, HostTasks] = {}
    for t in plan.tasks:
        if ssh_only and t.backend != "ssh":
            continue
        target = SSHTarget.from_dict(t.ssh) if t.backend == "ssh" and t.ssh else None
        entry = hosts.setdefault(t.host, HostTasks(t.host, t.argv[0], t.cwd, target))
        entry.legacy_keras = entry.legacy_keras and t.env.get("TF_USE_LEGACY_KERAS", "").lower() in ("1", "true")
        if t.task.type != "evaluator":  # TensorFlow starts no server for the sidecar evaluator
            entry.ports.append((t.name, t.port))
    return list(hosts.values())


def probe_request(h: HostTasks, *, quick: bool = False) -> dict[str, Any]:
    return {"mode": "probe", "quick": quick, "ports": [p for _, p in h.ports], "workdir": h.workdir}


def probe(h: HostTasks, *, quick: bool = False) -> tuple[list[Check], dict[str, Any] | None]:
    """Reach the host and collect its facts; a failure to do so is a check of its own."""
    request = probe_request(h, quick=quick)
    checks: list[Check] = []
    try:
        if h.target is None:
            return checks, _probe_locally(h, request)
        started = time.monotonic()
        try:
            conn = connect(h.target)
        except SSHError as exc:
            return [Check(h.host, "ssh", "fail", exc.cause)], None
        checks.append(Check(h.host, "ssh", "ok", f"reached {h.target} in {time.monotonic() - started:.2f} s"))
        try:
            return checks, agent_request(conn, h.python, request)
        finally:
            conn.close()
    except SSHError as exc:
        return checks + [Check(h.host, "python", "fail", exc.cause)], None


def _probe_locally(h: HostTasks, request: dict[str, Any]) -> dict[str, Any]:
    try:
        out = subprocess.run([h.python, "-u", "-c", BOOTSTRAP], input=agent_input(request), capture_output=True, timeout=60)
    except FileNotFoundError:
        raise SSHError(h.host, python_failure(h.python, 127, b"no such file", h.host)) from None
    if out.returncode != 0:
        raise SSHError(h.host, python_failure(h.python, out.returncode, out.stderr, h.host))
    result: dict[str, Any] = json.loads(out.stdout.decode().splitlines()[-1])
    return result


def judge(h: HostTasks, facts: dict[str, Any], *, quick: bool = False) -> list[Check]:
    """Turn a host's facts into checks. Pure."""
    checks = [Check(h.host, "python", "ok", f"Python {facts['python']} ({facts['executable']})")]
    for task, port in h.ports:
        held = facts["ports"].get(str(port))
        checks.append(Check(h.host, f"port {port}", "ok", f"free for {task}") if held is None else Check(
            h.host, f"port {port}", "fail", f"port {port} of {task} is in use ({held}); "
                                            f"stop what holds it or give {task} another port in the cluster file"))
    if quick:
        return checks
    checks += [_keras(h, facts["packages"]), _disk(h.host, facts["disk"]), _gpus(h.host, facts["gpus"])]
    if facts["packages"].get("psutil") is None:
        checks.append(Check(h.host, "psutil", "warn", "psutil missing: `tfl status` shows no cpu/memory for tasks "
                                                       f"here; fix: {h.python} -m pip install psutil"))
    return checks


def _keras(h: HostTasks, packages: dict[str, str | None]) -> Check:
    tf, tf_keras, keras = packages.get("tensorflow"), packages.get("tf_keras"), packages.get("keras")
    pip = f"{h.python} -m pip install"
    if tf is None:
        return Check(h.host, "packages", "fail", f"tensorflow is not installed for {h.python}; fix: {pip} tensorflow")
    versions = f"tensorflow {tf}, tf_keras {tf_keras or '-'}, keras {keras or '-'}"
    tf_minor = ".".join(tf.split(".")[:2])
    keras3 = _version(tf) >= (2, 16) or _version(keras or "0") >= (3,)
    if keras3 and tf_keras is None:
        return Check(h.host, "packages", "fail", f"{versions}: Keras 3 would be used and it breaks under "
                                                 f"MultiWorkerMirroredStrategy; fix: {pip} 'tf_keras~={tf_minor}.0'")
    if keras3 and not h.legacy_keras:
        return Check(h.host, "packages", "fail", f"{versions}: tf_keras is installed but unused; fix: set "
                                                 "TF_USE_LEGACY_KERAS=1 in the tasks' environment")
    if tf_keras is not None and _version(tf_keras)[:2] != _version(tf)[:2]:
        return Check(h.host, "packages", "warn", f"{versions}: tf_keras should match tensorflow's version; "
                                                 f"fix: {pip} 'tf_keras~={tf_minor}.0'")
    return Check(h.host, "packages", "ok", versions + (" (tf_keras in use)" if keras3 else ""))


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _disk(host: str, disk: dict[str, Any]) -> Check:
    free, path = disk["free_gb"], disk["path"]
    if free < MIN_FREE_GB:
        return Check(host, "disk", "fail", f"only {free} GB free at {path}; free some space or point hosts.{host}.workdir elsewhere")
    status = "warn" if free < LOW_FREE_GB else "ok"
    return Check(host, "disk", status, f"{free} GB free at {path}" + (" (checkpoints may not fit)" if status == "warn" else ""))


def _gpus(host: str, gpus: list[str] | None) -> Check:
    if gpus is None:
        return Check(host, "gpus", "ok", "no nvidia-smi: tasks here train on CPU")
    if not gpus:
        return Check(host, "gpus", "warn", "nvidia-smi lists no GPU (driver not loaded?); tasks here would train on CPU")
    return Check(host, "gpus", "ok", f"{len(gpus)} visible: " + "; ".join(g.split(" (UUID")[0] for g in gpus))


def diagnose(plan: LaunchPlan, *, quick: bool = False, ssh_only: bool = False) -> list[Check]:
    """Every check of every host of the plan, all hosts at once, in host order."""
    def one(h: HostTasks) -> list[Check]:
        checks, facts = probe(h, quick=quick)
        return checks + (judge(h, facts, quick=quick) if facts is not None else [])

    results = parallel(one, host_tasks(plan, ssh_only=ssh_only))
    return [c for r in results for c in (r if isinstance(r, list) else [Check("?", "doctor", "fail", str(r))])]


def preflight_remote(plan: LaunchPlan) -> None:
    """``tfl launch``'s quick checks of its SSH hosts on connections of their own (``--detach``
    checks before it returns); raises with the first failure. A foreground launch makes the
    same checks through the agents it starts (``backends.ssh.prepare_hosts``)."""
    raise_failures(diagnose(plan, quick=True, ssh_only=True))


def raise_failures(checks: list[Check]) -> None:
    """A launch stops at the first failed check, saying how many more there are."""
    failures = [c for c in checks if c.status == "fail"]
    if failures:
        more = f" (and {len(failures) - 1} more problem(s); `tfl doctor --cluster FILE` lists them)" if len(failures) > 1 else ""
        raise LaunchError(f"{failures[0].host}: {failures[0].detail}{more}")


def render(checks: list[Check]) -> str:
    width = max((len(c.host) for c in checks), default=0)
    lines = [f"{c.host.ljust(width)}  {c.status.upper():4}  {c.name}: {c.detail}" for c in checks]
    failed = sorted({c.host for c in checks if c.status == "fail"})
    hosts = len({c.host for c in checks})
    lines.append(f"doctor: {len(failed)} of {hosts} host(s) have problems ({', '.join(failed)})" if failed
                 else f"doctor: all {hosts} host(s) ready")
    return "\n".join(lines)


def as_dicts(checks: list[Check]) -> list[dict[str, str]]:
    return [asdict(c) for c in checks]
