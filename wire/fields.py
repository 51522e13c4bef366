"""Reading typed values out of stream entry fields (bytes or str keys); every failure is a ValueError."""
from __future__ import annotations


def _text(fields: dict, name: str) -> str:
    value = fields.get(name, fields.get(name.encode()))
    if value is None:
        raise ValueError(f"missing field {name!r}")
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _raw(fields: dict, name: str) -> bytes:
    value = fields.get(name, fields.get(name.encode()))
    if value is None:
        raise ValueError(f"missing field {name!r}")
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"field {name!r} must be bytes, got {type(value).__name__}")
    return bytes(value)


def _int(fields: dict, name: str, lo: int = 0) -> int:
    try:
        value = int(_text(fields, name))
    except ValueError as exc:
        raise ValueError(f"field {name!r} is not an integer: {exc}") from None
    if value < lo:
        raise ValueError(f"field {name!r} = {value} is below {lo}")
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
