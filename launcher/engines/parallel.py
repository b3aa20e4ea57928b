"""Run one function per host at once; results (or the exception) in order."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from launcher.errors import LaunchError, ResourceLimitError

T = TypeVar("T")
R = TypeVar("R")


def parallel(fn: Callable[[T], R], items: Iterable[T], workers: int = 32) -> list[R | Exception]:
    """``fn`` over ``items`` in threads (each host at once); a result or the exception, in order."""
    items = list(items)

    def call(item: T) -> R | Exception:
        try:
            return fn(item)
        except Exception as exc:  # reported per host by the caller
            return exc

    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(call, items))


def first_error(results: Iterable[object]) -> None:
    """Raise the first failure of a parallel run, mentioning how many hosts failed."""
    errors = [r for r in results if isinstance(r, Exception)]
    if not errors:
        return
    if own := [e for e in errors if isinstance(e, ResourceLimitError)]:
        raise own[0]  # the launcher's own limit, whichever host it met it on: no host to blame
    if not isinstance(errors[0], LaunchError):
        raise errors[0]
    if len(errors) > 1:
        raise LaunchError(f"{errors[0]} (and {len(errors) - 1} more host(s) failed; `tfl doctor` lists them all)")
    raise errors[0]
