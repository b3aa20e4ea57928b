"""Typer's coercion of option and argument values, without pydantic where a value is plain.

typer 0.29 coerces every value but a flag's through a pydantic TypeAdapter it builds per
parameter on first use, for a parameter given or not: `tfl launch` built 18 of them, about
half the CPU of its parse, and its background launcher (``_supervise``) imported pydantic for
nothing else (docs/benchmarks.md §10, §18). A str, int, float or Path value in its plain form
(a list of such values too) is converted here as that adapter converts it; any other value, or
a number outside the option's range, goes to typer's own adapter, so every error stays typer's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args, get_origin

from typer._click import Context
from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer._param_types import coerce_cli_path
from typer.core import _TyperParameter
from typer.models import ParameterInfo

_PLAIN = (str, int, float, Path)
_DIGITS = frozenset("0123456789")


class _NotPlain(Exception):
    """A value this module leaves to typer's adapter."""


def plain_values(params: list[Any]) -> None:
    """Give each parameter of plain type (``plain_type``) the coercion below, before typer builds its adapter."""
    for param in params:
        if isinstance(param, _TyperParameter) and param._runtime_param is None and plain_type(param.type_descriptor):
            param._runtime_param = PlainParam(parameter_info=param.type_descriptor.parameter_info,
                                              annotation=param.type_descriptor.annotation)


def plain_type(descriptor: TypeDescriptor) -> bool:
    """str, int, float, Path or a list of one of them, with no parser, choices, clamp, file or path type of its own."""
    info = descriptor.parameter_info
    if info.parser is not None or info.clamp or info.path_type is not None or descriptor.file_annotation is not None:
        return False
    kind: Any = descriptor.annotation
    if get_origin(kind) is list:
        (kind,) = get_args(kind) or (None,)
    return kind in _PLAIN and not descriptor.is_choice


class PlainParam(RuntimeParam):
    """Plain values converted here; the others by typer's own adapter (built then, once)."""

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        annotation: Any = self.annotation
        try:
            if get_origin(annotation) is list:
                if not isinstance(value, (list, tuple)):
                    raise _NotPlain
                (kind,) = get_args(annotation)
                return [_leaf(kind, item, self.parameter_info, param, ctx) for item in value]
            return _leaf(annotation, value, self.parameter_info, param, ctx)
        except _NotPlain:
            typers = build_runtime_param(param.type_descriptor)
            param._runtime_param = typers
            return typers._coerce_value(value, param=param, ctx=ctx)


def _leaf(kind: Any, value: Any, info: ParameterInfo, param: _TyperParameter, ctx: Context) -> Any:
    if kind is str and isinstance(value, str):
        return value
    if kind is Path and (isinstance(value, Path) or (isinstance(value, str) and value)):
        # typer's adapter makes the Path (pydantic's Path(value)), then checks it with this same function
        return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
    if kind in (int, float):
        number = _number(kind, value)
        if (info.min is None or number >= info.min) and (info.max is None or number <= info.max):
            return number
    raise _NotPlain


def _number(kind: type, value: Any) -> Any:
    """An int or float as pydantic's lax mode makes it from a value in canonical form: -12, 0, 3.25."""
    if type(value) is kind:
        return value
    if kind is float and type(value) is int:
        return float(value)
    if isinstance(value, str):
        whole, dot, fraction = value.removeprefix("-").partition(".")
        canonical = (whole == "0" or (whole[:1] not in ("", "0") and set(whole) <= _DIGITS)) and (
            not dot or (kind is float and fraction != "" and set(fraction) <= _DIGITS))
        if canonical:
            return kind(value)
    raise _NotPlain
