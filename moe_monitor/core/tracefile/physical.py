"""Physical-slot counts (core.PhysicalRecord) beside a trace: the sidecar <stem>.physical.parquet of a .parquet
trace (<name>.physical.parquet beside an .arrows recording), written by `moe-monitor convert` for inputs that
measure them (UltraEP's post_physical_loads) and carried along when a trace with one is converted.

Shape legend (README, Conventions): R rows, L MoE layers, P physical slots (slot p on GPU p // (P / gpus)).

One row per (step, rank), all of one [L, P] and gpus (a run's measured GPU loads sum its ranks' records:
core.measured_gpu_loads); the schema's metadata holds L, P and gpus:

    step      int64      the step id of the StepRecord it belongs to
    rank      int32      the rank that dispatched the tokens
    time_s    float64    unix seconds of the step
    instance  string     the collector process (<= core.MAX_NAME_CHARS)
    source    string     one of core.PHYSICAL_SOURCES
    counts    fixed_size_binary(L*P*4)  little-endian int32 [L, P] tokens per physical slot

Every row is checked by core.decode_physical's rules (what it would refuse is a bad row: counted, skipped).
Reading is bounded before any page is read: the rows' declared widths and the text columns' declared sizes
count against the decoded-bytes budget (core/budget.py). The sidecar is written to a hidden name and renamed.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from moe_monitor import core
from moe_monitor.core.budget import check_decoded
from moe_monitor.core.physical import PHYSICAL_DTYPE

from .schema import META_FORMAT, META_VERSION

PHYSICAL_FORMAT = "moe-trace-physical"
PHYSICAL_FORMAT_VERSION = 1
META_SHAPE = b"moe.physical_shape"  # "L,P,gpus"
GROUP_ROWS = 256
ROW_FIXED_BYTES = 8 + 4 + 8 + 2 * 4  # step, rank, time_s and two dictionary indices


@dataclass
class PhysicalRead:
    """What one read found: the good records (step order) and the bad rows, with the last reason."""

    records: list[core.PhysicalRecord] = field(default_factory=list)
    bad_records: int = 0
    last_error: str = ""


def physical_sidecar(path: str | os.PathLike[str]) -> Path:
    """<stem>.physical.parquet beside a .parquet trace, <name>.physical.parquet beside another."""
    p = Path(path)
    stem = p.name[:-len(".parquet")] if p.name.endswith(".parquet") else p.name
    return p.with_name(stem + ".physical.parquet")


def physical_schema(num_layers: int, num_slots: int, gpus: int) -> pa.Schema:
    return pa.schema([
        pa.field("step", pa.int64(), nullable=False), pa.field("rank", pa.int32(), nullable=False),
        pa.field("time_s", pa.float64(), nullable=False), pa.field("instance", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("counts", pa.binary(num_layers * num_slots * PHYSICAL_DTYPE.itemsize), nullable=False),
    ], metadata={META_FORMAT: PHYSICAL_FORMAT.encode(), META_VERSION: str(PHYSICAL_FORMAT_VERSION).encode(),
                 META_SHAPE: f"{num_layers},{num_slots},{gpus}".encode()})


def write_physical(trace_path: str | os.PathLike[str], records: Sequence[core.PhysicalRecord]) -> int:
    """Write records (any order; sorted by step, rank) as the sidecar of trace_path, replacing one there; none:
    remove a stale one. Returns the rows written. ValueError for a record core.encode_physical refuses, or
    records of different [L, P] or gpus."""
    side = physical_sidecar(trace_path)
    if not records:
        with contextlib.suppress(FileNotFoundError):
            side.unlink()
        return 0
    first = records[0]
    shape = (first.num_layers, first.num_slots, first.gpus)
    rows = sorted(records, key=lambda r: (r.step, r.rank, r.instance))
    for rec in rows:
        core.encode_physical(rec)
        if (rec.num_layers, rec.num_slots, rec.gpus) != shape:
            raise ValueError(f"physical counts of step {rec.step} are {rec.num_layers}x{rec.num_slots} on {rec.gpus} "
                             f"GPUs, the first record's {shape[0]}x{shape[1]} on {shape[2]}")
    schema = physical_schema(*shape)
    tmp = side.with_name(f".{side.name}.part")
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            for a in range(0, len(rows), GROUP_ROWS):
                writer.write_table(pa.Table.from_batches([_batch(rows[a:a + GROUP_ROWS], schema)]))
        os.replace(tmp, side)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return len(rows)


def _batch(records: Sequence[core.PhysicalRecord], schema: pa.Schema) -> pa.RecordBatch:
    width = schema.field("counts").type.byte_width
    block = np.stack([np.ascontiguousarray(r.counts_LP, dtype=PHYSICAL_DTYPE) for r in records])
    counts = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(records),
                                                  [None, pa.py_buffer(block.reshape(-1).view(np.uint8))])
    return pa.RecordBatch.from_arrays([
        pa.array([r.step for r in records], pa.int64()), pa.array([r.rank for r in records], pa.int32()),
        pa.array([float(r.time_s) for r in records], pa.float64()),
        pa.array([r.instance for r in records], pa.string()), pa.array([r.source for r in records], pa.string()),
        counts], schema=schema)


def read_physical(trace_path: str | os.PathLike[str], run: str, budget_bytes: int) -> PhysicalRead:
    """The physical records (of run `run`) in the sidecar of trace_path; an empty read when there is none.
    ValueError (one line naming the sidecar) for a file that is not one, or declares more than budget_bytes."""
    side = physical_sidecar(trace_path)
    out = PhysicalRead()
    if not side.is_file():
        return out
    try:
        pf = pq.ParquetFile(side, memory_map=True)
        num_layers, num_slots, gpus = _check_schema(pf.schema_arrow)
        width = num_layers * num_slots * PHYSICAL_DTYPE.itemsize
        declared = pf.metadata.num_rows * (width + ROW_FIXED_BYTES)
        for g in range(pf.metadata.num_row_groups):
            info = pf.metadata.row_group(g)
            for j in range(info.num_columns):
                chunk = info.column(j)
                if chunk.path_in_schema in ("instance", "source"):
                    declared += max(0, chunk.total_uncompressed_size)
        check_decoded(f"{side.name}: its rows", declared, budget_bytes)
        for g in range(pf.metadata.num_row_groups):
            _decode(pf.read_row_group(g), run, num_layers, num_slots, gpus, out)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"{side.name}: cannot be read ({type(exc).__name__}: {str(exc)[:160]})") from None
    except ValueError as exc:
        raise ValueError(str(exc) if str(exc).startswith(side.name) else f"{side.name}: {str(exc)[:200]}") from None
    out.records.sort(key=lambda r: (r.step, r.rank, r.instance))
    return out


def _check_schema(schema: pa.Schema) -> tuple[int, int, int]:
    raw = schema.metadata or {}
    if raw.get(META_FORMAT) != PHYSICAL_FORMAT.encode():
        raise ValueError(f"not a physical-counts table (its metadata lacks moe.format = {PHYSICAL_FORMAT})")
    if raw.get(META_VERSION) != str(PHYSICAL_FORMAT_VERSION).encode():
        raise ValueError(f"physical-counts table version {raw.get(META_VERSION, b'')[:20]!r} is not supported")
    try:
        num_layers, num_slots, gpus = (int(x) for x in raw.get(META_SHAPE, b"").decode().split(","))
    except ValueError:
        raise ValueError("the physical-counts table lacks its shape (moe.physical_shape = L,P,gpus)") from None
    if not (1 <= num_layers <= core.MAX_LAYERS and 1 <= num_slots <= core.MAX_SLOTS
            and num_layers * num_slots <= core.MAX_CELLS and 1 <= gpus <= num_slots and num_slots % gpus == 0):
        raise ValueError(f"physical counts of {num_layers}x{num_slots} on {gpus} GPUs are outside the bounds of "
                         f"core/keys.py")
    for f in physical_schema(num_layers, num_slots, gpus):
        index = schema.get_field_index(f.name)
        if index < 0 or not schema.field(index).type.equals(f.type):
            raise ValueError(f"the physical-counts column {f.name!r} is missing or not {f.type}")
    return num_layers, num_slots, gpus


def _decode(table: pa.Table, run: str, num_layers: int, num_slots: int, gpus: int, out: PhysicalRead) -> None:
    cols = {name: table.column(name).to_pylist() for name in ("step", "rank", "time_s", "instance", "source")}
    counts = table.column("counts").combine_chunks()
    for i in range(table.num_rows):
        fields = {"v": core.SCHEMA_VERSION, "run": run, "inst": cols["instance"][i], "rank": cols["rank"][i],
                  "step": cols["step"][i], "t": repr(cols["time_s"][i]), "L": num_layers, "P": num_slots,
                  "gpus": gpus, "source": cols["source"][i], "counts": counts[i].as_py()}
        try:
            out.records.append(core.decode_physical(fields))
        except ValueError as exc:
            out.bad_records += 1
            out.last_error = f"physical row {i}: {exc}"
