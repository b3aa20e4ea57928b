"""A Ray address's host and port (stdlib only): the ``ray`` block and ``tfl resume --address`` check
the form, ``connect`` asks whether anything answers there. Apart from ``settings`` so that a ``tfl status`` with a
Ray run in its list imports no pydantic model."""

from __future__ import annotations

import re

HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})")  # past "ray://"


def endpoint(address: str) -> tuple[str, int] | None:
    """The host and port a valid Ray address names (the GCS or the Ray Client server); None for "auto"."""
    match = HOST_PORT.fullmatch(address.removeprefix("ray://"))
    return None if match is None else (match.group(1).strip("[]"), int(match.group(2)))


def address_problem(value: str) -> str | None:
    """Why ``value`` is not a Ray address tfl can connect to, or None."""
    if value == "auto":
        return None
    match = HOST_PORT.fullmatch(value.removeprefix("ray://"))
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        return (f"'{value}' is not a Ray address; write \"auto\" (the cluster this machine is part of), "
                "\"ray://HOST:10001\" (Ray Client) or \"HOST:6379\" (the head's GCS)")
    return None
