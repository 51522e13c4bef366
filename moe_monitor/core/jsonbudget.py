"""What parsing a JSON input may cost, counted before it is parsed (every reader of a JSON file that is not a
trace line: logical_count JSON, the planner's counts files, safetensors headers, importers' metadata).

json.loads builds Python objects: a list or dict is 56-64 bytes plus an 8-byte slot in its parent, a number
or string 24-60 bytes. The cost of raw JSON is bounded by CONTAINER_BYTES per "[" or "{" plus BYTE_COST per
byte, both above the measured worst cases (docs/traces.md, "What a file may decode to").
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import chain

import numpy as np

from .budget import check_decoded
from .fields import parse_json

CONTAINER_BYTES = 72  # a list or dict json.loads builds: its object, its parent's slot, over-allocation
BYTE_COST = 16        # any byte: the bytes read, the text decoded, a number's object and slot


def json_cost(raw: bytes) -> int:
    """Bytes of Python objects json.loads(raw) may build, at most (module docstring)."""
    return CONTAINER_BYTES * (raw.count(b"[") + raw.count(b"{")) + BYTE_COST * len(raw)


def parse_bounded(raw: bytes, what: str, budget_bytes: int):
    """json.loads(raw) when json_cost(raw) is within budget_bytes; ValueError naming `what` otherwise (over the
    budget, not JSON, nested too deeply)."""
    check_decoded(f"{what}: its {len(raw)} bytes of JSON", json_cost(raw), budget_bytes)
    return parse_json(raw, what)


def read_bounded(path: str, what: str, budget_bytes: int):
    """The JSON file at path parsed, refused before it is read when its size alone (BYTE_COST a byte) is over
    budget_bytes, and before it is parsed when json_cost is; ValueError naming `what`."""
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise ValueError(f"{what}: {exc.strerror or 'cannot be read'}") from None
    check_decoded(f"{what}: its {size} bytes of JSON", size * BYTE_COST, budget_bytes)
    with open(path, "rb") as handle:
        raw = handle.read(size + 1)
    return parse_bounded(raw, what, budget_bytes)


def read_head(path: str, size: int = 4096) -> bytes:
    """The first `size` bytes of a file (format detection reads no more: never a whole line)."""
    with open(path, "rb") as handle:
        return handle.read(size)


def numbers_array(obj: list, name: str) -> np.ndarray:
    """Nested lists of numbers [L][E] or [W][L][E] -> float64 array, checked level by level with generators
    (never a list of every child, as a walk with a stack would build: a file of [] x 30M is 30M entries)."""
    shape: list[int] = []
    item = obj
    while isinstance(item, list):
        if len(shape) == 3:
            raise ValueError(f"{name} must be [layers][experts] or [windows][layers][experts]: lists nest deeper "
                             "than 3 levels")
        shape.append(len(item))
        if not item:
            break
        item = item[0]
    level: Iterator = iter((obj,))
    for depth in range(1, len(shape)):
        level = _rows_of(chain.from_iterable(level), shape[depth], depth, name)
    if not all(type(v) is int or type(v) is float for v in chain.from_iterable(level)):
        raise ValueError(f"{name} must hold numbers only, {_first_other(obj, len(shape))}")
    try:
        return np.asarray(obj, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"{name} must be numbers within the float range ({exc})") from None


def _rows_of(items: Iterator, width: int, depth: int, name: str) -> Iterator[list]:
    """items as they are checked to be lists of `width` (the first row's) entries."""
    for row in items:
        if not isinstance(row, list) or len(row) != width:
            raise ValueError(f"{name} must be a rectangular array [layers][experts] or [windows][layers][experts] "
                             f"(a row at depth {depth} is not a list of {width})")
        yield row


def _first_other(obj: list, depth: int) -> str:
    """'found <type> <value> at [i][j]' of the first leaf that is not an int or float (walked lazily)."""
    stack: list[tuple[Iterator, tuple[int, ...]]] = [(enumerate(obj), ())]
    while stack:
        items, where = stack[-1]
        step = next(items, None)
        if step is None:
            stack.pop()
            continue
        i, item = step
        if len(where) + 1 < depth and isinstance(item, list):
            stack.append((enumerate(item), (*where, i)))
        elif not (type(item) is int or type(item) is float):
            text = repr(item) if len(repr(item)) <= 40 else repr(item)[:37] + "..."
            return f"found {type(item).__name__} {text} at " + "".join(f"[{j}]" for j in (*where, i))
    return "found something else"
