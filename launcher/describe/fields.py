"""One standard for every piece of text in a cluster file. Pure: no I/O.

Each kind of field has one rule, applied wherever that kind appears (top-level ``env`` and
``hosts.<h>.env``; ``python``/``workdir``/``identity_file``/``known_hosts``; hosts in
addresses and as ``hosts`` keys; ports), so a new field is checked by picking its type,
not by a new ad-hoc test:

- any text: valid Unicode (no lone surrogates: they cannot reach a process) and no NUL
  (C strings end there);
- env names: ``[A-Za-z_][A-Za-z0-9_]*``, the POSIX portable form, so no ``=`` (the
  separator of ``NAME=value``), no NUL, never empty; values: any text, NUL aside, and
  ``NAME=value`` within Linux's 128 KiB limit for one environment string;
- paths: non-empty, no control characters (NUL, newline, tab...), at most 4096 bytes;
- user names: ``[A-Za-z_][A-Za-z0-9_.-]*``, at most 64 characters (never an option);
- hosts: an IP address, or a hostname of letters, digits and inner hyphens whose last
  label is not all digits (``127.1`` would be read as an IP address);
- ports: ASCII digits ``1``..``65535`` with no sign, space or leading zero (refused, not
  normalized: the text goes verbatim into TF_CONFIG, so what validates is what runs).

Every pattern is matched in full (``fullmatch``: ``$`` would let a trailing newline
through). Messages quote the offending text with ``shown``, so they stay one line.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ValidationError

MAX_PATH_BYTES = 4096
MAX_ENV_NAME = 255
MAX_ENV_STRING = 131072  # Linux's MAX_ARG_STRLEN: the most bytes of one NAME=value a process can be given
MAX_ENV_VALUE_BYTES = MAX_ENV_STRING - 1 - MAX_ENV_NAME - 1  # NAME=value within MAX_ARG_STRLEN, NUL included
MAX_NESTING = 64  # a cluster file needs 5 levels; JSON's own limit is a RecursionError

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_SCOPE = re.compile(r"[A-Za-z0-9_.-]+")
_PORT = re.compile(r"[0-9]+")  # a str pattern's [0-9] is ASCII only, unlike \d and str.isdigit
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shown(text: str, limit: int = 60) -> str:
    """``text`` quoted for a one-line message: escapes for what is not printable, cut at ``limit``."""
    cut = text if len(text) <= limit else text[:limit] + "…"
    return "'" + "".join(c if c.isprintable() else _escape(c) for c in cut) + "'"


def one_line(text: str) -> str:
    """A message with whatever is not printable escaped (a newline would split it)."""
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    return repr(char)[1:-1]  # a newline becomes the two characters backslash and n


def check_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError(f"{shown(value)} contains a NUL character; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{shown(value)} contains a lone surrogate escape (\\ud800 to \\udfff), not a character; remove it") from None
    return value


def check_env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name) or len(name) > MAX_ENV_NAME:
        raise ValueError(f"{shown(name)} is not an environment variable name; use letters, digits and _, "
                         f"not starting with a digit, at most {MAX_ENV_NAME} characters (e.g. MY_SETTING)")
    return name


def check_env_value(value: str) -> str:
    check_text(value)
    size = len(value.encode("utf-8"))
    if size > MAX_ENV_VALUE_BYTES:
        raise ValueError(f"is {size} bytes; an environment value may have at most {MAX_ENV_VALUE_BYTES} "
                         "(pass large data in a file instead)")
    return value


def check_path(path: str) -> str:
    check_text(path)
    if not path:
        raise ValueError("is empty; give a path (or leave the key out for the default)")
    if _CONTROL.search(path):
        raise ValueError(f"{shown(path)} contains a control character (newline, tab...); remove it")
    if len(path.encode("utf-8")) > MAX_PATH_BYTES:
        raise ValueError(f"is longer than {MAX_PATH_BYTES} bytes; give a shorter path")
    return path


def check_user(user: str) -> str:
    if not _USER.fullmatch(user):
        raise ValueError(f"{shown(user)} is not a user name; use letters, digits, '_', '.' and '-', "
                         "not starting with '-' or a digit, at most 64 characters (or leave it out)")
    return user


def valid_host(host: str, bracketed: bool = False) -> bool:
    """An IP address (IPv6 only in brackets), or a hostname; never with a trailing newline."""
    address, _, scope = host.partition("%")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return not bracketed and not scope and valid_hostname(host)
    if scope and (ip.version != 6 or not _SCOPE.fullmatch(scope)):
        return False
    return bracketed == (ip.version == 6)


def valid_hostname(name: str) -> bool:
    labels = name.split(".")
    return (len(name) <= 253 and all(_LABEL.fullmatch(label) for label in labels)
            and not labels[-1].isdigit())  # "127.1" or "999" would be read as an IP address


def check_host(host: str) -> str:
    if not valid_host(host, bracketed=":" in host):
        raise ValueError(f"{shown(host)} is not a valid hostname or IP address{HOST_FIX}")
    return host


def split_jump(text: str) -> tuple[str | None, str, int | None]:
    """A jump host as ssh's ProxyJump writes one, ``[user@]host[:port]`` (``[v6]:port``, an
    ``ssh://`` prefix): (user or None, host, port or None). Raises ValueError with the fix."""
    fix = "write one bastion as '[user@]host[:port]', e.g. 'train@bastion.example.com:2222'"
    if "," in text:
        raise ValueError(f"{shown(text)} names a chain of jump hosts; tfl goes through one bastion: {fix}")
    rest = text.removeprefix("ssh://")
    user, at, rest = rest.rpartition("@")
    if at and not _USER.fullmatch(user):
        raise ValueError(f"{shown(text)}: {shown(user)} is not a user name; {fix}")
    match = re.fullmatch(r"\[(?P<v6>[^\]]+)\](?::(?P<p1>[^:]*))?|(?P<host>[^:\[\]]*)(?::(?P<p2>[^:]*))?", rest)
    host = (match["v6"] or match["host"] or "") if match else ""
    if not match or not valid_host(host, bracketed=bool(match["v6"])):
        raise ValueError(f"{shown(text)} is not a host name or IP address with an optional user and port; {fix}")
    port = match["p1"] if match["v6"] else match["p2"]
    try:
        return (user or None), host, (parse_port(port) if port is not None else None)
    except ValueError as exc:
        raise ValueError(f"{shown(text)}: {exc}") from None


def check_jump(text: str) -> str:
    if text != "none":
        split_jump(text)
    return text


HOST_FIX = " (write a name like gpu1.example.com, or an IP address: 10.0.0.1, ::1)"


def parse_port(text: str) -> int:
    """A port as written in an address: ASCII digits only, no leading zero, 1 to 65535."""
    if not _PORT.fullmatch(text) or len(text) > 5 or not 1 <= int(text) <= 65535:
        raise ValueError(f"port {shown(text)} must be a number from 1 to 65535 (ASCII digits, no sign or space)")
    if text[0] == "0":
        raise ValueError(f"port {shown(text)} has a leading zero; write {int(text)}")
    return int(text)


def decode_json(data: bytes) -> Any:
    """JSON text as a cluster file must be: UTF-8 (a BOM is fine), no NaN/Infinity, no key twice
    in one object, at most ``MAX_NESTING`` levels. Raises ValueError with a one-line reason."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                         "save it as UTF-8") from None
    _check_nesting(text)
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg} (fix the syntax there)") from None
    except _Refused:
        raise
    except ValueError:  # Python's limit on the digits of an int
        raise ValueError("not valid JSON for tfl: a number has thousands of digits; write a real value") from None


class _Refused(ValueError):
    """Raised by the decoding hooks; its message is already what the user reads."""


# A string (to its closing quote, or to the end of an unterminated one) or a bracket: one
# left-to-right pass, so the scan stays linear whatever the text.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def _check_nesting(text: str) -> None:
    """Refuses deep nesting before ``json.loads`` recurses into it (a RecursionError)."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return
    depth = 0
    for token in _TOKEN.finditer(text):
        char = token.group()[0]
        if char in "[{":
            depth += 1
            if depth > MAX_NESTING:
                raise ValueError(f"nests objects/lists more than {MAX_NESTING} levels deep; "
                                 "a cluster file needs at most 5: remove the extra nesting")
        elif char in "]}":
            depth -= 1


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Refused(f"the key {shown(key)} appears twice in one object; keep one")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise _Refused(f"not valid JSON: {name} is not a number; write a number")


def describe_error(exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """The first error of a ValidationError as one line: field path, problem, fix. Given the
    ``model`` validated, a misspelt key is named with the key it most likely meant."""
    errors = exc.errors(include_url=False)
    err = _misspelt_required(errors, model) or errors[0]
    parts = list(err["loc"])
    kind, msg = err["type"], err["msg"].removeprefix("Value error, ")
    if parts[-1:] == ["[key]"]:  # a dict key, e.g. env's: loc is (..., key, "[key]")
        return f"{_path(parts[:-2])}: key {msg}"
    loc = _path(parts)
    if kind == "extra_forbidden":
        meant = _meant(model, parts)
        hint = f"did you mean '{meant}'? " if meant else ""
        return f"{loc}: unknown key; remove it or check its spelling ({hint}see `tfl schema` for the allowed keys)"
    if kind == "missing" and loc != "cluster":  # a nested key, e.g. devices.worker:0.gpus
        return f"{loc}: required key is missing (see `tfl schema`); add it"
    if kind == "missing":
        return f"{loc}: required key is missing; add it (e.g. {{\"cluster\": {{\"chief\": [\"localhost:23456\"]}}}})"
    if kind in ("model_type", "dict_type") and not loc:
        return "the file must hold a JSON object with a 'cluster' key"
    if kind in _EXPECTED:
        msg = f"expected {_EXPECTED[kind]}, got {_json_kind(err.get('input'))}"
    elif msg.startswith("Input should be"):  # a bound: "Input should be greater than 0"
        msg = f"{msg.replace('Input should', 'should', 1)}, got {shown(repr(err.get('input')))[1:-1]}"
    return f"{loc}: {msg}" if loc else msg


_EXPECTED = {
    "string_type": "text in double quotes", "int_type": "a whole number", "float_type": "a number",
    "bool_type": "true or false", "list_type": "a list [...]", "dict_type": "an object {...}",
    "model_type": "an object {...}",
}


def _meant(model: type[BaseModel] | None, parts: list[Any]) -> str | None:
    """The allowed key closest to the unknown key at ``parts`` (``clustr`` -> ``cluster``), if any is close."""
    if model is None or not parts or not isinstance(parts[-1], str):
        return None
    close = difflib.get_close_matches(parts[-1], _keys_at(model, parts[:-1]), n=1, cutoff=0.6)
    return close[0] if close else None


def _misspelt_required(errors: list[Any], model: type[BaseModel] | None) -> Any:
    """An unknown key that is a required key misspelt: reported instead of "missing", which
    it caused (``{"clustr": ...}`` says ``clustr``, not that ``cluster`` is missing)."""
    missing = [tuple(e["loc"]) for e in errors if e["type"] == "missing"]
    for err in errors:
        loc = list(err["loc"])
        if err["type"] == "extra_forbidden" and (*loc[:-1], _meant(model, loc)) in missing:
            return err
    return None


def _keys_at(model: type[BaseModel], parts: list[Any]) -> list[str]:
    """The keys the object at ``parts`` inside ``model`` may hold; none where no model is there."""
    node: Any = model
    for part in parts:
        target = _model_in(node)
        if target is not None and isinstance(part, str) and part in target.model_fields:
            node = target.model_fields[part].annotation
        elif target is None and get_origin(node) in (dict, list):  # a dict's key or a list's index: the values
            node = get_args(node)[-1]
        else:
            return []
    target = _model_in(node)
    return list(target.model_fields) if target is not None else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: itself, or the model of an optional one (``X | None``)."""
    options = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else ()
    for candidate in (annotation, *options):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    kinds = {str: "text", int: "a whole number", float: "a fractional number", list: "a list", dict: "an object"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _path(parts: list[str | int]) -> str:
    """``cluster.worker[1]``: list indices in brackets; keys (the user's text: one line, cut
    short) joined with dots."""
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{shown(part)[1:-1]}" if path else shown(part)[1:-1]
    return path


EnvName = Annotated[str, AfterValidator(check_env_name)]
EnvValue = Annotated[str, AfterValidator(check_env_value)]
PathText = Annotated[str, AfterValidator(check_path)]
UserName = Annotated[str, AfterValidator(check_user)]
HostName = Annotated[str, AfterValidator(check_host)]
JumpText = Annotated[str, AfterValidator(check_jump)]
