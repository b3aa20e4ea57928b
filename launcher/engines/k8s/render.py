"""Kubernetes objects as multi-document YAML. PyYAML is imported here, on first use only."""

from __future__ import annotations

from typing import Any


def render_yaml(documents: list[dict[str, Any]], header: str = "") -> str:
    """``---``-separated documents in the order given, keys in insertion order, multi-line
    strings (the shim's source) as literal blocks so that the manifest reads as written."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    _Dumper.add_representer(str, _str)
    body = yaml.dump_all(documents, Dumper=_Dumper, explicit_start=True, sort_keys=False, width=120)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + body
