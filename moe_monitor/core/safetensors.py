"""The one reader of safetensors files (TensorRT-LLM's expert statistics, vLLM's saved EPLB load window):
the header, bounded and checked, then a tensor's bytes by its offsets. No safetensors package needed.

A file: 8 bytes little-endian header length N, N bytes of JSON {name: {"dtype", "shape", "data_offsets":
[begin, end]}, "__metadata__": {...}}, then the data; offsets are relative to byte 8 + N and (by the format)
never overlap. Every problem is one ValueError naming the file; the header's JSON is counted against the
decoded-bytes budget (core/jsonbudget.py) before it is parsed.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass

import numpy as np

from .jsonbudget import parse_bounded

MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on a header
MAX_TENSORS = 1 << 22
# safetensors dtype names -> little-endian numpy dtypes of whole-number counts (no BF16: numpy has none)
DTYPES = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2",
          "U8": "u1", "F64": "<f8", "F32": "<f4", "F16": "<f2"}


@dataclass(frozen=True)
class Entry:
    """One declared tensor: name, numpy dtype, shape, absolute byte range [start, stop) in the file."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def cells(self) -> int:
        return math.prod(self.shape)  # exact: an int64 product of a hostile shape wraps


def header_length(path: str) -> int:
    """The header length N the file declares, at most what the file and MAX_HEADER_BYTES allow (0: none)."""
    with open(path, "rb") as handle:
        head = handle.read(8)
    declared = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
    return min(declared, max(0, os.path.getsize(path) - 8), MAX_HEADER_BYTES)


def read_index(path: str, budget_bytes: int) -> tuple[list[Entry], dict]:
    """(the tensors the header declares in offset order, its __metadata__) of the file at path; ValueError for a
    truncated file, a header over its limits or the budget, an unknown dtype, offsets that do not match the shape,
    leave the file or overlap."""
    name = os.path.basename(path)
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"{name}: shorter than a safetensors header (truncated)")
        (header_bytes,) = struct.unpack("<Q", head)
        if header_bytes > MAX_HEADER_BYTES or 8 + header_bytes > size:
            raise ValueError(f"{name}: declares a {header_bytes}-byte header in a {size}-byte file (truncated, or "
                             f"not safetensors)")
        header = parse_bounded(handle.read(header_bytes), f"{name}: its safetensors header", budget_bytes)
    if not isinstance(header, dict):
        raise ValueError(f"{name}: its safetensors header is not a JSON object")
    if len(header) > MAX_TENSORS:
        raise ValueError(f"{name}: declares {len(header)} tensors, at most {MAX_TENSORS} are read")
    data0 = 8 + header_bytes
    meta = header.get("__metadata__")
    entries = [_entry(name, key, value, data0, size) for key, value in header.items() if key != "__metadata__"]
    entries.sort(key=lambda e: (e.start, e.stop))
    for before, after in zip(entries, entries[1:]):
        if after.start < before.stop:
            raise ValueError(f"{name}: tensors {before.name[:40]!r} and {after.name[:40]!r} share bytes (the "
                             "safetensors format forbids it)")
    return entries, meta if isinstance(meta, dict) else {}


def _entry(name: str, key: str, value, data0: int, size: int) -> Entry:
    where = f"{name}: tensor {key[:40]!r}"
    if not isinstance(value, dict):
        raise ValueError(f"{where}: its header entry is not an object")
    dtype_name, shape, offsets = value.get("dtype"), value.get("shape"), value.get("data_offsets")
    if dtype_name not in DTYPES:
        raise ValueError(f"{where}: dtype {str(dtype_name)[:10]!r} is not a count dtype ({', '.join(DTYPES)})")
    if not (isinstance(shape, list) and len(shape) <= 8 and all(type(n) is int and 0 <= n < 1 << 40 for n in shape)):
        raise ValueError(f"{where}: shape {str(shape)[:40]} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"{where}: data_offsets {str(offsets)[:40]} are not two increasing byte offsets")
    dtype = np.dtype(DTYPES[dtype_name])
    entry = Entry(name=key, dtype=dtype, shape=tuple(shape), start=data0 + offsets[0], stop=data0 + offsets[1])
    if entry.stop - entry.start != entry.cells * dtype.itemsize:
        raise ValueError(f"{where}: {entry.stop - entry.start} bytes for {list(shape)} {dtype_name}")
    if entry.stop > size:
        raise ValueError(f"{where}: ends at byte {entry.stop} of a {size}-byte file (truncated)")
    return entry


def read_counts(handle, entry: Entry, where: str) -> np.ndarray:
    """int64 counts of one entry read by its offsets from an open file; ValueError for bytes missing, a count
    that is negative, NaN, fractional or 2**31 or more."""
    handle.seek(entry.start)
    raw = handle.read(entry.stop - entry.start)
    if len(raw) != entry.stop - entry.start:
        raise ValueError(f"{where}: cut short (truncated)")
    values = np.frombuffer(raw, dtype=entry.dtype).reshape(entry.shape)
    if values.dtype.kind == "f" and (not np.isfinite(values).all() or (values != np.floor(values)).any()):
        raise ValueError(f"{where}: counts must be whole numbers (NaN, infinity or a fraction found)")
    if values.size and values.max() > np.iinfo(np.int32).max:
        raise ValueError(f"{where}: a count exceeds 2**31 tokens")
    counts = values.astype(np.int64)
    if counts.min(initial=0) < 0:
        raise ValueError(f"{where}: counts must not be negative")
    return counts
