"""Preflight checks: the facts a backend gathers about each host, judged in one place.

Per host: reachable and authenticated (SSH hosts), python found, the other training hosts' names
resolved (TF_CONFIG holds them), tensorflow / tf_keras / keras versions (Keras 3 breaks under
MultiWorkerMirroredStrategy, so tf_keras and TF_USE_LEGACY_KERAS=1 are required), each task's
port free, free disk in the working dir,
GPUs visible; on SSH hosts also the shipped job kit imported by the host's python, the
run's private dirs (``judge_setup``), and the cluster's shared storage seen by every host
(``judge_storage``). Backends gather the facts (``Backend.probe`` / ``Backend.prepare``, with the
agent's ``probe`` request, on the host itself); ``judge`` turns them into checks, the same
for ``tfl doctor`` and for ``tfl launch`` (foreground or ``--detach``), which makes the
quick subset (python, ports, names).
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.contract import LEGACY_KERAS
from launcher.describe.hosts import RemoteOptions, SSHTarget, host_plan
from launcher.errors import LaunchError
from launcher.plan.launch_plan import LaunchPlan
from launcher.plan.network import public_address, public_warning

if TYPE_CHECKING:
    from launcher.describe.spec import ClusterSpec

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
    target: SSHTarget | None  # None: this machine
    ports: list[tuple[str, int]] = field(default_factory=list)  # (task, port)
    legacy_keras: bool = True  # TF_USE_LEGACY_KERAS=1 in the tasks' environment
    storage: str | None = None  # the cluster's shared storage (``tfl doctor`` proves it shared)
    chief: bool = False  # the chief (else worker:0) runs here
    peers: list[str] = field(default_factory=list)  # the other training hosts' names (no IP literal): its tasks dial them


def _with_peers(hosts: list[HostTasks]) -> list[HostTasks]:
    """Each training host's ``peers``: the names of the other training hosts, as TF_CONFIG holds them,
    which its tasks must resolve (an ssh config's ``Host`` alias reaches a host over SSH, not from the others)."""
    names = [h.host for h in hosts if h.ports and not _is_address(h.host)]
    for h in hosts:
        h.peers = [n for n in names if n != h.host] if h.ports else []
    return hosts


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def host_tasks(plan: LaunchPlan) -> list[HostTasks]:
    """What each host of a plan must offer, in host order."""
    hosts: dict[str, HostTasks] = {}
    for t in plan.tasks:
        entry = hosts.setdefault(t.host, HostTasks(t.host, t.python, t.cwd, t.ssh))
        entry.legacy_keras = entry.legacy_keras and t.env.get(LEGACY_KERAS, "").lower() in ("1", "true")
        if t.task.is_training:  # TensorFlow starts no server for the sidecar evaluator
            entry.ports.append((t.name, t.port))
    return _with_peers(list(hosts.values()))


def cluster_hosts(spec: ClusterSpec, options: RemoteOptions) -> list[HostTasks]:
    """What each host of a cluster file must offer, before any run exists (``tfl doctor``)."""
    hosts: dict[str, HostTasks] = {}
    for task in spec.cluster.tasks():
        address = spec.cluster.address(task)
        if address.host not in hosts:
            plan = host_plan(spec, address.host, run_id=None, run_dir="", python=sys.executable, cwd=str(Path.cwd()),
                             options=options)
            hosts[address.host] = HostTasks(address.host, plan.python, plan.workdir, plan.ssh,
                                            storage=spec.storage.path if spec.storage else None, chief=not hosts)
        if task.is_training:
            hosts[address.host].ports.append((str(task), address.port))
    return _with_peers(list(hosts.values()))


Gather = Callable[[HostTasks], "tuple[list[Check], dict[str, Any] | None]"]


def diagnose(hosts: Sequence[HostTasks], gather: Gather, *, quick: bool = False) -> list[Check]:
    """Every check of every host, all hosts at once, in host order. ``gather`` reaches one
    host and returns its facts (None when it could not), with checks of its own (reach)."""
    from launcher.engines.parallel import parallel

    def one(h: HostTasks) -> list[Check]:
        checks, facts = gather(h)
        return checks + (judge(h, facts, quick=quick) if facts is not None else [])

    results = parallel(one, list(hosts))
    return [c for h, r in zip(hosts, results, strict=True)
            for c in (r if isinstance(r, list) else [Check(h.host, "preflight", "fail", str(r))])]


def probe_request(h: HostTasks, *, quick: bool = False) -> dict[str, Any]:
    return {"mode": "probe", "quick": quick, "ports": [p for _, p in h.ports], "ipv6": ":" in h.host, "workdir": h.workdir,
            "names": h.peers, "firewall": not quick and h.target is not None and h.target.firewall}


def judge(h: HostTasks, facts: dict[str, Any], *, quick: bool = False) -> list[Check]:
    """Turn a host's facts into checks. Pure."""
    found = facts.get("found", {})
    checks = [Check(h.host, "python", "ok", f"Python {facts['python']} ({facts['executable']})") if found.get("python", True)
              else Check(h.host, "python", "fail", f"python {h.python!r} not found (no such file); set "
                                                   f"hosts.{h.host}.python to a python that has tensorflow")]
    if not found.get("workdir", True):
        checks.append(Check(h.host, "working dir", "fail", f"working dir {h.workdir} does not exist; fix: set "
                                                           f"hosts.{h.host}.workdir to a directory there"))
    for task, port in h.ports:
        held = facts["ports"].get(str(port))
        checks.append(Check(h.host, f"port {port}", "ok", f"free for {task}") if held is None else Check(
            h.host, f"port {port}", "fail", f"port {port} of {task} is in use ({held}); "
                                            f"stop what holds it or give {task} another port in the cluster file"))
    unresolved = facts.get("unresolved") or {}
    if unresolved:
        named = ", ".join(f"{n} ({why})" for n, why in unresolved.items())
        checks.append(Check(h.host, "names", "fail", f"{h.host} cannot resolve {named}: its tasks reach the others by "
                                                     "the names in cluster (TF_CONFIG), and would wait for them forever; "
                                                     f"write those hosts' addresses in cluster, or make {h.host}'s DNS or "
                                                     "/etc/hosts know them"))
    if public_address(h.host) and h.ports and not (h.target is not None and h.target.firewall):  # fenced: its fix
        checks.append(Check(h.host, "network", "warn", public_warning(h.host, [task for task, _ in h.ports])))
    if "kit" in facts:
        checks.append(_kit(h, facts["kit"]))
    if quick:
        return checks + ([_keras(h, facts["packages"])] if "packages" in facts else [])
    checks += [_keras(h, facts["packages"]), _disk(h.host, facts["disk"]), _gpus(h.host, facts["gpus"])]
    if "firewall" in facts:
        checks.append(_firewall(h.host, facts["firewall"]))
    if facts["packages"].get("psutil") is None:
        checks.append(Check(h.host, "psutil", "warn", "psutil missing: `tfl status` shows no cpu/memory for tasks "
                                                       f"here; fix: {h.python} -m pip install psutil"))
    return checks


def _firewall(host: str, fence: dict[str, str]) -> Check:
    """``"ssh": {"firewall": true}``: the launch's refusal (``ssh/firewall.py``), in the same words, before it."""
    if "error" in fence:
        return Check(host, "firewall", "fail", f"cannot fence the task ports with nftables ({fence['error']}); "
                                               f"{fence['fix']}, or set ssh.firewall to false")
    return Check(host, "firewall", "ok", f"nft runs as {fence['as']}: the run's table can be installed")


def _keras(h: HostTasks, packages: dict[str, str | None]) -> Check:
    tf, tf_keras, keras = packages.get("tensorflow"), packages.get("tf_keras"), packages.get("keras")
    pip = f"{h.python} -m pip install"
    if tf is None:
        return Check(h.host, "packages", "fail", f"tensorflow is not installed for {h.python}; fix: {pip} tensorflow")
    versions = f"tensorflow {tf}, tf_keras {tf_keras or '-'}, keras {keras or '-'}"
    tf_minor = ".".join(tf.split(".")[:2])
    keras3 = _version(tf) >= (2, 16) or _version(keras or "0") >= (3,)
    if keras3 and tf_keras is None:
        return Check(h.host, "packages", "fail", f"{versions}: no tf_keras, so Keras 3 would be used and it breaks under "
                                                 f"MultiWorkerMirroredStrategy; fix: {pip} 'tf_keras~={tf_minor}.0'")
    if keras3 and not h.legacy_keras:
        return Check(h.host, "packages", "fail", f"{versions}: tf_keras is installed but unused; fix: set "
                                                 "TF_USE_LEGACY_KERAS=1 in the tasks' environment")
    if tf_keras is not None and _version(tf_keras)[:2] != _version(tf)[:2]:
        return Check(h.host, "packages", "warn", f"{versions}: tf_keras should match tensorflow's version; "
                                                 f"fix: {pip} 'tf_keras~={tf_minor}.0'")
    return Check(h.host, "packages", "ok", versions + (" (tf_keras in use)" if keras3 else ""))


KIT_PYTHON = (3, 10)  # the job kit's oldest Python (pyproject's requires-python)


def _kit(h: HostTasks, kit: dict[str, Any]) -> Check:
    old = "python" in kit and _version(kit["python"]) < KIT_PYTHON
    if kit.get("ok") and not old:
        return Check(h.host, "job kit", "ok", f"imports under {h.python} from the shipped copy")
    said = kit.get("error") or (f"Python {kit['python']} is older than 3.10" if old else
                                f"`launcher.jobkit` came from {kit.get('file')}, not from the shipped copy")
    return Check(h.host, "job kit", "fail", f"the shipped job kit does not import under {h.python} ({said}); "
                                            f"every task would fail at `from launcher import jobkit`: set hosts.{h.host}.python "
                                            "to a Python >= 3.10")


def judge_setup(h: HostTasks, answer: dict[str, Any]) -> list[Check]:
    """Checks of an ``unpack`` answer: the run's dirs there, the shipped kit, the packages."""
    checks = [_dir(h, path, problem) for path, problem in answer.get("dirs", {}).items()]
    if "kit" in answer:
        checks.append(_kit(h, answer["kit"]))
    if "packages" in answer:
        checks.append(_keras(h, answer["packages"]))
    return checks


def _dir(h: HostTasks, path: str, problem: dict[str, Any]) -> Check:
    what = "working dir" if problem.get("role") == "workdir" else "run dir"
    fix = (f"set hosts.{h.host}.workdir to a directory of your own" if what == "working dir" else
           f"remove it there (tfl makes it, private) or set XDG_CACHE_HOME for {h.host}'s login shell")
    if problem["problem"] == "symlink":
        why = f"is a symlink (to {problem['target']}); whoever can change the link can swap the code tfl ships"
    elif problem["problem"] == "owner":
        why = (f"belongs to {problem['user']}, not to {problem['me']} who runs the tasks; its owner could swap the "
               "code tfl ships")
    else:
        why = f"cannot be made ({problem['detail']})"
    return Check(h.host, what, "fail", f"{what} {path} {why}; fix: {fix}")


def judge_storage(hosts: Sequence[HostTasks], seen: dict[str, dict[str, Any]]) -> list[Check]:
    """Is the shared storage one and the same on every host? ``seen``: per host, its token
    write error or the tokens it found (the chief's host: every other's; the others: the chief's)."""
    storage = next((h.storage for h in hosts if h.storage), None)
    chief = next((h for h in hosts if h.chief), None)
    if storage is None or chief is None:
        if len(hosts) < 2:
            return []
        return [Check(hosts[0].host, "storage", "warn", "no shared storage named: a run with --max-restarts or an "
                                                        f"evaluator on another host than the chief is refused; add {STORAGE_EXAMPLE}")]
    if "://" in storage:
        return [Check(chief.host, "storage", "warn", f"{storage} is not checked: tfl proves only a directory shared "
                                                     "(TensorFlow itself reads URLs)")]
    checks = []
    for h in hosts:
        facts = seen.get(h.host, {})
        if "error" in facts:
            checks.append(Check(h.host, "storage", "fail", f"cannot write into {storage} ({facts['error']}); fix: mount "
                                                           f"the shared storage at {storage} on {h.host}"))
            continue
        missing = sorted(w for w, ok in facts.get("seen", {}).items() if not ok and "error" not in seen.get(w, {}))
        if missing:
            checks.append(Check(h.host, "storage", "fail", f"{storage} is not shared: {h.host} does not see the file "
                                f"{', '.join(missing)} wrote there; fix: mount the same shared directory at {storage} "
                                "on every host"))
        elif h.host in seen:
            checks.append(Check(h.host, "storage", "ok", f"{storage} shared with " + (
                "every other host" if h is chief else f"{chief.host} (the chief's host)")))
    return checks


STORAGE_EXAMPLE = '"storage": {"path": "/mnt/shared/tfl"} to the cluster file'


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
