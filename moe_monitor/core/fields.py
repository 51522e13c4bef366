"""Reading typed values out of stream entry fields (bytes or str keys) and JSON text; every failure is a
ValueError, never another exception (no UnicodeDecodeError, RecursionError, OverflowError or TypeError)."""
from __future__ import annotations

import json
import math
import re
from typing import TypeGuard

from .keys import MAX_NAME_CHARS, MAX_TIME_S

_INT_TEXT = re.compile(r"-?[0-9]{1,20}")  # ASCII digits only: '²' and '٣' are digits to str.isdigit(), not here


_ENCODED: dict[str, bytes] = {}  # field name -> its bytes (field names are constants of the code)


def _get(fields: dict, name: str):
    """fields[name] under a bytes key (as redis-py hands entries over) or a str key; None when absent."""
    key = _ENCODED.get(name)
    if key is None:
        key = _ENCODED[name] = name.encode()
    value = fields.get(key)
    return fields.get(name) if value is None else value


def _text(fields: dict, name: str, max_chars: int | None = None) -> str:
    value = _get(fields, name)
    if value is None:
        raise ValueError(f"missing field {name!r}")
    if isinstance(value, (bytes, bytearray)):
        try:
            text = value.decode()
        except UnicodeDecodeError:
            raise ValueError(f"field {name!r} is not UTF-8 text") from None
    elif isinstance(value, str):
        text = value
    elif isinstance(value, float) or _is_int(value) and -(10**20) < value < 10**20:  # a JSON number of a trace
        text = repr(value)
    else:
        raise ValueError(f"field {name!r} must be text or a number, got {type(value).__name__}")
    if max_chars is not None and len(text) > max_chars:
        raise ValueError(f"field {name!r} is longer than {max_chars} characters")
    return text


def _raw(fields: dict, name: str) -> bytes:
    value = _get(fields, name)
    if value is None:
        raise ValueError(f"missing field {name!r}")
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"field {name!r} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _int(fields: dict, name: str, lo: int = 0, hi: int | None = None) -> int:
    """The field as an int with lo <= value (< hi when given); ValueError otherwise."""
    raw = _get(fields, name)
    if type(raw) is bytes and len(raw) <= 20:  # the hot path: Redis hands over ASCII digits
        try:
            value = int(raw)  # int() of bytes takes ASCII only: no '²', no 5,000 digits (length checked)
        except ValueError:
            raise ValueError(f"field {name!r} is not an integer: {raw[:40]!r}") from None
    elif _is_int(raw):
        value = raw
    else:
        text = _text(fields, name, max_chars=64).strip()
        if not _INT_TEXT.fullmatch(text):
            raise ValueError(f"field {name!r} is not an integer: {text[:40]!r}")
        value = int(text)
    if value < lo:
        raise ValueError(f"field {name!r} = {value} is below {lo}")
    if hi is not None and value >= hi:
        raise ValueError(f"field {name!r} is not below {hi}")
    return value


def _time(fields: dict, name: str) -> float:
    """A finite time field with |t| < MAX_TIME_S; ValueError otherwise."""
    text = _text(fields, name, max_chars=64)
    try:
        time_s = float(text)
    except ValueError:
        raise ValueError(f"field {name!r} is not a number: {text[:40]!r}") from None
    if not math.isfinite(time_s):
        raise ValueError("time is not finite")
    if abs(time_s) >= MAX_TIME_S:
        raise ValueError(f"time {time_s:g} is out of range (|t| < {MAX_TIME_S:g} s)")
    return time_s


def _version(fields: dict, supported: int | tuple[int, ...], what: str = "schema", say_supported: bool = True) -> int:
    """The entry's format version (field "v"), one of supported (an int: that one); else ValueError "<what>
    version <v> is not supported (this reader speaks <supported>)", without the parenthesis when not
    say_supported."""
    version = _int(fields, "v")
    if version not in (supported if isinstance(supported, tuple) else (supported,)):
        speaks = f" (this reader speaks {supported})" if say_supported else ""
        raise ValueError(f"{what} version {version} is not supported{speaks}")
    return version


def _instance(fields: dict, writer: str = "collector") -> str:
    """The optional id of the writer's process (field "inst"; "" when absent), at most MAX_NAME_CHARS
    characters; else ValueError "<writer> instance id is longer than ..."."""
    instance = _text(fields, "inst") if _get(fields, "inst") is not None else ""
    if len(instance) > MAX_NAME_CHARS:
        raise ValueError(f"{writer} instance id is longer than {MAX_NAME_CHARS} characters")
    return instance


def _scope(fields: dict, scopes: tuple[str, ...]) -> str:
    """The optional scope (field "scope"; "rank" when absent), one of scopes; else ValueError."""
    scope = _text(fields, "scope", max_chars=16) if _get(fields, "scope") is not None else "rank"
    if scope not in scopes:
        raise ValueError(f"unknown scope {scope!r}")
    return scope


def _is_int(value) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _in_range(value, lo: int, hi: int) -> bool:
    """value is an int (not a bool) with lo <= value <= hi."""
    return _is_int(value) and lo <= value <= hi


def parse_json(text: str | bytes | bytearray, what: str, max_bytes: int | None = None):
    """json.loads(text) with every failure (not JSON, not UTF-8, too large, nested too deeply, a number of
    too many digits) as one ValueError naming `what`."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise ValueError(f"{what} must be JSON text, got {type(text).__name__}")
    if max_bytes is not None and len(text) > max_bytes:
        raise ValueError(f"{what} is larger than {max_bytes} bytes")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        raise ValueError(f"{what} is not JSON: {str(exc)[:200]}") from None


_json = parse_json


def _float_field(fields: dict, name: str, lo: float, hi: float) -> float:
    """A finite float field with lo <= value < hi; ValueError otherwise."""
    text = _text(fields, name, max_chars=64)
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"field {name!r} is not a number: {text[:40]!r}") from None
    if not (math.isfinite(value) and lo <= value < hi):
        raise ValueError(f"field {name!r} = {value!r} is not a finite number in [{lo:g}, {hi:g})")
    return value
