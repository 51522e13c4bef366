"""NVML samples (core.GpuSample) as a table of their own: one row per sample.

Columns: time_s float64, rank int32, host string, status string ("ok" / "unavailable"), reason string,
gpus string (the JSON list of per-GPU readings exactly as core.encode_gpu_sample writes it, fields
core.GPU_FIELDS). Rows decode through core.decode_gpu_sample, with its bounds; a bad row is counted, not raised.
"""
from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from moe_monitor import core

GPU_SCHEMA = pa.schema([
    pa.field("time_s", pa.float64(), nullable=False),
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("host", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("gpus", pa.string(), nullable=False),
])
MAX_GPU_ROWS = 1 << 22  # NVML samples read from one trace (two a second for three weeks)


def gpu_table(samples: Sequence[core.GpuSample]) -> pa.Table:
    """The samples as a GPU_SCHEMA table (each checked by core.encode_gpu_sample)."""
    encoded = [core.encode_gpu_sample(s) for s in samples]
    return pa.table({
        "time_s": pa.array([float(s.time_s) for s in samples], pa.float64()),
        "rank": pa.array([int(s.rank) for s in samples], pa.int32()),
        "host": pa.array([s.host for s in samples], pa.string()),
        "status": pa.array([s.status for s in samples], pa.string()),
        "reason": pa.array([s.reason for s in samples], pa.string()),
        "gpus": pa.array([str(e["gpus"]) for e in encoded], pa.string()),
    }, schema=GPU_SCHEMA)


def check_gpu_schema(schema: pa.Schema) -> None:
    for field in GPU_SCHEMA:
        index = schema.get_field_index(field.name)
        if index < 0 or not schema.field(index).type.equals(field.type):
            raise ValueError(f"GPU sample table lacks the column {field.name!r} of type {field.type}")


def gpu_samples_of(table: pa.Table) -> tuple[list[core.GpuSample], int, str]:
    """(samples in row order, bad rows, last reason) of a GPU_SCHEMA table."""
    out: list[core.GpuSample] = []
    bad, last = 0, ""
    for row in table.to_pylist():
        try:
            if row["time_s"] is None:
                raise ValueError("time is null")
            out.append(core.decode_gpu_sample({"v": core.SCHEMA_VERSION, "rank": row["rank"], "host": row["host"],
                                               "t": repr(float(row["time_s"])), "status": row["status"],
                                               "reason": row["reason"], "gpus": row["gpus"]}))
        except ValueError as exc:
            bad, last = bad + 1, f"GPU sample: {exc}"
    return out, bad, last
