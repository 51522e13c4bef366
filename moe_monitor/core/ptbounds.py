"""Bounds of a PyTorch .pt file, checked before its contents are copied anywhere (core/ptfile.py applies them).

zip_declared: before loading, the zip archive's entry count and declared uncompressed sizes (the pickle and all
entries), so a deflated entry cannot decode past the budget. tensor_elements: after a weights-only load, the
elements of every tensor each time it is held (shared storages, zero-stride views, containers referenced from
many places; shared containers walked once). Why and the figures: docs/traces.md, "What a file may decode to".
"""
from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_ZIP_ENTRIES = 1 << 18   # entries of a .pt archive (data.pkl, a few markers, one per storage)
MAX_DEPTH = 64              # containers nested in a loaded .pt object
_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"


@dataclass(frozen=True)
class ZipSizes:
    """What a .pt archive's central directory declares: its entries, all their uncompressed bytes, and the
    uncompressed bytes of its pickles (entries named *.pkl)."""

    entries: int
    total_bytes: int
    pickle_bytes: int


def zip_entry_count(path: str) -> int | None:
    """Entries the end-of-central-directory record of the zip at path declares (zip64 too); None when the
    file has no such record (not a zip archive)."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        tail_start = max(0, size - (1 << 16) - 22)
        handle.seek(tail_start)
        tail = handle.read()
        at = tail.rfind(_EOCD)
        if at < 0 or at + 22 > len(tail):
            return None
        entries = struct.unpack_from("<H", tail, at + 10)[0]
        locator = at - 20
        if entries == 0xFFFF and locator >= 0 and tail[locator:locator + 4] == _EOCD64_LOCATOR:
            record_at = struct.unpack_from("<Q", tail, locator + 8)[0]
            handle.seek(record_at)
            record = handle.read(56)
            if len(record) == 56 and record[:4] == b"PK\x06\x06":
                entries = struct.unpack_from("<Q", record, 32)[0]
        return int(entries)


def zip_declared(path: str) -> ZipSizes | None:
    """The declared sizes of the .pt archive at path (None when it is not a zip archive: the legacy format,
    bounded by its size on disk); ValueError for an archive of more than MAX_ZIP_ENTRIES entries."""
    entries = zip_entry_count(path)
    if entries is None:
        return None
    if entries > MAX_ZIP_ENTRIES:
        raise ValueError(f"its zip archive declares {entries} entries, more than the {MAX_ZIP_ENTRIES} a .pt "
                         "file is read with")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, struct.error) as exc:
        raise ValueError(f"truncated or corrupt (not a complete torch zip archive: {str(exc)[:120]})") from None
    return ZipSizes(entries=len(infos), total_bytes=sum(i.file_size for i in infos),
                    pickle_bytes=sum(i.file_size for i in infos if i.filename.endswith(".pkl")))


def tensor_elements(obj: Any) -> int:
    """Elements of the tensors in obj (a weights-only load: tensors, dicts, lists, tuples, sets and plain
    values), a tensor counted each time it is held; ValueError for containers nested deeper than MAX_DEPTH or
    a container that holds itself."""
    import torch

    memo: dict[int, int] = {}
    on_path: set[int] = set()

    def walk(item: Any, depth: int) -> int:
        if isinstance(item, torch.Tensor):
            try:
                return int(item.numel())
            except RuntimeError:  # a tensor kind without a element count: the parser refuses it
                return 0
        if isinstance(item, Mapping):
            children: Any = (*item.keys(), *item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = item
        else:
            return 0
        key = id(item)
        if key in memo:
            return memo[key]
        if key in on_path:
            raise ValueError("holds a container that contains itself")
        if depth >= MAX_DEPTH:
            raise ValueError(f"holds containers nested more than {MAX_DEPTH} deep")
        on_path.add(key)
        total = sum(walk(child, depth + 1) for child in children)
        on_path.discard(key)
        memo[key] = total
        return total

    return walk(obj, 0)
