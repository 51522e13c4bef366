"""UltraEP load traces (ultra_ep_trace_v1) -> per-microbatch logical loads and physical-slot loads, checked and
bounded. One trace per EP group: `{trace_id}.manifest.json` (ep_size, num_layers, M local masters, Pl local
physical experts, E = ep_size x M, P = ep_size x Pl, ...) and `{trace_id}.chunk{id:06d}.npz` chunks of records
(layers [R], microbatches [R], pre_logical_loads int32 [R, E], post_physical_loads int32 [R, P], slot p on GPU
p // Pl). A record is one (layer, microbatch); masters never move, redundant slots' experts are not recorded.
Everything is bounded before any array byte is read (JSON sizes, zip directories, .npy headers, core/budget.py);
arrays load with allow_pickle=False only; every problem is one ValueError naming the file.

Shape legend: R records, T microbatches (steps), L layers, E logical experts, P physical slots. docs/traces.md.
"""
from __future__ import annotations

import math
import os
import re
import zipfile
import zlib
from dataclasses import dataclass

import numpy as np

from moe_monitor import core
from moe_monitor.core.budget import check_decoded

SCHEMA = "ultra_ep_trace_v1"
MANIFEST_SUFFIX = ".manifest.json"
MAX_JSON_BYTES = 1 << 20
MAX_CHUNKS = 1 << 20
# What a record builds, from the declared shapes (not the bytes: uint8 arrays deflate to nothing): its ids widened
# to int64, concatenated, and the keys, sort and index arrays of np.unique; each load cell as int32 widened,
# concatenated and taken into steps, then convert's step records.
RECORD_BYTES = 128
LOAD_CELL_BYTES = 16
ARRAYS = ("layers", "virtual_layers", "microbatches", "pre_logical_loads", "post_physical_loads")
MANIFEST_INTS = ("ep_size", "num_local_master_experts", "num_local_redundant_experts", "num_local_physical_experts",
                 "num_global_logical_experts", "num_global_physical_experts", "chunks", "dropped_records")


@dataclass(frozen=True)
class Manifest:
    """The manifest's fields this reader uses (raw: all of it, as written)."""

    path: str
    trace_id: str
    ep_size: int
    masters: int
    slots_per_gpu: int
    num_experts: int
    num_slots: int
    chunks: int
    dropped_records: int
    raw: dict


@dataclass(frozen=True)
class Trace:
    """A trace read: step_T int64 [T] microbatch ids of the complete steps, layer_L int64 [L] the model's layer
    ids, pre_TLE int32 [T, L, E] logical loads, post_TLP int32 [T, L, P] physical-slot loads; incomplete: the
    microbatches left out because a layer's record is missing (dropped by the profiler, or in a chunk not yet
    written), repeated: records of a (layer, microbatch) already seen (the first is kept)."""

    manifest: Manifest
    chunk_files: int
    step_T: np.ndarray
    layer_L: np.ndarray
    pre_TLE: np.ndarray
    post_TLP: np.ndarray
    incomplete: int
    repeated: int


def find_manifest(path: str) -> str | None:
    """The manifest of path: path itself when it names a *.manifest.json, the one manifest of an UltraEP trace
    folder, None for anything else; ValueError for a folder holding several traces (name one)."""
    if os.path.isfile(path):
        return path if path.endswith(MANIFEST_SUFFIX) else None
    if not os.path.isdir(path):
        return None
    found = sorted(n for n in os.listdir(path) if n.endswith(MANIFEST_SUFFIX))
    if len(found) > 1:
        raise ValueError(f"{path}: holds {len(found)} UltraEP traces ({', '.join(found[:3])}"
                         f"{', ...' if len(found) > 3 else ''}): name one manifest as IN")
    return os.path.join(path, found[0]) if found else None


def read_manifest(path: str) -> Manifest:
    """The manifest at path, checked: schema ultra_ep_trace_v1, sizes that agree (E = ep_size x M, P = ep_size x
    Pl, Pl = M + redundant). ValueError naming the file otherwise."""
    name = os.path.basename(path)
    raw = _json_file(path)
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise ValueError(f"{name}: not an UltraEP manifest (schema {SCHEMA!r} expected)")
    trace_id = raw.get("trace_id")
    if not isinstance(trace_id, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", trace_id) \
            or name != trace_id + MANIFEST_SUFFIX:
        raise ValueError(f"{name}: trace_id {str(trace_id)[:60]!r} does not name this manifest")
    ints = {}
    for key in MANIFEST_INTS:
        value = raw.get(key)
        if type(value) is not int or not 0 <= value <= core.MAX_SLOTS * max(1, core.MAX_WORLD):
            raise ValueError(f"{name}: {key} {str(value)[:20]} is not a whole number >= 0")
        ints[key] = value
    ep, m = ints["ep_size"], ints["num_local_master_experts"]
    per_gpu = ints["num_local_physical_experts"]
    if ep < 1 or m < 1 or per_gpu != m + ints["num_local_redundant_experts"] \
            or ints["num_global_logical_experts"] != ep * m or ints["num_global_physical_experts"] != ep * per_gpu:
        raise ValueError(f"{name}: sizes disagree (ep_size {ep}, {m} masters + "
                         f"{ints['num_local_redundant_experts']} redundant = {per_gpu} slots per GPU, "
                         f"{ints['num_global_logical_experts']} experts, {ints['num_global_physical_experts']} slots)")
    core.check_sizes(1, ep * m, ep * per_gpu)
    if ints["chunks"] > MAX_CHUNKS:
        raise ValueError(f"{name}: {ints['chunks']} chunks, at most {MAX_CHUNKS} are read")
    return Manifest(path=path, trace_id=trace_id, ep_size=ep, masters=m, slots_per_gpu=per_gpu,
                    num_experts=ep * m, num_slots=ep * per_gpu, chunks=ints["chunks"],
                    dropped_records=ints["dropped_records"], raw=raw)


def chunk_files(man: Manifest) -> list[str]:
    """The trace's chunk files in chunk order. A closed trace's manifest counts them and every one must be there;
    one still being written (chunks 0) is read as far as its chunks go."""
    folder = os.path.dirname(man.path) or "."
    pattern = re.compile(re.escape(man.trace_id) + r"\.chunk(\d{6,7})\.npz")
    found = {int(m.group(1)): os.path.join(folder, m.group(0))
             for m in map(pattern.fullmatch, os.listdir(folder)) if m}
    if len(found) > MAX_CHUNKS:
        raise ValueError(f"{folder}: {len(found)} chunks of {man.trace_id}, at most {MAX_CHUNKS} are read")
    want = man.chunks or len(found)
    missing = [i for i in range(want) if i not in found]
    if missing:
        raise ValueError(f"{os.path.basename(man.path)}: chunk {missing[0]} of {want} is missing "
                         f"({man.trace_id}.chunk{missing[0]:06d}.npz)")
    if not found:
        raise ValueError(f"{os.path.basename(man.path)}: the trace has no chunk (no record was flushed)")
    return [found[i] for i in sorted(found)]


def chunk_index(path: str, man: Manifest) -> dict[str, tuple[tuple[int, ...], np.dtype, int]]:
    """name -> (shape, dtype, declared bytes) of each member of a chunk, from its zip directory and .npy headers
    only. ValueError naming the file for a missing member, an object dtype, a shape that is not the layout's."""
    name = os.path.basename(path)
    out = {}
    try:
        with zipfile.ZipFile(path) as zf:
            members = {info.filename: info for info in zf.infolist()}
            for key in ("metadata", *ARRAYS):
                info = members.get(f"{key}.npy")
                if info is None:
                    raise ValueError(f"{name}: lacks the array {key!r} (an UltraEP chunk holds {', '.join(ARRAYS)})")
                with zf.open(info) as handle:
                    version = np.lib.format.read_magic(handle)
                    if version == (1, 0):
                        shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
                    elif version == (2, 0):
                        shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
                    else:
                        raise ValueError(f"{name}: {key} is a .npy of version {version}")
                if dtype.hasobject:
                    raise ValueError(f"{name}: {key} holds Python objects (never unpickled)")
                cells = math.prod(shape)  # exact: an int64 product wraps
                if cells * dtype.itemsize > info.file_size:
                    raise ValueError(f"{name}: {key} declares {tuple(shape)} {dtype} in {info.file_size} bytes")
                out[key] = (tuple(int(n) for n in shape), dtype, int(info.file_size))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{name}: not a readable .npz ({type(exc).__name__}: {str(exc)[:120]})") from None
    _check_shapes(name, out, man)
    return out


def _check_shapes(name: str, index: dict, man: Manifest) -> None:
    shape_meta, dtype_meta, size_meta = index["metadata"]
    if shape_meta != () or dtype_meta.kind != "U" or size_meta > MAX_JSON_BYTES:
        raise ValueError(f"{name}: metadata is not a JSON string of at most {MAX_JSON_BYTES} bytes")
    rows = index["layers"][0][:1]
    for key in ARRAYS:
        shape, dtype, _ = index[key]
        width = {"pre_logical_loads": (man.num_experts,), "post_physical_loads": (man.num_slots,)}.get(key, ())
        if shape != (*rows, *width) or len(rows) != 1 or dtype.kind not in "iu":
            raise ValueError(f"{name}: {key} is {dtype} {list(shape)}, expected integers "
                             f"[{rows[0] if rows else 'records'}{''.join(f', {w}' for w in width)}] "
                             f"(E = {man.num_experts} experts, P = {man.num_slots} slots of the manifest)")


def read_trace(manifest_path: str, budget_bytes: int) -> Trace:
    """The trace of a manifest, its chunks read in order and grouped into steps (one per microbatch that holds
    every layer). ValueError (one line naming the file) for bad input or one that decodes to more than
    budget_bytes."""
    man = read_manifest(manifest_path)
    files = chunk_files(man)
    indexes = [chunk_index(path, man) for path in files]
    declared = sum(size for index in indexes for _, _, size in index.values())
    records = sum(index["layers"][0][0] for index in indexes)
    built = records * (RECORD_BYTES + LOAD_CELL_BYTES * (man.num_experts + man.num_slots))
    check_decoded(f"{os.path.basename(manifest_path)}: its chunks ({records} records of {man.num_experts} experts and "
                  f"{man.num_slots} slots) and the steps made of them", max(2 * declared, built), budget_bytes)
    parts = [_chunk_arrays(path, i, man) for i, path in enumerate(files)]
    layer_R = np.concatenate([p[0] for p in parts])
    mb_R = np.concatenate([p[1] for p in parts])
    layer_L = np.unique(layer_R)
    core.check_sizes(len(layer_L), man.num_experts, man.num_slots)
    cell_R = mb_R * len(layer_L) + np.searchsorted(layer_L, layer_R)
    cells, first_R = np.unique(cell_R, return_index=True)  # a repeated (microbatch, layer): the first is kept
    step_C = cells // len(layer_L)
    steps, per_step = np.unique(step_C, return_counts=True)
    complete = steps[per_step == len(layer_L)]
    keep = np.isin(step_C, complete)
    rows = first_R[keep]  # in (microbatch, layer) order: T x L rows
    pre_RE = np.concatenate([p[2] for p in parts])
    post_RP = np.concatenate([p[3] for p in parts])
    shape = (len(complete), len(layer_L))
    return Trace(manifest=man, chunk_files=len(files), step_T=complete.astype(np.int64),
                 layer_L=layer_L.astype(np.int64), pre_TLE=pre_RE[rows].reshape(*shape, man.num_experts),
                 post_TLP=post_RP[rows].reshape(*shape, man.num_slots),
                 incomplete=int(len(steps) - len(complete)), repeated=int(len(cell_R) - len(cells)))


def _chunk_arrays(path: str, chunk_id: int, man: Manifest):
    """(layers int64 [R], microbatches int64 [R], pre int32 [R, E], post int32 [R, P]) of a chunk indexed by
    chunk_index; ValueError for metadata of another trace or chunk, negative loads or ids."""
    name = os.path.basename(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = core.parse_json(str(data["metadata"].item()), f"{name}: metadata", MAX_JSON_BYTES)
            arrays = [data[key] for key in ARRAYS]
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{name}: cannot be read ({type(exc).__name__}: {str(exc)[:120]})") from None
    except ValueError as exc:
        raise ValueError(str(exc) if str(exc).startswith(name) else f"{name}: {str(exc)[:200]}") from None
    layers, _, microbatches, pre, post = arrays
    if not isinstance(meta, dict) or meta.get("trace_id") != man.trace_id or meta.get("chunk_id") != chunk_id:
        raise ValueError(f"{name}: its metadata names another trace or chunk (trace_id "
                         f"{str(meta.get('trace_id') if isinstance(meta, dict) else None)[:60]!r})")
    if meta.get("records", len(layers)) != len(layers):
        raise ValueError(f"{name}: metadata says {str(meta.get('records'))[:20]} records, the arrays hold {len(layers)}")
    # microbatch ids stay below MAX_STEP / 4096 so that microbatch x layers + layer (L <= 1024) fits int64
    for key, values, high in (("layers", layers, core.MAX_SLOTS), ("microbatches", microbatches, core.MAX_STEP // 4096)):
        if values.size and (values.min() < 0 or values.max() >= high):
            raise ValueError(f"{name}: {key} holds ids outside 0..{high - 1}")
    for key, values in (("pre_logical_loads", pre), ("post_physical_loads", post)):
        if values.size and values.min() < 0:
            raise ValueError(f"{name}: {key} holds negative loads")
        if values.size and int(values.max()) > np.iinfo(np.int32).max:
            raise ValueError(f"{name}: {key} holds a load above 2**31 tokens")
    return (layers.astype(np.int64), microbatches.astype(np.int64), pre.astype(np.int32, copy=False),
            post.astype(np.int32, copy=False))


def _json_file(path: str):
    name = os.path.basename(path)
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        raise ValueError(f"{name}: {exc.strerror or 'cannot be read'}") from None
    if size > MAX_JSON_BYTES:
        raise ValueError(f"{name}: larger than {MAX_JSON_BYTES} bytes")
    with open(path, "rb") as handle:
        return core.parse_json(handle.read(), name)

