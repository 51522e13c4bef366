"""Compact counts on the wire: the narrowest integer type that holds a record's counts, zstd-compressed where
that pays (level 1; zstd against lz4 and the bytes a record takes: docs/wire.md, `python -m bench.wire`).

Decoding trusts nothing: the type must be one of COUNT_TYPES, a compressed payload must declare its size in its
frame header and that size must be exactly the [L, E] cells times the type's width (no decompression bomb),
and the result must have exactly that many bytes. Every failure is one ValueError.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import zstandard

# wire name -> little-endian integer type; "i8" only for sums (rollups of hours), never for one step's counts
COUNT_TYPES: dict[str, np.dtype] = {"u1": np.dtype("u1"), "u2": np.dtype("<u2"), "i4": np.dtype("<i4"),
                                    "i8": np.dtype("<i8")}
CODECS = ("raw", "zstd")
ZSTD_LEVEL = 1
MIN_COMPRESS_BYTES = 256  # smaller payloads go raw (a zstd frame costs ~10 bytes of header)
PAYS = 0.9  # compressed only when it takes at most this share of the raw bytes

_local = threading.local()  # zstd contexts are not shared between threads


def _compressor() -> zstandard.ZstdCompressor:
    comp = getattr(_local, "comp", None)
    if comp is None:
        comp = _local.comp = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    return comp


def _decompressor() -> zstandard.ZstdDecompressor:
    dec = getattr(_local, "dec", None)
    if dec is None:
        dec = _local.dec = zstandard.ZstdDecompressor()
    return dec


# (wire name, largest value it holds), narrowest first: narrowest_type's table (np.iinfo per call costs
# more than the reduction it follows on a decode step's few cells)
_TYPE_MAXIMA = tuple((name, int(np.iinfo(dtype).max)) for name, dtype in COUNT_TYPES.items())


STACK_CELLS = 4096  # arrays up to this many cells have their extremes found in one reduction per batch (pack_many)


def narrowest_type(counts: np.ndarray, widest: str = "i4") -> str:
    """The wire name of the narrowest type in COUNT_TYPES that holds every value of counts (all >= 0), up to
    `widest`. ValueError when a value is negative or does not fit `widest`."""
    if counts.size == 0:
        return "u1"
    return _type_holding(int(counts.max()), int(counts.min()), widest)


def _type_holding(top: int, low: int, widest: str) -> str:
    """narrowest_type of an array whose largest value is top and smallest low."""
    if low < 0:
        raise ValueError("counts contain negative values")
    for name, largest in _TYPE_MAXIMA:
        if top <= largest:
            return name
        if name == widest:
            break
    raise ValueError(f"counts up to {top} do not fit {widest}")


def pack_counts(counts: np.ndarray, widest: str = "i4", compress: bool = True) -> tuple[str, str, bytes]:
    """counts (any integer array, >= 0) -> (type name, codec, payload bytes), row-major."""
    return _packed(counts, narrowest_type(counts, widest), compress)


def pack_many(arrays: Sequence[np.ndarray], widest: str = "i4") -> list[tuple[str, str, bytes]]:
    """pack_counts of each array, in order. Arrays of one shape with at most STACK_CELLS cells have their
    largest and smallest values found in one reduction for all of them: a decode step of a small model has a
    few dozen cells, and two numpy reductions of its own cost more than its bytes (larger arrays are reduced
    one by one, where stacking them would cost a copy of each)."""
    extremes: list[tuple[int, int]] = [(0, 0)] * len(arrays)  # an empty array's: "u1", as narrowest_type says
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, counts in enumerate(arrays):
        if 0 < counts.size <= STACK_CELLS:
            by_shape.setdefault(counts.shape, []).append(i)
        elif counts.size:
            extremes[i] = (int(counts.max()), int(counts.min()))
    for indices in by_shape.values():
        stack = np.stack([arrays[i] for i in indices]).reshape(len(indices), -1)
        for i, top, low in zip(indices, stack.max(axis=1).tolist(), stack.min(axis=1).tolist()):
            extremes[i] = (top, low)
    return [_packed(counts, _type_holding(top, low, widest), True) for counts, (top, low) in zip(arrays, extremes)]


def _packed(counts: np.ndarray, type_name: str, compress: bool) -> tuple[str, str, bytes]:
    """counts as type_name, zstd-compressed where that pays: (type name, codec, payload bytes)."""
    raw = np.ascontiguousarray(counts, dtype=COUNT_TYPES[type_name]).tobytes()
    if compress and len(raw) >= MIN_COMPRESS_BYTES:
        packed = _compressor().compress(raw)
        if len(packed) <= PAYS * len(raw):
            return type_name, "zstd", packed
    return type_name, "raw", raw


def unpack_counts(type_name: str, codec: str, payload: bytes, shape: tuple[int, ...],
                  out_dtype: np.dtype | str = "<i4") -> np.ndarray:
    """(type name, codec, payload) -> array of `shape` as out_dtype (a new array). ValueError, never another
    exception, when the type or codec is unknown or the payload is not exactly that many cells."""
    dtype = COUNT_TYPES.get(type_name)
    if dtype is None:
        raise ValueError(f"unknown counts type {type_name!r} (known: {', '.join(COUNT_TYPES)})")
    cells = 1
    for size in shape:
        cells *= int(size)
    want = cells * dtype.itemsize
    if codec == "zstd":
        try:
            declared = zstandard.frame_content_size(payload)
        except zstandard.ZstdError as exc:
            raise ValueError(f"counts are not a zstd frame: {exc}") from None
        if declared != want:
            raise ValueError(f"compressed counts declare {declared} bytes, expected {want} ({'x'.join(map(str, shape))} "
                             f"{type_name})")
        try:
            raw = _decompressor().decompress(payload, max_output_size=want)
        except zstandard.ZstdError as exc:
            raise ValueError(f"compressed counts do not decompress: {exc}") from None
    elif codec == "raw":
        raw = payload
    else:
        raise ValueError(f"unknown counts codec {codec!r} (known: {', '.join(CODECS)})")
    if len(raw) != want:
        raise ValueError(f"counts has {len(raw)} bytes, expected {'x'.join(map(str, shape))} {type_name} ({want})")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).astype(out_dtype)
