"""The kernel's neighbour table limits a large test bed needs, raised while it exists and restored.

The launcher reaches every host of a bed over the bridge, so the root namespace keeps one
neighbour (ARP) entry per host. Its default limits (``gc_thresh1/2/3`` = 128/512/1024) start
pruning entries at 128 and refuse new ones past 1024, shared with every other bed and
interface: a 256-host bed next to a few others would see ARP entries dropped under it.

Several beds may exist at once (test sessions, the bench): the values the machine had are
saved once, in a state file beside the beds' lock, with the beds holding them; each hold or
release sets the limits for the beds still held, and the last release restores the saved
values. A bed that vanished without releasing (a killed session) is dropped from the holders
the next time any bed holds or releases.
"""

from __future__ import annotations

import fcntl
import json
from pathlib import Path
from typing import Callable

STATE = Path("/run/lock/tfl-netbed-neigh.json")
KEYS = ("gc_thresh1", "gc_thresh2", "gc_thresh3")


def _path(key: str) -> Path:
    return Path("/proc/sys/net/ipv4/neigh/default") / key


def _read_state() -> dict[str, dict[str, int]]:
    try:
        data: dict[str, dict[str, int]] = json.loads(STATE.read_text())
        return data
    except (OSError, ValueError):
        return {"saved": {}, "holders": {}}


def needed(saved: dict[str, int], hosts: int) -> dict[str, int]:
    """The limits for ``hosts`` bed hosts on this machine: never below what it had."""
    return {"gc_thresh1": max(saved["gc_thresh1"], hosts + 128), "gc_thresh2": max(saved["gc_thresh2"], 2 * hosts + 512),
            "gc_thresh3": max(saved["gc_thresh3"], 4 * hosts + 1024)}


def _apply(state: dict[str, dict[str, int]]) -> None:
    if state["holders"]:
        values = needed(state["saved"], sum(state["holders"].values()))
        for key in KEYS:
            _path(key).write_text(f"{values[key]}\n")
        STATE.write_text(json.dumps(state))
        return
    for key in KEYS:
        if key in state["saved"]:
            _path(key).write_text(f"{state['saved'][key]}\n")
    STATE.unlink(missing_ok=True)


def hold(token: str, hosts: int, held_by: Callable[[str], bool]) -> None:
    """Raise the limits for one more bed (the caller holds the beds' lock). ``held_by(token)``:
    whether that bed still exists."""
    state = _read_state()
    if not state["saved"]:
        state["saved"] = {key: int(_path(key).read_text()) for key in KEYS}
    state["holders"] = {t: n for t, n in state["holders"].items() if held_by(t)}
    state["holders"][token] = hosts
    _apply(state)


def release(lock: Path, token: str) -> None:
    """The bed ``token`` is gone: lower the limits to the other beds' needs, or restore them."""
    if not STATE.exists():
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        state = _read_state()
        if token in state["holders"]:
            del state["holders"][token]
            _apply(state)


def holds(token: str) -> bool:
    return token in _read_state()["holders"]


def current() -> dict[str, int]:
    return {key: int(_path(key).read_text()) for key in KEYS}
