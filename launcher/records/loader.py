"""Run records from their JSON: a small strict loader of plain dataclasses (``launcher.records.store``).

Every value is checked against its field's type (str, int, float, enums, lists, nested
records; a float field takes an int) and each error names the value's place
(``record.tasks[0].pid: expected int, got str``). The checks are compiled once per field type:
a record of 256 tasks holds thousands of values, and asking ``typing`` about each one's type was
most of `tfl status RUN`'s reading of it (docs/benchmarks.md §18).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from enum import Enum
from typing import Any, Callable, TypeVar

_T = TypeVar("_T")
_Convert = Callable[[object, str], Any]
_FIELDS: dict[type, dict[str, _Convert]] = {}
_CONVERTERS: dict[Any, _Convert] = {}


def _fields_of(kind: type) -> dict[str, _Convert]:
    if kind not in _FIELDS:
        _FIELDS[kind] = {key: _converter(hint) for key, hint in typing.get_type_hints(kind).items()}
    return _FIELDS[kind]


def load(kind: type[_T], data: object, where: str) -> _T:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object")
    fields = _fields_of(kind)
    if unknown := data.keys() - fields.keys():
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    values = {key: fields[key](value, f"{where}.{key}") for key, value in data.items()}
    try:
        return kind(**values)
    except TypeError as err:  # a required key is missing
        raise ValueError(f"{where}: {err}") from None


def _converter(hint: Any) -> _Convert:
    if hint not in _CONVERTERS:
        _CONVERTERS[hint] = _make_converter(hint)
    return _CONVERTERS[hint]


def _make_converter(hint: Any) -> _Convert:
    """What checks and converts a value of type ``hint`` (``where`` names it in the error)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType:  # X | None
        (inner,) = [_converter(a) for a in args if a is not type(None)]
        return lambda value, where: None if value is None else inner(value, where)
    if origin is list:
        item = _converter(args[0])

        def convert_list(value: object, where: str) -> list[Any]:
            if not isinstance(value, list):
                raise ValueError(f"{where}: expected a list")
            return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return convert_list
    if origin is dict:
        def convert_dict(value: object, where: str) -> Any:
            if not isinstance(value, dict):
                raise ValueError(f"{where}: expected an object")
            return value
        return convert_dict
    if dataclasses.is_dataclass(hint):
        return lambda value, where: load(hint, value, where)  # type: ignore[arg-type]
    if isinstance(hint, type) and issubclass(hint, Enum):
        return lambda value, where: hint(value)  # ValueError for an unknown state

    def convert_plain(value: object, where: str) -> Any:
        if hint in (str, int, float, bool) and type(value) is hint:
            return value
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        raise ValueError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}")
    return convert_plain
