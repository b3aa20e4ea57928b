"""tfl's entry shim in a Kubernetes pod: set the pod's TF_CONFIG from its role and index, then run the job.

    python3 /etc/tfl/entry.py [--sidecar] -- python3 -u jobs/mnist.py --epochs 3

Standard library only: `tfl export k8s` ships this file in the manifest's ConfigMap, beside
``tf_config.json``, which holds the TF_CONFIG that tfl's own ``tf_config()`` built for index 0
of each role, with the pods' DNS names as hosts. The cluster part of a TF_CONFIG depends only
on the role, so the pod takes its role's and puts its own index in. The role comes from
``TFL_K8S_ROLE`` (the manifest fills it from JobSet's replicated-job label), the index from
``JOB_COMPLETION_INDEX`` (Kubernetes sets it in every pod of an Indexed Job).

A training task replaces this process with the job (``exec``): the pod's exit code is the
job's and signals reach the job directly. So the kubelet's SIGTERM (eviction, preemption,
deletion) is received by the job kit's own handler, which agrees on a step with the other
tasks, saves there and exits 170 (``PREEMPTED_EXIT_CODE`` of launcher/contract.py): the pod
fails with 170, which the manifest's failure policy retries without counting it (see
docs/kubernetes.md). ``--sidecar`` (the evaluator) runs the job as a child, passes SIGTERM
and SIGINT on to it, and exits 0 whatever it returns, as in a local run, where an
evaluator's failure is recorded but never stops training; a failed evaluator Job would make
JobSet restart the group. Told to go itself (SIGTERM: a drain, an eviction, a deletion), it
exits 143 once its job is gone: the pod fails, and its Job, whose podFailurePolicy ignores 143
and disruptions, makes it again without counting (an exit 0 would end the evaluator for good).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

ROLE_ENV = "TFL_K8S_ROLE"
INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes in each pod of an Indexed Job
CONFIG_FILE = "tf_config.json"
PREFIX = "tfl-entry:"


class EntryError(Exception):
    """The pod's environment or the shipped TF_CONFIG table is unusable."""


def role_and_index(env: Mapping[str, str], roles: Sequence[str]) -> tuple[str, int]:
    role, index = env.get(ROLE_ENV, ""), env.get(INDEX_ENV, "")
    if role not in roles:
        raise EntryError(f"{ROLE_ENV} is {role!r}; expected one of {', '.join(roles)} (the replicated job's name)")
    if not (index.isascii() and index.isdigit()):
        raise EntryError(f"{INDEX_ENV} is {index!r}; expected the pod's index (run the role as an Indexed Job)")
    return role, int(index)


def tf_config_for(table: Mapping[str, Any], role: str, index: int) -> str:
    """This pod's TF_CONFIG: its role's cluster, its own task; compact JSON, as tfl writes it."""
    cluster = table[role]["cluster"]
    if index >= len(cluster.get(role, ())):
        raise EntryError(f"{INDEX_ENV} is {index} but the {role} role has {len(cluster.get(role, ()))} task(s); "
                         "the manifest's parallelism and tf_config.json disagree: export the manifest again")
    config = {"cluster": cluster, "task": {"type": role, "index": index}}
    return json.dumps(config, separators=(",", ":"))


def task_env(env: Mapping[str, str], table: Mapping[str, Any]) -> dict[str, str]:
    """The job's environment: the pod's plus TF_CONFIG and tfl's task label."""
    role, index = role_and_index(env, tuple(table))
    return {**env, "TF_CONFIG": tf_config_for(table, role, index), "TFL_TASK": f"{role}:{index}"}


def run_sidecar(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Run the job as a child, passing on SIGTERM and SIGINT. 0 whatever the job returns; but
    128 + the signal when the pod was told to go (a drain, an eviction, a deletion), so that the
    pod fails and its Job makes it again (the manifest's podFailurePolicy ignores that exit)."""
    told: list[int] = []
    early: list[int] = []  # told while the job was being started: passed on once it has a pid
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: FrameType | None) -> None:
        told.append(signum)
        if child is None:
            early.append(signum)
        else:
            child.send_signal(signum)

    # Before the job starts: told between its start and these, this shim ended at once (as a container's
    # PID 1, the kernel dropped the signal instead), and the job was never told.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    child = subprocess.Popen(list(command), env=dict(env))
    for pending in early:
        child.send_signal(pending)
    code = child.wait()
    if told:
        print(f"{PREFIX} {env.get('TFL_TASK')} was told to stop ({signal.Signals(told[0]).name}); it exited with "
              f"{code}, and the pod leaves with {128 + told[0]} to be made again", file=sys.stderr, flush=True)
        return 128 + told[0]
    if code != 0:
        print(f"{PREFIX} {env.get('TFL_TASK')} exited with {code}; as in a local run, "
              "an evaluator's failure does not stop training", file=sys.stderr, flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args or args.index("--") == len(args) - 1:
        print(f"{PREFIX} usage: entry.py [--sidecar] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    options, command = args[:args.index("--")], args[args.index("--") + 1:]
    try:
        table = json.loads(Path(__file__).with_name(CONFIG_FILE).read_text())
        env = task_env(os.environ, table)
    except (OSError, ValueError, KeyError, EntryError) as exc:
        print(f"{PREFIX} {exc}", file=sys.stderr)
        return 2
    print(f"{PREFIX} {env['TFL_TASK']} TF_CONFIG={env['TF_CONFIG']}", file=sys.stderr, flush=True)
    if "--sidecar" in options:
        return run_sidecar(command, env)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"{PREFIX} cannot run {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
